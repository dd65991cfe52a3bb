"""Byte counts for people: the one size formatter, with one convention everywhere (IEC binary
units: KiB, MiB, GiB, TiB), the units of ``--weight-threshold 10MiB``, ``imgbuild inspect``,
``diff``, the build summary, budget errors and the transfer bars. So one image reads the same
figure wherever imgbuild prints it. (Exact byte counts stay in every JSON document.)"""

from __future__ import annotations

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def human_size(n: float | None) -> str:
    """``5_950_000_000`` -> ``"5.5 GiB"``; ``None`` (unknown) -> ``"-"``."""
    if n is None:
        return "-"
    value = float(n)
    for unit in _UNITS:
        if abs(value) < 1024 or unit == _UNITS[-1]:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
