"""Which weights to grade against, and why: --weights > env > theinference.toml > HF cache > synthetic."""

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from theinference import WEIGHTS_ENV
from theinference.model.synth import PRESETS, SYNTH_VERSION, preset_problem, write_synthetic
from theinference.model.weights import Model, load_model

HF_REPOS = ("models--openai-community--gpt2", "models--gpt2")
DEFAULT_SYNTH = ("gpt2", 0)  # preset, seed of the checkpoint made on first use
CHOICE_ORDER = f"--weights > ${WEIGHTS_ENV} > theinference.toml > Hugging Face cache > synthetic GPT-2 shape"


@dataclass(frozen=True)
class WeightsChoice:
    path: Path
    source: str  # --weights | synthetic-preset | THEINFERENCE_WEIGHTS | theinference.toml | huggingface-cache | default-synthetic
    why: str
    preset: str = ""  # synthetic-preset and default-synthetic: the preset made on first use


def hf_hub_dir(environ=os.environ) -> Path:
    """The Hugging Face hub cache: $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub."""
    if environ.get("HF_HUB_CACHE"):
        return Path(environ["HF_HUB_CACHE"])
    if environ.get("HF_HOME"):
        return Path(environ["HF_HOME"]) / "hub"
    return Path.home() / ".cache" / "huggingface" / "hub"


def find_hf_gpt2(environ=os.environ) -> Path | None:
    """model.safetensors of GPT-2 in the HF cache (refs/main -> snapshots/<rev>/), if present."""
    hub = hf_hub_dir(environ)
    for repo in HF_REPOS:
        ref = hub / repo / "refs" / "main"
        if ref.is_file():
            candidate = hub / repo / "snapshots" / ref.read_text().strip() / "model.safetensors"
            if candidate.is_file():
                return candidate
    return None


def user_cache_dir(environ=os.environ) -> Path:
    """Where theinference keeps what it makes: $THEINFERENCE_CACHE, else $XDG_CACHE_HOME/theinference."""
    if environ.get("THEINFERENCE_CACHE"):
        return Path(environ["THEINFERENCE_CACHE"])
    base = Path(environ["XDG_CACHE_HOME"]) if environ.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return base / "theinference"


def synthetic_path(preset: str, environ=os.environ) -> Path:
    """Where a synthetic preset's checkpoint is made on first use (seed as DEFAULT_SYNTH's)."""
    return user_cache_dir(environ) / f"synthetic-{preset}-seed{DEFAULT_SYNTH[1]}-v{SYNTH_VERSION}" / "model.safetensors"


def default_synthetic_path(environ=os.environ) -> Path:
    return synthetic_path(DEFAULT_SYNTH[0], environ)


def _preset(name: str, given_by: str, environ) -> WeightsChoice | None:
    """`tiny` or `gpt2` (given with --weights or $THEINFERENCE_WEIGHTS): that synthetic preset, made on first
    use; None for anything else, or when a file or directory of that name exists (it wins)."""
    if name not in PRESETS or Path(name).exists():
        return None
    why = f"{given_by} {name}: the synthetic {name} preset, made on first use"
    return WeightsChoice(synthetic_path(name, environ), "synthetic-preset", why, name)


def resolve_weights(
    cli_path: str | None, course_weights: Path | None, environ=os.environ, course_setting: str | None = None
) -> WeightsChoice:
    """Pick the weights by the documented order; the default synthetic file may not exist yet.

    course_setting: the course's `weights` as written; a preset's name there alone (`tiny`) is that preset
    unless the course holds a file or directory of that name (`models/tiny` is always a path)."""
    # Paths are made absolute, never resolved: config.json is read beside a symlink, not beside its target.
    if cli_path:
        return _preset(cli_path, "--weights", environ) or WeightsChoice(
            Path(cli_path).expanduser().absolute(), "--weights", "given with --weights"
        )
    if environ.get(WEIGHTS_ENV):
        given = environ[WEIGHTS_ENV]
        return _preset(given, f"${WEIGHTS_ENV}", environ) or WeightsChoice(
            Path(given).expanduser().absolute(), WEIGHTS_ENV, f"${WEIGHTS_ENV} is set"
        )
    if course_weights is not None:
        # `weights = "tiny"`: the preset, as --weights tiny (a file or directory of that name in the course wins)
        if course_setting in PRESETS and not course_weights.exists():
            name = course_setting
            why = f"the course's theinference.toml: weights = {name!r}, the synthetic {name} preset, made on first use"
            return WeightsChoice(synthetic_path(name, environ), "theinference.toml", why, name)
        return WeightsChoice(course_weights.absolute(), "theinference.toml", "set in the course's theinference.toml")
    hf = find_hf_gpt2(environ)
    if hf is not None:
        return WeightsChoice(hf, "huggingface-cache", "real GPT-2 found in the Hugging Face cache")
    return WeightsChoice(
        default_synthetic_path(environ),
        "default-synthetic",
        "no weights configured: synthetic GPT-2-shape weights",
        DEFAULT_SYNTH[0],
    )


def obtain_weights(
    cli_path: str | None,
    course_weights: Path | None,
    progress: Callable[..., None] | None = None,
    untrusted: bool = False,
    course_setting: str | None = None,
) -> tuple[WeightsChoice, Model, bool]:
    """Resolve, make if it is a missing or altered preset, and load: (choice, model, whether it was made).

    A preset found altered is made again, and the model's notices say so (untrusted is kept for the callers'
    sake: an altered preset is never used, trusted or not)."""
    choice = resolve_weights(cli_path, course_weights, os.environ, course_setting)
    notices: list[str] = []
    made = ensure_weights(choice, progress, untrusted, notices)
    model = load_model(choice.path)
    model.notices[:0] = notices
    return choice, model, made


def ensure_weights(
    choice: WeightsChoice,
    progress: Callable[..., None] | None = None,
    untrusted: bool = False,
    notices: list[str] | None = None,
) -> bool:
    """Make a synthetic preset if it is the choice and missing or altered; True if it was made. Why an altered one
    was made again goes into notices.

    A preset is made in a cache any process of this user may write, a student's included (at the levels without a
    sandbox, or in an earlier plain `test`): it is used only once its bytes are the ones the preset makes
    (preset_problem), never as found. One found altered is made again, trusted or not: grading goes on, on the
    preset's true bytes, and says so."""
    if not choice.preset:
        return False
    if choice.path.is_file() or choice.path.is_symlink():
        problem = preset_problem(choice.path, choice.preset, DEFAULT_SYNTH[1])
        if problem is None:
            return False
        if notices is not None:
            notices.append(
                f"the {choice.preset} preset at {choice.path} was altered since it was made ({problem}): made it "
                "again, and graded on what it makes"
                + (" (untrusted grading never uses it as found)" if untrusted else "")
            )
    _clear(choice.path)
    write_synthetic(choice.path.parent, preset=choice.preset, seed=DEFAULT_SYNTH[1], progress=progress)
    return True


def _clear(path: Path) -> None:
    """A directory planted where the preset's file goes is removed (in the user's own cache): a file replaces a link
    or another file, never a directory."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
