"""What a stage checks, as a type: one of three kinds, the value a stage file's `compare` names.

    RowsCheck     compare = "rows": every row of the adapter's array allclose to the oracle's
                  (|got - oracle| <= atol + rtol * |oracle|), from [tolerance]
    TokensCheck   compare = "tokens": greedy token ids, each the oracle's argmax on the student's own
                  path or within the near-tie tolerance of it, from [tie]
    ScalingCheck  compare = "scaling": the cache proof; its tokens are checked like TokensCheck's, and its
                  calls' cost is judged with its [scaling] parameters

Every module asks the kind of the type (a `match`, or `isinstance`), never of a string; `assert_never`
in each `match` makes mypy name a kind that a new one leaves unhandled.
"""

from dataclasses import dataclass
from typing import ClassVar, assert_never

from theinference.grading.spec.keys import Key


# The stage file's keys a Check is read from (StageSpec.check's): its kind, then the table each kind reads.
COMPARE_KEY = Key(
    "compare",
    str,
    "str",
    '`"rows"` (per-row `allclose` of arrays), `"tokens"` (greedy token ids) or `"scaling"` (greedy token ids plus '
    'cost per token; oracle `"greedy"` only)',
    required=True,
)
TOLERANCE_KEY = Key(
    "[tolerance]",
    dict,
    "`atol`, `rtol`",
    "finite numbers, `atol` > 0 (0 would fail the solution on rounding), `rtol` ≥ 0 (0 beside a positive `atol` is "
    'a plain absolute tolerance); required for `"rows"`, refused for `"tokens"`/`"scaling"`',
)
TIE_KEY = Key(
    "[tie]",
    dict,
    "`rtol`",
    'a number > 0; `"tokens"`/`"scaling"` only, and required there: a generated token that is not the oracle\'s '
    "argmax is a near-tie when its logit is within `rtol × max|logit|` of the argmax's",
)
SCALING_KEY = Key(
    "[scaling]",
    dict,
    "`lengths`, `repeats`, `max_ratio`",
    '`compare = "scaling"` only (see `theinference/grading/spec/stages.py`)',
)


@dataclass(frozen=True)
class ScalingSpec:
    lengths: tuple[int, ...]  # n_new values timed, ascending
    repeats: int
    max_ratio: float  # (a) per-token cost at the longest length over the shortest's, at most
    prompt_tokens: int = 4  # the length of each timed call's fresh random prompt
    max_fraction: float = 0.35  # (b) the longest call's CPU over the oracle's full recompute of it, at most
    weights: str = "proof"  # "proof": the synthetic proof preset; "graded": the graded weights where they separate


@dataclass(frozen=True)
class RowsCheck:
    atol: float
    rtol: float
    kind: ClassVar[str] = "rows"
    table: ClassVar[Key] = TOLERANCE_KEY


@dataclass(frozen=True)
class TokensCheck:
    tie_rtol: float  # relative to max|logit| at the step
    kind: ClassVar[str] = "tokens"
    table: ClassVar[Key] = TIE_KEY


@dataclass(frozen=True)
class ScalingCheck:
    tie_rtol: float
    params: ScalingSpec
    kind: ClassVar[str] = "scaling"
    table: ClassVar[Key] = TIE_KEY
    params_table: ClassVar[Key] = SCALING_KEY


Check = RowsCheck | TokensCheck | ScalingCheck
COMPARES = (RowsCheck.kind, TokensCheck.kind, ScalingCheck.kind)  # the values a stage file's `compare` may take
# Every key a Check is read from: its kind, then each kind's tables, once.
CHECK_KEYS = tuple(dict.fromkeys((COMPARE_KEY, RowsCheck.table, TokensCheck.table, ScalingCheck.params_table)))


def tolerance(check: Check) -> dict[str, float]:
    """The tolerance as the stage file gives it: {"atol", "rtol"} for rows, {"tie_rtol"} for greedy tokens."""
    match check:
        case RowsCheck(atol=atol, rtol=rtol):
            return {"atol": atol, "rtol": rtol}
        case TokensCheck(tie_rtol=tie) | ScalingCheck(tie_rtol=tie):
            return {"tie_rtol": tie}
        case _:
            assert_never(check)


def checks_tokens(check: Check) -> bool:
    """Whether the output is greedy token ids, verified on the student's own path with the near-tie tolerance."""
    match check:
        case RowsCheck():
            return False
        case TokensCheck() | ScalingCheck():
            return True
        case _:
            assert_never(check)
