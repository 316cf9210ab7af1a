"""Greedy verification: the student's tokens checked in one teacher-forced forward of the oracle.

Each step asks: is the student's token the oracle's argmax after prompt + the student's own
earlier tokens, or within the stage's tie tolerance of it? One causal forward over
prompt + tokens[:-1] gives every step's logits at once; the oracle's own continuation (for the
side-by-side table) is computed only after a mismatch. Any stage whose adapter generates greedy
tokens can call `verify_tokens`.
"""

import dataclasses

import numpy as np

from theinference.model import gpt2 as oracle
from theinference.model import tokenizer
from theinference.grading.judge.compare import token_summary, walk_summary
from theinference.grading.oracle.store import oracle_version
from theinference.grading.judge.diagnose import diagnose_tokens
from theinference.grading.judge.results import CaseResult, Status, TokenStep
from theinference.model.weights import Model


def token_problem(got: np.ndarray, n_new: int, n_vocab: int) -> str | None:
    """Why `got` is not n_new token ids of this vocabulary, or None."""
    if got.shape != (n_new,):
        return f"expected {n_new} token ids (shape [{n_new}]), got shape {list(got.shape)}"
    if got.dtype.kind == "f" and not np.all(np.isfinite(got) & (got == np.round(got))):
        return "expected integer token ids, got non-integer values"
    if np.any((got < 0) | (got >= n_vocab)):
        return f"token ids must be in [0, {n_vocab}); got {got[(got < 0) | (got >= n_vocab)][0]}"
    return None


def check_steps(
    model: Model, prompt: list[int], tokens: list[int], tie_rtol: float, cache=None, label: str = ""
) -> list[TokenStep]:
    """Walk the student's tokens over the oracle's logits on their own path, up to the first mismatch.

    With an OracleCache, what the walk reads of those logits is cached like an oracle output.
    """

    def summary() -> np.ndarray:
        return token_summary(tokens, oracle.per_step_logits(model.params, prompt, tokens, model.config.n_head))

    if cache is not None:
        key = ("token-path", str(model.path), model.stamp, tuple(prompt), tuple(tokens))
        found = cache.memo(
            key, summary, model=model, durable=("token-path", oracle_version(()), prompt, tokens), label=label
        )
    else:
        found = summary()
    return walk_summary(tokens, found, tie_rtol, len(prompt) - 1)


def continuation(model: Model, ids: list[int], n_new: int, cache=None, label: str = "") -> list[int]:
    """The oracle's greedy continuation of ids (the side-by-side table's tail after a mismatch). With an
    OracleCache it is computed once per path like an oracle output: every submission that goes wrong at the same
    step of the same path (most of a class, most of a gallery: at token 1) shares it."""

    def compute() -> np.ndarray:
        return np.asarray(oracle.greedy(model.params, ids, n_new, model.config.n_head), dtype=np.int64)

    if cache is None:
        return [int(t) for t in compute()]
    key = ("greedy-continuation", str(model.path), model.stamp, tuple(ids), n_new)
    found = cache.memo(
        key, compute, model=model, durable=("greedy-continuation", oracle_version(()), ids, n_new), label=label
    )
    return [int(t) for t in found]


def verify_tokens(
    ran: CaseResult, got: np.ndarray, model: Model, tie_rtol: float, hints: dict, cache=None, label: str = ""
) -> CaseResult:
    """The case's verdict from the ids the student generated: its status, steps, tokens, message and diagnosis
    (ran: the case as its call came back; it is unchanged)."""
    prompt, n_new = ran.inputs["prompt"], ran.inputs["n_new"]
    problem = token_problem(got, n_new, model.config.n_vocab)
    if problem:
        return dataclasses.replace(ran, status=Status.FAIL, detail="wrong-shape", message=problem)
    tokens = [int(t) for t in got]
    steps = check_steps(model, prompt, tokens, tie_rtol, cache, label)
    if steps[-1].verdict != "mismatch":
        return dataclasses.replace(
            ran, status=Status.PASS, steps=steps, got_tokens=tokens, expected_tokens=list(tokens)
        )
    k = len(steps)
    expected = tokens[: k - 1] + [steps[-1].expected]
    expected += continuation(model, prompt + expected, n_new - k, cache, label)
    return dataclasses.replace(
        ran,
        status=Status.FAIL,
        message=f"token {k} of {n_new} differs from the oracle's greedy choice",
        steps=steps,
        got_tokens=tokens,
        expected_tokens=expected,
        diagnosis=diagnose_tokens(steps, hints, lambda t: f"{t} {tokenizer.token_text(t)!r}"),
    )
