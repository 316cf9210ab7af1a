"""The oracles a stage can name: built-in GPT-2 computations, or an instructor's function in a file.

An instructor's oracle is `def name(model, **inputs) -> array`, where `model` is a
`theinference.model.weights.Model` (`model.params` nested like the checkpoint keys, `model.config`
with n_head, n_embd, ...) and the inputs are the case's token-id lists and counts. The functions
of `theinference.model.gpt2` (layer_norm, mha, ffn, embed, ...) are there to build on.
"""

import importlib.util
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from theinference.model import defective
from theinference.model import gpt2 as oracle
from theinference.model.weights import GPT2Config, Model
from theinference.errors import ConfigError


class OracleError(ConfigError):
    """An instructor's oracle could not be loaded or run (a course-configuration error)."""


@dataclass(frozen=True)
class Schedule:
    """A built-in oracle as one causal pass: the ids it feeds, which rows of the pass it returns (a slice, or one
    row's index: a vector), how many leading rows the stage's incremental path computes as one block (every later
    row a single-query decode step), and whether the rows are layer 0's attention sublayer instead of logits. The
    oracle, its bug oracles and the families' candidates are each this schedule over one forward pass."""

    consumed: Callable[[dict], list]
    rows: Callable[[dict], Any]
    prefill: Callable[[dict], int]
    layer0: bool = False


@dataclass(frozen=True)
class OracleSpec:
    inputs: tuple[str, ...]
    compute: Callable[..., np.ndarray]
    positions: Callable[[dict], list[int]]  # position of each output row, for tables
    stamp: tuple = ()  # an instructor's oracle: (file, mtime_ns, size), so an edit invalidates cached outputs
    # How many leading rows the stage's incremental path computes as one block (bug oracles model
    # every later row as a single-query decode step); built-in oracles only.
    prefill: Callable[[dict], int] = lambda inputs: 0
    # The same computation with a bug: (model, defects, **inputs), model/defective.py; the built-in bug
    # oracles (theinference.grading.oracle.bugs) need it. Built-in oracles only.
    defective: Callable[..., np.ndarray] | None = None
    # The shape of the output for these inputs, known without computing it (the runner's byte cap for a
    # returned array is set from it before the student's process starts); built-in oracles only.
    shape: Callable[[GPT2Config, dict], tuple[int, ...]] | None = None
    schedule: Schedule | None = None  # a built-in oracle that is one causal pass (all but greedy)


def _seq_positions(inputs: dict) -> list[int]:
    return list(range(len(inputs["seq"])))


def _last_position(inputs: dict) -> list[int]:
    return [len(inputs["seq"]) - 1] if "seq" in inputs else [len(inputs["prompt"])]


def _step_positions(inputs: dict) -> list[int]:
    start = len(inputs["prompt"]) - 1
    return list(range(start, start + len(inputs.get("cont") or range(inputs.get("n_new", 0)))))


def _returned(params, schedule: Schedule, inputs: dict, layer0, hidden) -> np.ndarray:
    """The schedule's rows of one pass: layer0(ids) or the LM head on hidden(ids) (one row: a vector)."""
    ids, own = schedule.consumed(inputs), schedule.rows(inputs)
    if schedule.layer0:
        return layer0(ids)[own]
    h = hidden(ids)
    return oracle.lm_head(params, h[own]) if isinstance(own, slice) else oracle.lm_head(params, h[own : own + 1])[0]


def _one_pass(inputs: tuple[str, ...], schedule: Schedule, positions, shape) -> OracleSpec:
    """A built-in oracle written once: its schedule over gpt2.py, and over model/defective.py for its bug oracles."""

    def compute(m: Model, **given) -> np.ndarray:
        p, n_head = m.params, m.config.n_head
        return _returned(
            p,
            schedule,
            given,
            lambda ids: oracle.layer0_attn_sublayer(p, ids, n_head),
            lambda ids: oracle.hidden_states(p, ids, n_head),
        )

    def with_defects(m: Model, defects, **given) -> np.ndarray:
        p, n_head = m.params, m.config.n_head
        return _returned(
            p,
            schedule,
            given,
            lambda ids: defective.layer0_attn_sublayer(p, ids, n_head, defects),
            lambda ids: defective.hidden_states(p, ids, n_head, defects),
        )

    return OracleSpec(
        inputs=inputs,
        compute=compute,
        positions=positions,
        prefill=schedule.prefill,
        defective=with_defects,
        shape=shape,
        schedule=schedule,
    )


def _whole(i: dict) -> slice:
    return slice(0, len(i["seq"]))


BUILTIN_ORACLES = {
    "layer0-attn-last": _one_pass(
        ("seq",),
        Schedule(lambda i: list(i["seq"]), lambda i: len(i["seq"]) - 1, lambda i: len(i["seq"]) - 1, layer0=True),
        _last_position,
        lambda config, inputs: (config.n_embd,),
    ),
    "decode-step-logits": _one_pass(
        ("prompt", "next_id"),
        Schedule(lambda i: [*i["prompt"], i["next_id"]], lambda i: len(i["prompt"]), lambda i: len(i["prompt"])),
        _last_position,
        lambda config, inputs: (config.n_vocab,),
    ),
    "logits": _one_pass(
        ("seq",),
        Schedule(lambda i: list(i["seq"]), _whole, lambda i: len(i["seq"])),  # one block: no decode steps
        _seq_positions,
        lambda config, inputs: (len(inputs["seq"]), config.n_vocab),
    ),
    "layer0-attn-sublayer": _one_pass(
        ("seq",),
        Schedule(lambda i: list(i["seq"]), _whole, lambda i: 0, layer0=True),
        _seq_positions,
        lambda config, inputs: (len(inputs["seq"]), config.n_embd),
    ),
    "per-step-logits": _one_pass(  # row k: the logits seen before consuming cont[k]
        ("prompt", "cont"),
        Schedule(
            lambda i: [*i["prompt"], *i["cont"][:-1]],
            lambda i: slice(len(i["prompt"]) - 1, len(i["prompt"]) - 1 + len(i["cont"])),
            lambda i: len(i["prompt"]),
        ),
        _step_positions,
        lambda config, inputs: (len(inputs["cont"]), config.n_vocab),
    ),
    "greedy": OracleSpec(
        inputs=("prompt", "n_new"),
        compute=lambda m, prompt, n_new: np.asarray(oracle.greedy(m.params, prompt, n_new, m.config.n_head)),
        positions=_step_positions,
        shape=lambda config, inputs: (inputs["n_new"],),
    ),
}
SCHEDULES = {name: spec.schedule for name, spec in BUILTIN_ORACLES.items() if spec.schedule is not None}


_FILE_ORACLES: dict[tuple, OracleSpec] = {}  # loaded instructor oracles, by file stamp and function


def load_file_function(stage_source: Path, name: str) -> OracleSpec:
    """Load `file.py:function` beside the stage file, once per version of the file."""
    file_name, _, func_name = name.partition(":")
    path = (stage_source.parent / file_name).resolve()
    try:
        stat = path.stat()
    except OSError as e:
        raise OracleError(f"{path}: cannot read the oracle file: {e.strerror or e}") from e
    stamp = (str(path), stat.st_mtime_ns, stat.st_size)
    if (stamp, func_name) not in _FILE_ORACLES:  # import once per version of the file, not per grade
        _FILE_ORACLES[(stamp, func_name)] = _import_file_oracle(path, func_name, stage_source, stamp)
    return _FILE_ORACLES[(stamp, func_name)]


def _import_file_oracle(path: Path, func_name: str, stage_source: Path, stamp: tuple) -> OracleSpec:
    module_name = f"theinference_course_oracle_{abs(hash(str(path)))}"
    try:
        spec = importlib.util.spec_from_file_location(module_name, path)
        assert spec is not None and spec.loader is not None, "a .py path always has a loader"
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    except Exception as e:  # an instructor's file: any error is a course-configuration error
        raise OracleError(f"{path}: cannot import the oracle file: {type(e).__name__}: {e}") from e
    func = getattr(module, func_name, None)
    if not callable(func):
        raise OracleError(f"{path}: defines no function '{func_name}' (named by {stage_source.name})")
    return OracleSpec(inputs=(), compute=func, positions=lambda inputs: [], stamp=stamp)


def resolve_oracle(name: str, stage_source: Path) -> OracleSpec:
    """Return the built-in oracle of that name, or load `file.py:function` beside the stage file."""
    return BUILTIN_ORACLES.get(name) or load_file_function(stage_source, name)


def compute_expected(
    spec: OracleSpec, model: Model, inputs: dict, owner: str = "", case: str = "", field: str = "oracle"
) -> np.ndarray:
    """Run an oracle; an instructor's oracle failing, or returning anything but a finite numeric array, is an
    OracleError naming owner (e.g. "stage 'x'"), the case, the file and line."""
    try:
        raw = spec.compute(model, **inputs)
    except Exception as e:
        if spec.inputs:  # built-in: a failure here is a grader bug and must surface as one
            raise
        raise OracleError(_failure(spec, owner, e)) from e
    if spec.inputs:
        return np.asarray(raw)
    problem, output = _output_problem(raw)
    if problem:
        name = getattr(spec.compute, "__name__", "oracle")
        where = f"{owner}, case '{case}'" if case else owner
        raise OracleError(
            f"{where + ': ' if where else ''}the oracle {name}() in {spec.stamp[0] if spec.stamp else 'its file'} "
            f"(named by the stage file's field '{field}') returned {problem}; an oracle must return a finite numeric "
            "array of at least one dimension (every answer would be judged against it)"
        )
    return output


def _output_problem(raw) -> tuple[str, np.ndarray]:
    """What is wrong with an instructor oracle's return value ("" if nothing), and the value as an array."""
    if raw is None:
        return "None (a missing `return`?)", np.empty(0)
    if isinstance(raw, (str, bytes)):
        return f"a {type(raw).__name__} ({raw[:40]!r})", np.empty(0)
    try:
        output = np.asarray(raw)
    except Exception as e:  # ragged lists and the like: numpy says what
        return f"{type(raw).__name__} that is not an array ({type(e).__name__}: {e})", np.empty(0)
    if output.dtype.kind not in "iuf":
        return f"a {type(raw).__name__} of {output.dtype} values, not numbers", output
    if output.ndim == 0:
        return f"a single number ({output.item()!r}, a 0-d value), not an array with a row per position", output
    if output.size == 0:
        return f"an empty array (shape {list(output.shape)})", output
    bad = ~np.isfinite(output)
    if bad.any():
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        return (
            f"{int(bad.sum())} non-finite value(s) (NaN or inf) of {output.size}, the first at index {list(first)} "
            f"({output[first]!r}): compared with NaN, any answer would pass",
            output,
        )
    return "", output


def _failure(spec: OracleSpec, owner: str, e: Exception) -> str:
    """What failed where, then the instructor's traceback (the grader's own frames left out)."""
    frames = traceback.extract_tb(e.__traceback__)[1:]  # [0] is compute_expected's call
    path = spec.stamp[0] if spec.stamp else ""
    in_file = [f for f in frames if f.filename == path]
    where = f"{path}, line {in_file[-1].lineno}" if in_file else path
    name = getattr(spec.compute, "__name__", "oracle")
    head = f"{owner}: " if owner else ""
    hint = _CONFIG_HINT if isinstance(e, TypeError) and "GPT2Config" in str(e) else ""
    trace = "".join(traceback.format_list(frames)).rstrip()
    return (
        f"{head}the oracle {name}() failed at {where}: {type(e).__name__}: {e}{hint}\n"
        f"the oracle's traceback (most recent call last):\n{trace}"
    )


_CONFIG_HINT = " (model.config is an object, not a dict: write model.config.n_layer, not model.config['n_layer'])"
