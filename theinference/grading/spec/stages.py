"""Stage files: discover `stages/*.toml`, validate them strictly, return StageSpec objects.

A stage file (format_version 1) holds the top-level keys of schema.STAGE_KEYS: each is a field of StageSpec or of a check
type (theinference.grading.spec.checks), whose metadata says what the loader accepts and what the authoring guide
says of it (theinference.grading.spec.schema: docs/authoring.md's table of fields is its `schema_text()`, and a
test fails when the two disagree). Below, what two of those tables hold:

  [scaling]       required with compare = "scaling" (oracle "greedy"), forbidden otherwise:
                    lengths    list of >= 2 ints >= 1, ascending: the n_new values timed; every
                               call's tokens are checked as the greedy stage checks them.
                               Scaled down in proportion when a prompt plus the longest does
                               not fit the weights' n_ctx.
                    repeats    int >= 1: timed calls per length (the cheapest counts), after one
                               untimed warm-up call on the case's prompt
                    prompt_tokens  int >= 1: every timed call gets a fresh prompt of this many
                               random token ids, sent only when the call starts
                    max_ratio  number > 1: the most the CPU time per token at the longest length
                               may be, as a multiple of that at the shortest
                    max_fraction  number in (0, 1): the most the longest call's CPU time may be,
                               as a fraction of what a full recompute of the same tokens costs
                               the oracle on this machine (the floor that padding cannot fake)
                    weights    "proof" (the synthetic preset the thresholds were measured on, made
                               on first use) or "graded" (the weights being graded, unless a
                               token's cost there is mostly the LM head: then "proof" all the same)
                  CPU time is the kernel's count for the student's whole process tree, read by the
                  grader (theinference.proc.accounting). Its cases give only `prompt` (the warm-up
                  call's): n_new comes from `lengths`.
  [[case]]        name (str, unique in the stage) plus the oracle's inputs: token inputs
                  (seq, prompt, cont) as text or a list of ids, counts (n_new) as ints,
                  single token ids (next_id) as an int or a text of exactly one token
"""

import math
import re
import tomllib
from pathlib import Path

from theinference.model import tokenizer
from theinference.grading.oracle.bugs import BUILTIN_BUGS
from theinference.grading.spec.checks import COMPARES, Check, RowsCheck, ScalingCheck, ScalingSpec, TokensCheck
from theinference.grading.spec.schema import (  # re-exported: the stage's type is the loader's
    OPTIONAL_KEYS,
    REQUIRED_KEYS,
    VISIBILITIES,
    CaseSpec,
    StageSpec,
)
from theinference.grading.spec.shapes import SHAPES, SHAPES_OF_KIND
from theinference.grading.spec.inputs import CASE_INPUTS, COUNT_INPUTS, ID_INPUTS, described
from theinference.grading.oracle.registry import BUILTIN_ORACLES
from theinference.bundled import data_dir
from theinference.course import Course
from theinference.errors import ConfigError

FORMAT_VERSION = 1
_ID = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")


class StageError(ConfigError):
    """A stage file is invalid; the message names the file and the field."""


def valid_id(stage_id: str) -> bool:
    """True for a stage id the loader accepts: lowercase words joined by '-'."""
    return bool(_ID.match(stage_id))


def camel_case(name: str) -> str:
    """run_layer_equiv -> runLayerEquiv (the TypeScript edition's adapter names)."""
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def _fail(path: Path, where: str, message: str) -> StageError:
    return StageError(f"{path}: field '{where}': {message}")


def _check_type(path: Path, where: str, value, expected) -> None:
    # bool is an int in Python; a stage file saying `timeout = true` is a typo, not a number.
    if isinstance(value, bool) or not isinstance(value, expected):
        names = " or ".join(t.__name__ for t in (expected if isinstance(expected, tuple) else (expected,)))
        raise _fail(path, where, f"expected {names}, got {type(value).__name__} {value!r}")


def _check_keys(path: Path, data: dict) -> None:
    for key in data:
        if key not in REQUIRED_KEYS and key not in OPTIONAL_KEYS:
            known = ", ".join(sorted([*REQUIRED_KEYS, *OPTIONAL_KEYS]))
            raise _fail(path, key, f"unknown field (known fields: {known})")
    for key, expected in REQUIRED_KEYS.items():
        if key not in data:
            raise _fail(path, key, "missing required field")
        _check_type(path, key, data[key], expected)
    for key, expected in OPTIONAL_KEYS.items():
        if key in data:
            _check_type(path, key, data[key], expected)


def _token_input(path: Path, where: str, value) -> tuple[list[int], str | None]:
    if isinstance(value, str):
        ids = tokenizer.encode(value)
        if not ids:
            raise _fail(path, where, "text encodes to no tokens")
        return ids, value
    if isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        if any(v < 0 for v in value):
            raise _fail(path, where, "token ids must be >= 0")
        return value, None
    raise _fail(path, where, "expected text (a string) or a non-empty list of token ids")


def _single_token(path: Path, where: str, value) -> tuple[int, str | None]:
    if isinstance(value, str):
        ids = tokenizer.encode(value)
        if len(ids) != 1:
            raise _fail(path, where, f"text {value!r} is {len(ids)} tokens; a single token is needed")
        return ids[0], value
    _check_type(path, where, value, int)
    if value < 0:
        raise _fail(path, where, "token ids must be >= 0")
    return value, None


def _parse_case(path: Path, index: int, raw, inputs: tuple[str, ...]) -> CaseSpec:
    where = f"case[{index}]"
    if not isinstance(raw, dict):
        raise _fail(path, where, "each [[case]] must be a table")
    if not isinstance(raw.get("name"), str) or not raw["name"]:
        raise _fail(path, f"{where}.name", "missing or not a non-empty string")
    for key in raw:
        if key != "name" and key not in inputs:
            raise _fail(path, f"{where}.{key}", f"unknown field (this stage's oracle takes: name, {', '.join(inputs)})")
    values, texts = {}, {}
    for key in inputs:
        if key not in raw:
            raise _fail(path, f"{where}.{key}", "missing required field")
        if key in COUNT_INPUTS:
            _check_type(path, f"{where}.{key}", raw[key], int)
            if raw[key] < 1:
                raise _fail(path, f"{where}.{key}", "must be >= 1")
            values[key] = raw[key]
        elif key in ID_INPUTS:
            values[key], text = _single_token(path, f"{where}.{key}", raw[key])
            if text is not None:
                texts[key] = text
        else:
            values[key], text = _token_input(path, f"{where}.{key}", raw[key])
            if text is not None:
                texts[key] = text
    return CaseSpec(name=raw["name"], inputs=values, texts=texts)


def _oracle_inputs(path: Path, data: dict) -> tuple[str, ...]:
    oracle = data["oracle"]
    if oracle in BUILTIN_ORACLES:
        builtin = BUILTIN_ORACLES[oracle].inputs
        if "inputs" in data and tuple(data["inputs"]) != builtin:
            raise _fail(path, "inputs", f"oracle '{oracle}' takes {list(builtin)}")
        return builtin
    if ":" not in oracle:
        known = ", ".join(sorted(BUILTIN_ORACLES))
        raise _fail(path, "oracle", f"unknown oracle '{oracle}' (built-in: {known}; or 'file.py:function')")
    file_name, _, func = oracle.partition(":")
    if not (path.parent / file_name).is_file():
        raise _fail(path, "oracle", f"oracle file '{file_name}' not found beside the stage file")
    if not func.isidentifier():
        raise _fail(path, "oracle", f"'{func}' is not a function name")
    if "inputs" not in data:
        raise _fail(path, "inputs", 'an instructor\'s oracle needs `inputs`, e.g. inputs = ["seq"]')
    for i, name in enumerate(data["inputs"]):
        if name not in CASE_INPUTS:
            raise _fail(path, f"inputs[{i}]", f"unknown input '{name}' (known: {described()})")
    return tuple(data["inputs"])


def _check_values(path: Path, data: dict) -> None:
    if data["format_version"] != FORMAT_VERSION:
        raise _fail(path, "format_version", f"this theinference reads format_version {FORMAT_VERSION}")
    if not _ID.match(data["id"]):
        raise _fail(path, "id", f"'{data['id']}' must be lowercase words joined by '-'")
    if data["compare"] not in COMPARES:
        raise _fail(path, "compare", f"must be one of {', '.join(COMPARES)}")
    if not math.isfinite(data["timeout"]) or data["timeout"] <= 0:  # TOML has nan and inf
        raise _fail(path, "timeout", "must be > 0 seconds (a finite number)")
    if not math.isfinite(data["points"]) or data["points"] < 0:
        raise _fail(path, "points", "must be >= 0 (a finite number)")
    if data.get("credit", "all-or-nothing") not in ("all-or-nothing", "per-case"):
        raise _fail(path, "credit", "must be 'all-or-nothing' or 'per-case'")
    if data.get("visibility", "visible") not in VISIBILITIES:
        raise _fail(path, "visibility", f"must be one of {', '.join(VISIBILITIES)} (Gradescope's)")
    if not data["adapter"].isidentifier():
        raise _fail(path, "adapter", f"'{data['adapter']}' is not a Python function name")
    for i, alias in enumerate(data.get("aliases", [])):
        if not isinstance(alias, str) or not alias.isidentifier():
            raise _fail(path, f"aliases[{i}]", "must be a function name")
    if not data["case"]:
        raise _fail(path, "case", "a stage needs at least one [[case]]")


def _tolerance(
    path: Path, table: dict, name: str = "tolerance", keys: tuple[str, ...] = ("atol", "rtol")
) -> tuple[float, ...]:
    """The finite, positive numbers of a tolerance table ([tolerance] atol, rtol; [tie] rtol)."""
    for key in table:
        if key not in keys:
            raise _fail(path, f"{name}.{key}", f"unknown field (known fields: {', '.join(keys)})")
    for key in keys:
        if key not in table:
            raise _fail(path, f"{name}.{key}", "missing required field")
        _check_type(path, f"{name}.{key}", table[key], (int, float))
        # An atol of 0 would fail the reference solution itself on float rounding (read as the student's bug);
        # beside a positive atol, an rtol of 0 is a plain absolute tolerance.
        least = 0.0 if (name, key) == ("tolerance", "rtol") else None
        if not math.isfinite(table[key]) or table[key] < 0 or (least is None and table[key] == 0):
            bound = ">= 0" if least is not None else "> 0"
            raise _fail(path, f"{name}.{key}", f"must be a finite number {bound}, not {table[key]}")
    return tuple(float(table[key]) for key in keys)


def _scaling(path: Path, data: dict) -> ScalingSpec | None:
    if data["compare"] != "scaling":
        if "scaling" in data:
            raise _fail(path, "scaling", 'only a stage with compare = "scaling" takes a [scaling] table')
        return None
    if data["oracle"] != "greedy":
        raise _fail(path, "oracle", 'compare = "scaling" times run_greedy-like adapters: the oracle must be "greedy"')
    table = data.get("scaling")
    if table is None:
        raise _fail(path, "scaling", f'compare = "scaling" needs a [scaling] table ({", ".join(_SCALING_FIELDS)})')
    for key in table:
        if key not in _SCALING_FIELDS:
            raise _fail(path, f"scaling.{key}", f"unknown field (known fields: {', '.join(sorted(_SCALING_FIELDS))})")
    for key, kind in _SCALING_FIELDS.items():
        if key not in table:
            raise _fail(path, f"scaling.{key}", "missing required field")
        _check_type(path, f"scaling.{key}", table[key], kind)
    lengths = table["lengths"]
    for i, n in enumerate(lengths):
        _check_type(path, f"scaling.lengths[{i}]", n, int)
    if len(lengths) < 2 or lengths[0] < 1 or any(a >= b for a, b in zip(lengths, lengths[1:])):
        raise _fail(path, "scaling.lengths", "needs at least two lengths >= 1, in ascending order")
    if table["repeats"] < 1:
        raise _fail(path, "scaling.repeats", "must be >= 1")
    if table["max_ratio"] <= 1:
        raise _fail(path, "scaling.max_ratio", "must be > 1")
    if table["prompt_tokens"] < 1:
        raise _fail(path, "scaling.prompt_tokens", "must be >= 1")
    if not 0 < table["max_fraction"] < 1:
        raise _fail(path, "scaling.max_fraction", "must be between 0 and 1 (a fraction of a full recompute's cost)")
    if table["weights"] not in ("proof", "graded"):
        raise _fail(path, "scaling.weights", f'must be "proof" or "graded", not {table["weights"]!r}')
    return ScalingSpec(
        lengths=tuple(lengths),
        repeats=table["repeats"],
        max_ratio=float(table["max_ratio"]),
        prompt_tokens=table["prompt_tokens"],
        max_fraction=float(table["max_fraction"]),
        weights=table["weights"],
    )


_SCALING_FIELDS = {
    "lengths": list,
    "repeats": int,
    "prompt_tokens": int,
    "max_ratio": (int, float),
    "max_fraction": (int, float),
    "weights": str,
}


def _parse_cases(path: Path, data: dict, inputs: tuple[str, ...], scaling: ScalingSpec | None) -> tuple[CaseSpec, ...]:
    if scaling is None:
        return tuple(_parse_case(path, i, raw, inputs) for i, raw in enumerate(data["case"]))
    # A scaling stage's n_new comes from its lengths; a case gives only the prompt.
    given = tuple(k for k in inputs if k != "n_new")
    cases = (_parse_case(path, i, raw, given) for i, raw in enumerate(data["case"]))
    return tuple(CaseSpec(c.name, {**c.inputs, "n_new": scaling.lengths[-1]}, c.texts) for c in cases)


def _tolerances(path: Path, data: dict) -> tuple[float, float] | float:
    """(atol, rtol), or a token stage's tie rtol: a stage that checks greedy tokens has [tie] and no [tolerance], any
    other the reverse."""
    kind = data["compare"]
    if kind in (TokensCheck.kind, ScalingCheck.kind):
        if "tolerance" in data:
            raise _fail(path, "tolerance", f'a "{kind}" stage takes [tie] (near-tie tolerance), not [tolerance]')
        if "tie" not in data:
            raise _fail(path, "tie", f'missing required field (a "{kind}" stage needs [tie] rtol)')
        return _tolerance(path, data["tie"], "tie", ("rtol",))[0]
    if "tie" in data:
        raise _fail(path, "tie", 'only a stage that checks greedy tokens (compare "tokens" or "scaling") takes [tie]')
    if "tolerance" not in data:
        raise _fail(path, "tolerance", "missing required field")
    atol, rtol = _tolerance(path, data["tolerance"])
    return atol, rtol


def _check(tolerances: tuple[float, float] | float, scaling: ScalingSpec | None) -> Check:
    """What the stage checks, from its validated tolerance and [scaling] table."""
    if isinstance(tolerances, tuple):
        return RowsCheck(*tolerances)
    return TokensCheck(tolerances) if scaling is None else ScalingCheck(tolerances, scaling)


def _hints(path: Path, table: dict, kind: str) -> dict:
    for key, text in table.items():
        if key not in SHAPES:
            raise _fail(path, f"hints.{key}", f"unknown failure shape (known: {', '.join(SHAPES)})")
        if key not in SHAPES_OF_KIND[kind]:  # its hint would never be shown
            raise _fail(
                path,
                f"hints.{key}",
                f'a "{kind}" stage never fails with this shape (its shapes: {", ".join(SHAPES_OF_KIND[kind])})',
            )
        _check_type(path, f"hints.{key}", text, str)
    return dict(table)


def _uncomputable(name: str, oracle: str) -> str:
    """Why a built-in bug cannot serve this stage, and what would."""
    usable = [bug for bug, known in BUILTIN_BUGS.items() if oracle in known.oracles]
    if usable:
        return f"bug '{name}' cannot be computed for oracle '{oracle}'; built-in bugs that can: {', '.join(usable)}"
    own = ":" in oracle  # an instructor's oracle computes what no built-in bug oracle knows how to compute
    return (
        f"bug '{name}' cannot be computed for oracle '{oracle}': no built-in bug can"
        + (" (they are GPT-2 with a defect, for the built-in oracles' outputs)" if own else "")
        + "; write the bug as a 'file.py:function' beside the stage file, function(model, **inputs)"
    )


def _bugs(path: Path, data: dict) -> tuple[tuple[str, ...], dict]:
    names = data.get("bugs", [])
    for i, name in enumerate(names):
        _check_type(path, f"bugs[{i}]", name, str)
        if ":" in name:
            file_name, _, func = name.partition(":")
            if not (path.parent / file_name).is_file() or not func.isidentifier():
                raise _fail(
                    path, f"bugs[{i}]", f"'{name}': no file '{file_name}' beside the stage file, or not a function name"
                )
        elif name not in BUILTIN_BUGS:
            raise _fail(
                path, f"bugs[{i}]", f"unknown bug '{name}' (built-in: {', '.join(BUILTIN_BUGS)}; or 'file.py:function')"
            )
        elif data["oracle"] not in BUILTIN_BUGS[name].oracles:
            raise _fail(path, f"bugs[{i}]", _uncomputable(name, data["oracle"]))
        elif data["compare"] == ScalingCheck.kind:  # its verdict is the cost; it never fingerprints its tokens
            raise _fail(
                path, f"bugs[{i}]", f'a "scaling" stage is judged on cost: list bug \'{name}\' in a "tokens" stage'
            )
    hints = data.get("bug_hints", {})
    for key, text in hints.items():
        if key not in names:
            raise _fail(path, f"bug_hints.{key}", "not one of this stage's `bugs`")
        _check_type(path, f"bug_hints.{key}", text, str)
    return tuple(names), dict(hints)


def load_stage(path: Path) -> StageSpec:
    """Parse and validate one stage file; raise StageError naming the file and field."""
    try:
        # utf-8-sig: Windows Notepad starts the files it saves as UTF-8 with a byte-order mark
        data = tomllib.loads(path.read_text(encoding="utf-8-sig"))
    except OSError as e:
        raise StageError(f"{path}: cannot read: {e.strerror or e}") from e
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise StageError(f"{path}: not valid TOML: {e}") from e
    _check_keys(path, data)
    _check_values(path, data)
    tolerances = _tolerances(path, data)  # in this order: a file with several faults is told the same first one
    inputs = _oracle_inputs(path, data)
    scaling = _scaling(path, data)
    check = _check(tolerances, scaling)
    cases = _parse_cases(path, data, inputs, scaling)
    bugs, bug_hints = _bugs(path, data)
    names = [c.name for c in cases]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise _fail(path, f"case[{i}].name", f"duplicate case name '{name}'")
    return StageSpec(
        id=data["id"],
        inputs=inputs,
        title=data["title"],
        order=data["order"],
        lesson=(path.parent / data["lesson"]).resolve(),
        adapter=data["adapter"],
        aliases=tuple(data.get("aliases", [camel_case(data["adapter"])])),
        oracle=data["oracle"],
        check=check,
        timeout=float(data["timeout"]),
        points=float(data["points"]),
        credit=data.get("credit", "all-or-nothing"),
        hints=_hints(path, data.get("hints", {}), check.kind),
        cases=cases,
        source=path.resolve(),
        bugs=bugs,
        bug_hints=bug_hints,
        visibility=data.get("visibility", "visible"),
    )


def stage_dirs(course: Course | None, extra: tuple[Path, ...] | list[Path] = (), trusted: bool = True) -> list[Path]:
    """Where every command finds stages: built-in, then the course's `stages/` and its own `stages_dirs`
    (its theinference.toml; neither when grading is untrusted), then --stages-dir (the instructor's)."""
    dirs = [data_dir("stages")]
    if course is not None and trusted:
        if (course.root / "stages").is_dir():
            dirs.append(course.root / "stages")
        dirs.extend(course.stages_dirs)
    dirs.extend(Path(d) for d in extra)
    unique: list[Path] = []
    for d in dirs:
        if d.resolve() not in [u.resolve() for u in unique]:
            unique.append(d)
    return unique


def load_stages(dirs: list[Path]) -> list[StageSpec]:
    """Load every `*.toml` in the directories, sorted by order; duplicate ids are errors."""
    stages: dict[str, StageSpec] = {}
    for directory in dirs:
        if not directory.is_dir():
            raise StageError(f"{directory}: stage directory not found")
        for path in sorted(directory.glob("*.toml")):
            stage = load_stage(path)
            if stage.id in stages:
                raise _fail(path, "id", f"duplicate stage id '{stage.id}' (also in {stages[stage.id].source})")
            stages[stage.id] = stage
    return sorted(stages.values(), key=lambda s: (s.order, s.id))
