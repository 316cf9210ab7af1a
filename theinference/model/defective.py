"""GPT-2 with a named student's bug: a `Defects` says which, and is one instance of the parametrised forward.

The bug oracles of fingerprinting (theinference.grading.oracle.bugs names and documents each bug) are described
here as departures from GPT-2 on a stage's schedule, and computed by model/variant.py's one forward pass with the
mistake (`as_variant`). With no defect set the result is bit-identical to gpt2.py (tests/test_defective.py proves
it). Some defects only exist in an incremental computation (a prefill block, then one row per decode step):
`Defects.prefill` says how many leading rows form the block; every later row is modelled as a single-query
decode step.
"""

from dataclasses import dataclass

from theinference.model import variant
from theinference.model.gpt2 import lm_head
from theinference.model.variant import Variant, counted


@dataclass(frozen=True)
class Defects:
    """Departures from GPT-2; all default to exact GPT-2."""

    prefill: int = 0  # rows computed as one block before the single-row decode steps
    scale_block: bool = True  # 1/sqrt(head_dim) applied to the prefill block's scores
    scale_decode: bool = True  # ... and to each decode step's single query
    decode_position: str = "advance"  # advance | plus-one | zero | stuck | reset (see DECODE_POSITIONS)
    decode_keys: str = "all"  # keys a decode step's query sees (Variant.decode_keys)
    mask_sees_self: bool = True  # False: the causal mask is off by one (no row sees itself)
    c_attn_transposed: bool = False  # each square q/k/v block of c_attn used transposed
    c_proj_transposed: bool = False  # the attention's square c_proj used transposed
    qkv_order: tuple = (0, 1, 2)  # which third of c_attn's output is used as q, k, v
    ln_eps: float = 1e-5
    gelu: str = "tanh"  # tanh | erf
    ln_f: bool = True
    attn_residual: bool = True  # False: x = attn(ln_1(x)), the residual x + dropped
    mlp_residual: bool = True  # False: x = mlp(ln_2(x))
    softmax_axis: str = "keys"  # keys | queries | queries-sum (Variant.softmax_axis)
    # Lengths of consecutive calls that share one cache never cleared: every row attends to every
    # earlier row, and positions restart at 0 with each call.
    segments: tuple = ()


EXACT = Defects()

# The position counter of the decode steps for each kind (variant.counted's base, slope, offset).
DECODE_POSITIONS = {
    "advance": ("prompt", 1, 0),
    "plus-one": ("prompt", 1, 1),
    "zero": ("zero", 0, 0),
    "stuck": ("prompt", 0, 0),
    "reset": ("zero", 1, 0),
}


def positions(n_seq: int, defects: Defects) -> tuple[int, ...] | None:
    """The wpe row of every position (None: 0..n_seq-1, GPT-2's); a decode position defect changes the rows after
    the prefill block."""
    if defects.segments:
        return tuple(p for n in defects.segments for p in range(n))
    if defects.decode_position == "advance":
        return None
    block = min(defects.prefill, n_seq)
    steps = counted(*DECODE_POSITIONS[defects.decode_position], defects.prefill, n_seq - block)
    return (*range(block), *steps)


def as_variant(defects: Defects, n_seq: int) -> Variant:
    """The defects as a mistake of the one parametrised forward pass, for a pass over n_seq positions."""
    norms = ("ln_1", "ln_2", "ln_f" if defects.ln_f else "none")
    mask = 0 if defects.mask_sees_self else -1
    return Variant(
        prefill=defects.prefill,
        scale_block=None if defects.scale_block else 1.0,
        scale_decode=None if defects.scale_decode else 1.0,
        positions=positions(n_seq, defects),
        norms_block=norms,
        norms_decode=norms,
        mask_block=mask,
        mask_decode=mask,
        decode_keys=defects.decode_keys,
        qkv_order=tuple(defects.qkv_order),
        softmax_axis=defects.softmax_axis,
        c_attn_transposed=defects.c_attn_transposed,
        c_proj_transposed=defects.c_proj_transposed,
        ln_eps=defects.ln_eps,
        gelu=defects.gelu,
        attn_residual=defects.attn_residual,
        mlp_residual=defects.mlp_residual,
    )


def layer0_attn_sublayer(params, ids, n_head, defects):  # [n_seq] -> [n_seq, n_embd]
    """The residual stream after layer 0's attention sublayer, x + attn(ln_1(x)), with the defects."""
    return variant.layer0_attn_sublayer(params, ids, n_head, as_variant(defects, len(ids)))


def hidden_states(params, ids, n_head, defects):  # [n_seq] -> [n_seq, n_embd], after ln_f (unless a defect drops it)
    return variant.hidden_states(params, ids, n_head, as_variant(defects, len(ids)))


def hidden_states_many(params, runs: list[tuple[list, Defects]], n_head) -> list:
    """hidden_states for each (ids, defects), their rows stacked so that each weight is read once for all of them
    (screening a dozen bugs on one short row costs one pass over the weights, not a dozen)."""
    passes = [(ids, as_variant(defects, len(ids))) for ids, defects in runs]
    return variant.hidden_states_many(params, passes, n_head, share_blocks=False)


def logits(params, ids, n_head, defects, rows=None):  # [n_seq] -> [n_seq or len(rows), n_vocab]
    """Logits at every position (or only at `rows`), with the defects."""
    h = hidden_states(params, ids, n_head, defects)
    return lm_head(params, h if rows is None else h[rows])


def per_step_logits(params, prompt_ids, cont_ids, n_head, defects):  # -> [len(cont_ids), n_vocab]
    """gpt2.per_step_logits with the defects: row k, the logits seen before consuming cont[k]."""
    ids = list(prompt_ids) + list(cont_ids)[:-1]
    start = len(prompt_ids) - 1
    return logits(params, ids, n_head, defects, rows=slice(start, start + len(cont_ids)))
