"""Bug oracles: GPT-2 computed with one named, classic student bug, for fingerprinting failing outputs.

Each built-in bug is a `Defects` of theinference.model.defective (or, for a bug no defect expresses, a
small function over the oracle's pure functions) plus the words a finding quotes. A stage file
lists the bugs that can show in that stage (`bugs = [...]`); an instructor adds a bug oracle as
they add an oracle: `bugs = ["oracles.py:my_bug"]`, where `def my_bug(model, **inputs) -> array`
returns what the stage's adapter would return with that bug.

Incremental bugs are modelled on the stage's own schedule: the rows a stage computes in one
block (the prompt's prefill, or the cached earlier positions) form `Defects.prefill`, and every
later row is one single-query decode step attending to the cache.
"""

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from theinference.model import defective
from theinference.model import gpt2 as oracle
from theinference.model.defective import Defects
from theinference.grading.oracle.registry import SCHEDULES, OracleSpec, compute_expected, load_file_function
from theinference.model.weights import Model

LAYER0 = ("layer0-attn-sublayer", "layer0-attn-last")
MODEL = ("decode-step-logits", "per-step-logits")
ALL = LAYER0 + MODEL
WHOLE = ALL + ("logits",)  # bugs of the model itself, visible in a full forward pass too


@dataclass(frozen=True)
class Bug:
    name: str
    finding: str  # completes "your output equals GPT-2 with ..."
    oracles: tuple[str, ...]  # the built-in oracles it can be computed for
    defects: Defects | None = None
    compute: Callable | None = None  # (model, oracle name, inputs, history) -> array, when no Defects express it
    # A built-in compute also takes (row, columns): only that row of a multi-row output, of logits only those columns.
    screens: bool = False
    stamp: tuple = ()  # an instructor's bug: its file's version
    uses_history: bool = False  # its output depends on the stage's earlier cases (run before, in the same process)


def _recorded_after(
    model: Model, oracle_name: str, inputs: dict, history: list, row: int | None = None, columns=None
) -> np.ndarray:
    # Row k holds the logits after consuming cont[k]: the recompute's rows shifted by one.
    prompt, cont = list(inputs["prompt"]), list(inputs["cont"])
    own = _picked(slice(len(prompt), len(prompt) + len(cont)), row)
    return _logits_at(
        model.params, oracle.hidden_states(model.params, _upto(prompt + cont, own), model.config.n_head), own, columns
    )


def _picked(own, row: int | None):  # the rows a call returns, or only the row-th of them
    return own.start + row if isinstance(own, slice) and row is not None else own


def _upto(ids: list, own) -> list:  # attention is causal: nothing after the last row returned is needed
    return ids[: (own.stop if isinstance(own, slice) else own + 1)]


def _cache_kept(
    model: Model, oracle_name: str, inputs: dict, history: list, row: int | None = None, columns=None
) -> np.ndarray:
    # The earlier cases of the stage ran first in the same process and left their rows in the cache.
    consumed, rows = SCHEDULES[oracle_name].consumed, SCHEDULES[oracle_name].rows
    calls = [consumed(h) for h in history] + [consumed(inputs)]
    ids, start = [t for call in calls for t in call], sum(map(len, calls[:-1]))
    own = rows(inputs)
    own = _picked(slice(start + own.start, start + own.stop) if isinstance(own, slice) else start + own, row)
    ids = _upto(ids, own)
    defects = Defects(segments=(*map(len, calls[:-1]), len(ids) - start))
    if SCHEDULES[oracle_name].layer0:
        return defective.layer0_attn_sublayer(model.params, ids, model.config.n_head, defects)[own]
    return _logits_at(
        model.params, defective.hidden_states(model.params, ids, model.config.n_head, defects), own, columns
    )


def _logits_at(params, h, own, columns=None):  # the LM head on the rows a call returns (one row: a vector)
    wte = params["wte"]["weight"] if columns is None else params["wte"]["weight"][columns]
    return h[own] @ wte.T if isinstance(own, slice) else (h[own : own + 1] @ wte.T)[0]


def _prefill_first_row(
    model: Model, oracle_name: str, inputs: dict, history: list, row: int | None = None, columns=None
) -> np.ndarray:
    # Row 0 is prefill's logits at the prompt's first position, not its last (a forward that returns every row, read
    # at [0]); the decode steps' rows are GPT-2's.
    prompt, cont = list(inputs["prompt"]), list(inputs["cont"])
    ids = prompt + cont[:-1]
    at = np.array([0, *range(len(prompt), len(prompt) + len(cont) - 1)])
    picked = at if row is None else at[row : row + 1]
    h = oracle.hidden_states(model.params, ids[: int(picked.max()) + 1], model.config.n_head)
    wte = model.params["wte"]["weight"] if columns is None else model.params["wte"]["weight"][columns]
    out = h[picked] @ wte.T
    return out if row is None else out[0]


def _attend_shared(x, c_attn, c_proj, n_head, shared):  # [n_new, n_embd] -> same; shared = [keys, values]
    n_q, n_embd = x.shape
    qkv = oracle.linear(x, **c_attn).reshape(n_q, 3, n_head, n_embd // n_head).transpose(1, 2, 0, 3)
    for i in (0, 1):  # every layer appends to the same keys and values
        shared[i] = qkv[i + 1] if shared[i] is None else np.concatenate([shared[i], qkv[i + 1]], axis=1)
    keys, values = shared
    n_k = keys.shape[1]
    scores = qkv[0] @ keys.transpose(0, 2, 1) * np.float32(1.0 / np.sqrt(n_embd // n_head))
    scores[:, np.arange(n_k)[None, :] > np.arange(n_q)[:, None] + n_k - n_q] = -np.inf
    heads = oracle.softmax(scores) @ values
    return oracle.linear(heads.transpose(1, 0, 2).reshape(n_q, n_embd), **c_proj)


def _shared_cache(
    model: Model, oracle_name: str, inputs: dict, history: list, row: int | None = None, columns=None
) -> np.ndarray:
    # Stateful, so computed step by step: the prompt as one block, then one row per decode step.
    consumed, rows = SCHEDULES[oracle_name].consumed, SCHEDULES[oracle_name].rows
    own = _picked(rows(inputs), row)
    ids, prefill, params = np.asarray(_upto(consumed(inputs), own)), len(inputs["prompt"]), model.params
    shared, hidden = [None, None], []
    for block in [np.arange(prefill)] + [np.arange(i, i + 1) for i in range(prefill, len(ids))]:
        x = params["wte"]["weight"][ids[block]] + params["wpe"]["weight"][block]
        for layer in params["h"]:
            x = x + _attend_shared(
                oracle.layer_norm(x, **layer["ln_1"]), **layer["attn"], n_head=model.config.n_head, shared=shared
            )
            x = x + oracle.ffn(oracle.layer_norm(x, **layer["ln_2"]), **layer["mlp"])
        hidden.append(x)
    return _logits_at(params, oracle.layer_norm(np.concatenate(hidden), **params["ln_f"]), own, columns)


_ROW_BUGS = (
    Bug(
        "missing-scale",
        "no 1/sqrt(head_dim) scale on the attention scores",
        WHOLE,
        Defects(scale_block=False, scale_decode=False),
    ),
    Bug(
        "missing-scale-decode",
        "no 1/sqrt(head_dim) scale in the single-query decode steps (prefill has it)",
        MODEL,
        Defects(scale_decode=False),
    ),
    Bug(
        "wpe-off-by-one",
        "wpe[pos + 1] for every token computed incrementally (the position base is off by one)",
        ALL,
        Defects(decode_position="plus-one"),
    ),
    Bug(
        "position-zero", "every incremental token embedded at position 0 (wpe[0])", ALL, Defects(decode_position="zero")
    ),
    Bug(
        "position-stuck",
        "every decode step embedded at position len(prompt): the counter does not advance",
        MODEL,
        Defects(decode_position="stuck"),
    ),
    Bug(
        "position-reset",
        "decode step k embedded at position k: the counter restarts at 0 and forgets the prompt",
        MODEL,
        Defects(decode_position="reset"),
    ),
    Bug(
        "mask-on-decode",
        "a causal mask re-applied to each single new query, so it sees only key 0",
        ALL,
        Defects(decode_keys="first"),
    ),
    Bug(
        "no-self-attention",
        "each new token not attending to itself (its k/v reach the cache after attention)",
        ALL,
        Defects(decode_keys="earlier"),
    ),
    Bug(
        "empty-cache",
        "each new token attending only to itself: the cache it reads holds nothing earlier",
        ALL,
        Defects(decode_keys="self"),
    ),
    Bug(
        "prefill-cache-lost",
        "decoding from an empty cache after prefill: decode steps see only the decoded tokens",
        MODEL,
        Defects(decode_keys="decoded"),
    ),
    Bug(
        "mask-off-by-one",
        "a causal mask off by one: no position attends to itself",
        WHOLE,
        Defects(mask_sees_self=False),
    ),
    Bug("c-proj-transposed", "the attention's c_proj weight used transposed", WHOLE, Defects(c_proj_transposed=True)),
    Bug(
        "c-attn-transposed", "each square q/k/v block of c_attn used transposed", WHOLE, Defects(c_attn_transposed=True)
    ),
    Bug(
        "qkv-order-kqv", "q and k swapped when splitting c_attn's output (k, q, v)", WHOLE, Defects(qkv_order=(1, 0, 2))
    ),
    Bug(
        "qkv-order-qvk", "k and v swapped when splitting c_attn's output (q, v, k)", WHOLE, Defects(qkv_order=(0, 2, 1))
    ),
    Bug("ln-eps-missing", "layer norm without its epsilon (eps 0 instead of 1e-5)", WHOLE, Defects(ln_eps=0.0)),
    Bug(
        "gelu-erf",
        "the exact (erf) GELU instead of GPT-2's tanh approximation",
        MODEL + ("logits",),
        Defects(gelu="erf"),
    ),
    Bug("no-ln-f", "no final layer norm (ln_f) before the tied LM head", MODEL + ("logits",), Defects(ln_f=False)),
    Bug(
        "no-attn-residual",
        "no residual around attention: x = attn(ln_1(x)) instead of x + attn(ln_1(x))",
        WHOLE,
        Defects(attn_residual=False),
    ),
    Bug(
        "no-mlp-residual",
        "no residual around the MLP: x = mlp(ln_2(x)) instead of x + mlp(ln_2(x))",
        MODEL + ("logits",),
        Defects(mlp_residual=False),
    ),
    Bug(
        "softmax-over-queries",
        "the attention softmax taken over the query axis (axis -2) instead of the key axis (axis -1)",
        WHOLE,
        Defects(softmax_axis="queries"),
    ),
    Bug(
        "softmax-sum-over-queries",
        "the attention softmax's sum taken over the query axis (e / e.sum(axis=-2)), its max over the keys as it should be",
        WHOLE,
        Defects(softmax_axis="queries-sum"),
    ),
    Bug(
        "prefill-first-row",
        "row 0 taken from prefill's first position instead of its last (the prompt's last row gives the first logits)",
        ("per-step-logits",),
        compute=_prefill_first_row,
        screens=True,
    ),
    Bug(
        "record-after-consume",
        "each row recorded after consuming cont_ids[k] instead of before",
        ("per-step-logits",),
        compute=_recorded_after,
        screens=True,
    ),
    Bug(
        "shared-cache",
        "one cache shared by every layer: each layer also attends to the keys and values of the layers before it",
        MODEL,
        compute=_shared_cache,
        screens=True,
    ),
    Bug(
        "cache-not-cleared",
        "a cache never cleared between calls: each case also attends to the earlier cases' rows",
        ALL,
        compute=_cache_kept,
        screens=True,
        uses_history=True,
    ),
)
# A bug of the model itself (a Defects) is also one of a greedy loop's: the loop's logits are the same parametrised
# forward with it, teacher-forced on the student's tokens (theinference.grading.judge.loops.listed_loop_bugs).
_BUILTIN = tuple(dataclasses.replace(b, oracles=(*b.oracles, "greedy")) if b.defects else b for b in _ROW_BUGS)
BUILTIN_BUGS = {bug.name: bug for bug in _BUILTIN}


def resolve_bug(name: str, stage_source: Path) -> Bug:
    """The built-in bug of that name, or an instructor's `file.py:function` beside the stage file."""
    if name in BUILTIN_BUGS:
        return BUILTIN_BUGS[name]
    spec = load_file_function(stage_source, name)
    owner = f"bug '{name}' of {stage_source.name}"
    return Bug(
        name=name,
        finding=name,
        oracles=(),
        compute=lambda model, _, inputs, __: compute_expected(spec, model, inputs, owner, field="bugs"),
        stamp=spec.stamp,
    )


_DECODE_FIELDS = {"scale_decode", "decode_position", "decode_keys"}


def is_inert(bug: Bug, spec: OracleSpec, inputs: dict) -> bool:
    """True when the bug cannot change this case's output: a decode-step bug, and every output row
    comes before the first decode step (attention is causal), so no forward is needed."""
    if bug.defects is None:
        return False
    changed = {
        f.name for f in dataclasses.fields(Defects) if getattr(bug.defects, f.name) != getattr(defective.EXACT, f.name)
    }
    return changed <= _DECODE_FIELDS and max(spec.positions(inputs), default=0) < spec.prefill(inputs)


def _kept(defects: Defects, n_ids: int, at: int, prefill: int) -> int:
    """How many leading positions row `at` depends on with these defects. Attention is causal: none after the row,
    except the whole block when a mask leaves a row no key (it then attends to the whole block, defective._mask) or
    the softmax is over the queries (a block key's weights are normalised over every block query that sees it)."""
    ahead = not defects.mask_sees_self or defects.softmax_axis != "keys"
    return min(n_ids, max(at + 1, prefill) if ahead else at + 1)


def bug_screen(
    bug: Bug,
    spec: OracleSpec,
    oracle_name: str,
    model: Model,
    inputs: dict,
    row: int | None,
    columns,
    history: tuple | list = (),
) -> np.ndarray | None:
    """The bug's output at one row of a multi-row output (of logits, only those vocabulary columns), computed over
    the positions that row depends on: a necessary condition for a match at a fraction of bug_output's cost (the
    LM head of one row). None for an instructor's bug, or a row that is not one: computed whole."""
    if bug.defects is None:
        if bug.compute is None or not bug.screens:
            return None
        return bug.compute(model, oracle_name, inputs, list(history), row, columns)
    if oracle_name not in SCHEDULES:
        return None
    schedule = SCHEDULES[oracle_name]
    ids, own = schedule.consumed(inputs), schedule.rows(inputs)
    if isinstance(own, slice) and row is None:
        return None
    at = own.start + row if isinstance(own, slice) else own
    prefill = spec.prefill(inputs)
    keep = _kept(bug.defects, len(ids), at, prefill)
    defects = dataclasses.replace(bug.defects, prefill=min(prefill, keep))
    if schedule.layer0:
        return defective.layer0_attn_sublayer(model.params, ids[:keep], model.config.n_head, defects)[at]
    h = defective.hidden_states(model.params, ids[:keep], model.config.n_head, defects)[at]
    wte = model.params["wte"]["weight"]
    return h @ (wte if columns is None else wte[columns]).T


def bug_screens(
    bugs: list[Bug], spec: OracleSpec, oracle_name: str, model: Model, inputs: dict, row: int | None, columns
) -> dict[str, np.ndarray]:
    """bug_screen of each of these bugs that a Defects expresses, by name, their passes stacked so that the weights
    are read once for all of them (defective.hidden_states_many): on the gpt2 shape a screen is one short row, whose
    cost is reading the weights, so a dozen bugs cost about what one does. Empty where bug_screen computes nothing
    (a row that is not one) or computes layer 0 only; the bugs left out are bug_screen's."""
    if oracle_name not in SCHEDULES or SCHEDULES[oracle_name].layer0:
        return {}
    schedule = SCHEDULES[oracle_name]
    ids, own = schedule.consumed(inputs), schedule.rows(inputs)
    if isinstance(own, slice) and row is None:
        return {}
    at = own.start + row if isinstance(own, slice) else own
    prefill = spec.prefill(inputs)
    runs, names = [], []
    for bug in bugs:
        if bug.defects is None:
            continue
        keep = _kept(bug.defects, len(ids), at, prefill)
        runs.append((ids[:keep], dataclasses.replace(bug.defects, prefill=min(prefill, keep))))
        names.append(bug.name)
    if not runs:
        return {}
    hidden = defective.hidden_states_many(model.params, runs, model.config.n_head)
    wte = model.params["wte"]["weight"]
    return dict(zip(names, np.stack([h[at] for h in hidden]) @ (wte if columns is None else wte[columns]).T))


def bug_output(
    bug: Bug, spec: OracleSpec, oracle_name: str, model: Model, inputs: dict, history: tuple | list = ()
) -> np.ndarray:
    """What the stage's adapter returns for these inputs (after the earlier cases' calls) with this bug: one forward."""
    if bug.compute is not None:
        return np.asarray(bug.compute(model, oracle_name, inputs, list(history)))
    assert spec.defective is not None, "a built-in bug applies to the built-in oracles it names"
    defects = dataclasses.replace(bug.defects or defective.EXACT, prefill=spec.prefill(inputs))
    return np.asarray(spec.defective(model, defects, **inputs))
