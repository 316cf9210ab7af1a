"""The stage as a type, and the schema of its file: StageSpec's fields, each with the keys of the file it is read from.

The loader (grading/spec/stages.py) accepts exactly STAGE_KEYS, requires those marked required and checks each
one's type; docs/authoring.md's table of fields is `schema_text()` (tests/unit/test_spec_schema.py fails when the
guide disagrees). What a stage checks is a check type's (grading/spec/checks.py), read from compare and its table.
"""

from dataclasses import dataclass, field
from pathlib import Path

from theinference.grading.spec.checks import CHECK_KEYS, Check, checks_tokens, tolerance
from theinference.grading.spec.keys import Key, keys, markdown_table, stage_keys

VISIBILITIES = ("visible", "after_due_date", "after_published", "hidden")  # Gradescope's, for a test


@dataclass(frozen=True)
class CaseSpec:
    name: str
    inputs: dict  # input name -> list of token ids or int, in the oracle's argument order
    texts: dict = field(default_factory=dict)  # input name -> the text it was given as, if any


FORMAT_KEY = Key("format_version", int, "int", "must be `1`", required=True)


@dataclass(frozen=True)
class StageSpec:
    id: str = field(
        metadata=keys(Key("id", str, "str", "lowercase words joined by `-`; unique across every stage directory", True))
    )
    title: str = field(metadata=keys(Key("title", str, "str", "one line, shown in listings and report headers", True)))
    order: int = field(
        metadata=keys(
            Key("order", int, "int", "position in the course, lower first (built-in stages use 10, 20, … 70)", True)
        )
    )
    lesson: Path = field(
        metadata=keys(Key("lesson", str, "str", "the lesson's Markdown, relative to the stage file", True))
    )
    adapter: str = field(
        metadata=keys(Key("adapter", str, "str", "the function in `tests/adapters.py` the stage calls", True))
    )
    aliases: tuple[str, ...] = field(
        metadata=keys(
            Key(
                "aliases",
                list,
                "list of str",
                "other accepted names for it (default: the camelCase name, `runMlpSublayer`)",
            )
        )
    )
    oracle: str = field(
        metadata=keys(
            Key("oracle", str, "str", 'a built-in oracle name, or `"file.py:function"` beside the stage file', True)
        )
    )
    inputs: tuple[str, ...] = field(
        metadata=keys(
            Key(
                "inputs",
                list,
                "list of str",
                "the input names each case gives, in the order the adapter receives them; required with an "
                "instructor's oracle, implied by a built-in one",
            )
        )
    )
    # what the stage checks: rows within atol/rtol, greedy tokens, or the cache proof
    check: Check = field(metadata=keys(*CHECK_KEYS))
    timeout: float = field(
        metadata=keys(
            Key("timeout", (int, float), "number > 0", "seconds each case may take in the student's process", True)
        )
    )
    points: float = field(metadata=keys(Key("points", (int, float), "number ≥ 0", "what the stage is worth", True)))
    credit: str = field(metadata=keys(Key("credit", str, "str", '`"all-or-nothing"` (default) or `"per-case"`')))
    hints: dict = field(
        metadata=keys(
            Key(
                "[hints]",
                dict,
                "shape = text",
                "shown when a failing case has that shape and no known bug matches (shapes below); only shapes the "
                'stage\'s `compare` can fail with (`"tokens"`: `token-mismatch`; `"scaling"`: `token-mismatch`, '
                '`no-cache`, `too-slow`, `machine-busy`, `cost-tampered`; `"rows"`: the others), any other is refused',
            )
        )
    )
    cases: tuple[CaseSpec, ...] = field(
        metadata=keys(
            Key(
                "[[case]]",
                list,
                "`name` + inputs",
                "one case: a unique name and a value for every name in `inputs`",
                True,
            )
        )
    )
    source: Path
    bugs: tuple[str, ...] = field(
        default=(),  # bug oracles to fingerprint failing outputs against
        metadata=keys(
            Key(
                "bugs",
                list,
                "list of str",
                "bug oracles a failing output is fingerprinted against: built-in names "
                "(`theinference/grading/oracle/bugs.py`; each only for the built-in oracles it can be computed for, "
                'and a refusal lists those that can; a `"tokens"` stage\'s are matched as a right greedy loop over '
                'GPT-2 with that bug) or `"file.py:function"` (the only kind an oracle of your own can have)',
            )
        ),
    )
    bug_hints: dict = field(
        default_factory=dict,  # bug name -> hint text
        metadata=keys(
            Key("[bug_hints]", dict, "bug = text", "shown when the output matches that bug (each key one of `bugs`)")
        ),
    )
    visibility: str = field(
        default="visible",  # when Gradescope shows the result to the student (VISIBILITIES)
        metadata=keys(
            Key(
                "visibility",
                str,
                "str",
                'when Gradescope shows the stage\'s result to the student: `"visible"` (default), '
                '`"after_due_date"`, `"after_published"` or `"hidden"` (cases students never see before the '
                "deadline); the student's summary line counts only visible stages. Other formats show every stage",
            )
        ),
    )

    @property
    def adapter_names(self) -> tuple[str, ...]:
        return (self.adapter, *self.aliases)

    @property
    def checks_tokens(self) -> bool:
        return checks_tokens(self.check)

    @property
    def tolerance(self) -> dict[str, float]:
        return tolerance(self.check)


STAGE_KEYS = (FORMAT_KEY, *stage_keys(StageSpec))  # every top-level key of a stage file, in the guide's order
REQUIRED_KEYS = {key.toml: key.kind for key in STAGE_KEYS if key.required}
OPTIONAL_KEYS = {key.toml: key.kind for key in STAGE_KEYS if not key.required}


def schema_text() -> str:
    """The stage file's top-level keys as the authoring guide's table shows them."""
    return markdown_table(STAGE_KEYS)
