"""Greedy-loop fingerprints: the student's tokens matched exactly against a generation loop with a known mistake.

Logits right, loop wrong: the token fed back (the prompt's last one, the first generated one, the one
before), the position it is fed at (the prompt's length left out, a counter off by a constant or
stuck), the choice (the runner-up at one step; the first token from prefill's first row, not its last),
or the length (one short, a stop at <|endoftext|>).
Each candidate is checked with one teacher-forced pass: what the loop feeds is determined by the
student's own tokens, so one causal forward gives every step's logits, and the student's token must
be the candidate's choice at every step (within the stage's near-tie tolerance) in every case.
"""

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import numpy as np

from theinference.model import variant as model_variant
from theinference.grading.judge import positions
from theinference.grading.oracle.bugs import BUILTIN_BUGS
from theinference.model.defective import Defects, as_variant
from theinference.model.variant import Variant, counted
from theinference.model.weights import Model


ENDOFTEXT_ID = 50256  # GPT-2's <|endoftext|>


@dataclass(frozen=True)
class LoopBug:
    name: str
    finding: str  # completes "your tokens are exactly those of a greedy loop that ..."
    fed: Callable[[list[int], list[int]], list[int]]  # (prompt, tokens) -> the token fed at each decode step
    positions: Callable[[int, int], list[int]] | None = None  # (len(prompt), steps) -> each decode step's position
    choice: str = "argmax"  # argmax | runner-up (every step) | runner-up-once (at one step: fitted)
    length: str = "exact"  # exact | one-short | eot
    first_row: str = "last"  # the prefill row the first token is chosen from: last | first (the prompt's position 0)
    defects: Defects | None = None  # the logits are GPT-2's with this named bug (a stage's listed bug), not GPT-2's


def _own(prompt: list[int], tokens: list[int]) -> list[int]:
    return tokens[:-1]


def _position_loops(n_layer: int) -> Iterator[LoopBug]:
    for base, slope, k in positions.counters():
        expr, why = positions.expression(base, slope, k, n_layer), positions.WHY[base, slope][1]

        def fed_at(n_prompt: int, steps: int, base=base, slope=slope, k=k) -> list[int]:
            return counted(base, slope, k, n_prompt, steps, n_layer)

        yield LoopBug(
            "greedy-position",
            f"feeds generated token i at position {expr} instead of len(prompt) + i ({why})",
            _own,
            fed_at,
        )


def loop_bugs(model: Model) -> list[LoopBug]:
    """Every modelled greedy-loop mistake, the position family's candidates included."""
    return [
        LoopBug(
            "greedy-fed-token",
            "feeds back the prompt's last token at every step instead of the token it just chose",
            lambda p, t: [p[-1]] * (len(t) - 1),
        ),
        LoopBug(
            "greedy-fed-token",
            "feeds back the first generated token at every step instead of the token it just chose",
            lambda p, t: [t[0]] * (len(t) - 1),
        ),
        LoopBug(
            "greedy-fed-token",
            "feeds back the token before the one it just chose (one step behind)",
            lambda p, t: ([p[-1]] + t)[: len(t) - 1],
        ),
        *_position_loops(model.config.n_layer),
        LoopBug(
            "greedy-runner-up",
            "picks the runner-up token instead of the argmax at one step",
            _own,
            choice="runner-up-once",
        ),
        LoopBug(
            "greedy-runner-up",
            "picks the runner-up token instead of the argmax at every step",
            _own,
            choice="runner-up",
        ),
        LoopBug(
            "greedy-one-short",
            "returns one token fewer than n_new (the first token or the last step lost)",
            _own,
            length="one-short",
        ),
        LoopBug(
            "greedy-prefill-first-row",
            "chooses its first token from prefill's first row (the prompt's position 0) instead of its last",
            _own,
            first_row="first",
        ),
        LoopBug("greedy-stops-at-eot", "stops at <|endoftext|> instead of generating n_new tokens", _own, length="eot"),
    ]


def listed_loop_bugs(names) -> list[LoopBug]:
    """A greedy stage's listed built-in bugs, each a loop that is right but runs GPT-2 with that bug (its cache
    filled by prefill, then one decode step per token)."""
    listed = [BUILTIN_BUGS[name] for name in names if name in BUILTIN_BUGS]
    return [
        LoopBug(bug.name, f"runs GPT-2 with {bug.finding}", _own, defects=bug.defects) for bug in listed if bug.defects
    ]


class _PathLogits:
    """The logits each choice is made from (after the prompt, then after each fed token), one row at a time:
    one causal pass for the hidden states, the LM head only on the rows read (a wrong loop fails early)."""

    def __init__(
        self,
        model: Model,
        prompt: list[int],
        fed: list[int],
        positions: list[int] | None,
        first_row: str = "last",
        defects: Defects | None = None,
    ):
        ids = list(prompt) + list(fed)
        pos = None if positions is None else tuple(range(len(prompt))) + tuple(positions)
        variant = Variant(prefill=len(prompt), positions=pos)
        if defects is not None:
            variant = as_variant(replace(defects, prefill=len(prompt)), len(ids))
        hidden = model_variant.hidden_states(model.params, ids, model.config.n_head, variant)
        first = 0 if first_row == "first" else len(prompt) - 1
        self.hidden = np.concatenate([hidden[first : first + 1], hidden[len(prompt) :]])
        self.wte = model.params["wte"]["weight"]

    def __getitem__(self, step: int) -> np.ndarray:
        return self.hidden[step] @ self.wte.T


def _chosen(logits: np.ndarray, token: int, rank: int, tie_rtol: float) -> bool:
    """Is token the rank-th best (0: argmax, 1: runner-up), allowing a near-tie?"""
    order = np.argsort(logits)[::-1]
    target = int(order[rank])
    allowed = tie_rtol * float(np.abs(logits).max())
    return token == target or abs(float(logits[target]) - float(logits[token])) <= allowed


def reproduces(
    bug: LoopBug, model: Model, prompt: list[int], n_new: int, tokens: list[int], tie_rtol: float
) -> str | None:
    """Does a loop with this mistake return exactly these tokens for this prompt? One teacher-forced pass.

    None if not; else what was fitted ("" when nothing: the runner-up's step, when there is one).
    """
    if not tokens:
        return None
    if bug.length == "eot":  # a loop that never met <|endoftext|> returns n_new tokens
        if len(tokens) > n_new or ENDOFTEXT_ID in tokens[:-1]:
            return None
    elif len(tokens) != (n_new - 1 if bug.length == "one-short" else n_new):
        return None
    # chose <|endoftext|> and stopped before appending it
    stopped_before = bug.length == "eot" and len(tokens) < n_new and tokens[-1] != ENDOFTEXT_ID
    steps = len(tokens) + (1 if stopped_before else 0)
    fed = bug.fed(prompt, tokens + [ENDOFTEXT_ID] if stopped_before else tokens)
    positions = bug.positions(len(prompt), steps - 1) if bug.positions else None
    logits = _PathLogits(model, prompt, fed, positions, bug.first_row, bug.defects)
    if stopped_before and not _chosen(logits[len(tokens)], ENDOFTEXT_ID, 0, tie_rtol):
        return None
    ranks = [1 if bug.choice == "runner-up" else 0] * len(tokens)
    detail = ""
    if bug.choice == "runner-up-once":
        rows = [logits[i] for i in range(len(tokens))]
        off = [i for i, t in enumerate(tokens) if not _chosen(rows[i], t, 0, tie_rtol)]
        if len(off) != 1 or not _chosen(rows[off[0]], tokens[off[0]], 1, tie_rtol):
            return None
        return f"step {off[0] + 1}"
    return detail if all(_chosen(logits[i], t, ranks[i], tie_rtol) for i, t in enumerate(tokens)) else None
