"""Tables as data: what `inspect` and `diff` print, built by the library as plain strings and
drawn by the CLI, as a rich table on a terminal and as aligned text columns in a pipe or CI log
(no box characters, no width to fit), as `build --all` prints its summary.
Standard library only: rich is imported by the CLI, and only for a terminal."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class TextTable:
    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    right: frozenset[str] = frozenset()  # the columns aligned right (sizes, counts)
    styles: Mapping[str, str] = field(default_factory=dict)  # cell text -> rich style, on a terminal

    def lines(self) -> list[str]:
        """The title, then the header and the rows in columns two spaces apart; the last
        column is not padded, so no line ends in spaces."""
        rows = [tuple(c.upper() for c in self.columns), *self.rows]
        widths = [max(len(r[i]) for r in rows) for i in range(len(self.columns))]

        def line(cells: tuple[str, ...]) -> str:
            return "  ".join(c.rjust(w) if name in self.right else c.ljust(w)
                             for c, w, name in zip(cells, widths, self.columns, strict=True)).rstrip()

        return [self.title, *(line(r) for r in rows)]


# What a report prints, in order: a line of text, or a table.
Block = str | TextTable


def plain_lines(blocks: list[Block]) -> list[str]:
    """The blocks as plain text, an empty line before and after each table."""
    out: list[str] = []
    after_table = False
    for block in blocks:
        if isinstance(block, TextTable):
            out += ["", *block.lines()]
        else:
            out += [""] * after_table + [block]
        after_table = isinstance(block, TextTable)
    return out
