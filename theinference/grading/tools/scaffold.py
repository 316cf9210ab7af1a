"""`stages new`: the files of a new stage (stage file, oracle, lesson) that load as they are."""

from pathlib import Path

from theinference.grading.spec.inputs import described
from theinference.grading.spec.stages import StageError, StageSpec, valid_id

STAGE = """\
# Stage {id}: every field is described in docs/authoring.md.
format_version = 1
id = "{id}"
title = "TODO: one line saying what this stage proves"
order = {order}
lesson = "lessons/{id}.md"
adapter = "{adapter}"
oracle = "{oracle_file}:{func}"
inputs = ["seq"]  # allowed: {allowed}
compare = "rows"
timeout = 60
points = 5

[tolerance]
atol = 1e-4
rtol = 1e-3

[hints]
all-rows-off = "TODO: the suspects when every row is off."

[[case]]
name = "one-token"
seq = [464]

[[case]]
name = "sentence"
seq = "The quick brown fox jumps over the lazy dog."
"""

ORACLE = '''\
"""The oracle of stage {id}: what {adapter}() must return, computed from the weights."""

from theinference.model import gpt2 as oracle


def {func}(model, seq):
    """seq: [n_seq] token ids -> [n_seq, n_embd]: TODO (this template returns the input embeddings)."""
    # model.params is nested like the checkpoint keys (model.params["wte"]["weight"], model.params["h"][0]["ln_1"]["bias"]);
    # model.config is an object, not a dict: model.config.n_head, .n_embd, .n_layer, .n_ctx, .n_vocab.
    return oracle.embed(model.params, seq)
'''

LESSON = """\
# {id}

TODO: what the student builds in this stage, why, and how `{adapter}` is graded.

`theinference stages show {id}` shows this lesson; `theinference test --stage {id}` grades it.
"""

SOLUTION_ADAPTER = '''\
def {adapter}(seq_ids):
    """Stage {id}. seq_ids: [n] -> [n, n_embd]."""
    from src.gpt2 import embed
    params, n_head = _model()
    return embed(params, seq_ids)
'''

STARTER_ADAPTER = '''\
def {adapter}(seq_ids):
    """Stage {id}. seq_ids: [n] -> [n, n_embd]: TODO say what the student returns."""
    raise NotImplementedError("{adapter}")
'''


def stage_names(stage_id: str) -> dict:
    """The names a new stage's files use: adapter run_<id>, oracle function and file <id>_oracle.py."""
    func = stage_id.replace("-", "_")
    return {"id": stage_id, "func": func, "adapter": f"run_{func}", "oracle_file": f"{func}_oracle.py"}


def scaffold_stage(directory: Path, stage_id: str, existing: list[StageSpec]) -> list[Path]:
    """Write stage file, oracle and lesson stub for stage_id into directory; refuse to overwrite anything."""
    if not valid_id(stage_id):
        raise StageError(f"'{stage_id}' is not a stage id: use lowercase words joined by '-', e.g. mlp-sublayer")
    taken = next((s for s in existing if s.id == stage_id), None)
    if taken is not None:
        raise StageError(f"a stage '{stage_id}' already exists: {taken.source}")
    names = stage_names(stage_id)
    order = max((s.order for s in existing), default=0) + 10
    files = {
        directory / f"{stage_id}.toml": STAGE.format(order=order, allowed=described(), **names),
        directory / names["oracle_file"]: ORACLE.format(**names),
        directory / "lessons" / f"{stage_id}.md": LESSON.format(**names),
    }
    present = [str(p) for p in files if p.exists()]
    if present:
        raise StageError(f"not overwriting {', '.join(present)}")
    try:
        for path, text in files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    except OSError as e:  # e.g. a read-only or missing parent: the user's to fix, not a grader bug
        raise StageError(f"cannot write the stage into {directory}: {e}") from e
    return list(files)


def adapter_snippets(stage_id: str) -> tuple[str, str]:
    """(solution, starter) adapter functions to add to each course's tests/adapters.py."""
    names = stage_names(stage_id)
    return SOLUTION_ADAPTER.format(**names), STARTER_ADAPTER.format(**names)
