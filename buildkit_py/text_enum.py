"""``TextEnum``: the base of every enumeration whose values are words in a file or on the
command line (cuda.flavor, cuda.source, build.installer, --engine, a check's verdict...).

A member *is* its word: it compares equal to the string, hashes like it (so it finds the same
dict entries), and prints, formats, reprs and dumps to JSON as it (``f"{Flavor.RUNTIME}"`` is
``runtime`` on every Python; a plain ``(str, Enum)`` prints ``Flavor.RUNTIME`` there from 3.11
on). Python 3.11's ``enum.StrEnum`` does the first half, and the package supports 3.10. YAML is the
exception: ``yaml.safe_dump`` refuses any str subclass, so a document is converted to plain
values at its boundary (``str(member)`` or ``member.value``)."""

from __future__ import annotations

import enum


class TextEnum(str, enum.Enum):
    def __str__(self) -> str:
        return str.__str__(self)

    def __repr__(self) -> str:  # as the word was: dataclass reprs and {value!r} messages keep their text
        return str.__repr__(self)

    def __format__(self, format_spec: str) -> str:
        return str.__format__(self, format_spec)

    def __hash__(self) -> int:
        return str.__hash__(self)

    @classmethod
    def words(cls) -> tuple[str, ...]:
        """The members' words, in their order: for ``choices=``, a schema's enum, a hint."""
        return tuple(m.value for m in cls)
