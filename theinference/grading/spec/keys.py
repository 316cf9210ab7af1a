"""A stage file's top-level keys as dataclass field metadata: each field of StageSpec (grading/spec/schema.py) or of
a check type (grading/spec/checks.py) carries the keys it is read from, what the loader accepts and what
docs/authoring.md says of them, so the loader's keys and the guide's table of fields are written once.
"""

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Key:
    """One top-level key of a stage file."""

    name: str  # as the file spells it: "id", "[tolerance]" (a table), "[[case]]" (an array of tables)
    kind: type | tuple[type, ...]  # the TOML value the loader accepts
    type_text: str  # the guide's "type" column
    doc: str  # the guide's "meaning" column (Markdown)
    required: bool = False

    @property
    def toml(self) -> str:  # the key in the parsed TOML
        return self.name.strip("[]")


def keys(*described: Key) -> dict[str, tuple[Key, ...]]:
    """A dataclass field's metadata: the stage file's keys it is read from."""
    return {"keys": described}


def stage_keys(*owners: Any) -> tuple[Key, ...]:
    """Every key the dataclasses' fields are read from, in field order (a field of no key is not the file's)."""
    return tuple(key for owner in owners for f in dataclasses.fields(owner) for key in f.metadata.get("keys", ()))


def markdown_table(described: tuple[Key, ...]) -> str:
    """The guide's table of fields."""
    rows = [f"| `{key.name}` | {key.type_text} | {key.doc} |" for key in described]
    return "\n".join(["| field | type | meaning |", "|---|---|---|", *rows])
