"""How much a finding of ``lint`` or ``inspect`` matters: one scale for both, in the order their
reports list findings (errors first)."""

from __future__ import annotations

from buildkit_py.text_enum import TextEnum


class Severity(TextEnum):
    ERROR = "error"  # lint exits 1
    WARNING = "warning"
    INFO = "info"

    @property
    def rank(self) -> int:
        """Its place in a report: errors first."""
        return list(Severity).index(self)
