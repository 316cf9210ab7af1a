"""`theinference weights`: show, make and inspect GPT-2 checkpoints."""

import os
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from theinference.cli.common import synth_progress
from theinference.cli.consoles import console_for, err_console
from theinference.sizes import size_text
from theinference.course import find_course
from theinference.model.weights_choice import CHOICE_ORDER, resolve_weights
from theinference.model.synth import PRESETS, write_synthetic
from theinference.model.weights import (
    GPT2Config,
    expected_shapes,
    inspect_checkpoint,
    locate_checkpoint,
    synthetic_description,
)
from theinference.cli.options import WeightsOpt

weights_app = typer.Typer(
    help="Which weights `test` would use, and why (without a subcommand); make and inspect GPT-2 weights.",
    invoke_without_command=True,
)


class Preset(str, Enum):
    gpt2 = "gpt2"
    tiny = "tiny"


@weights_app.callback()
def which(ctx: typer.Context, weights: WeightsOpt = None) -> None:
    """Without a subcommand: which weights `test` would grade against, from where, and why."""
    if ctx.invoked_subcommand is not None:
        return
    course = find_course(None)
    choice = resolve_weights(
        weights, course.weights if course else None, os.environ, course.weights_setting if course else None
    )
    console = console_for(sys.stdout)
    console.print(f"weights:   {choice.path}", soft_wrap=True)
    console.print(f"why:       {choice.why} (source: {choice.source})", soft_wrap=True)
    console.print(f"order:     {CHOICE_ORDER}", soft_wrap=True)
    if choice.preset and not choice.path.is_file():  # a synthetic preset (the default too) not made yet
        console.print("file:      not made yet: `theinference test` makes it on first use")
        return
    path = _print_summary(choice.path, console)[0]
    console.print(f"tensors:   theinference weights info {path}", soft_wrap=True)


@weights_app.command()
def synth(
    out: Annotated[
        Path, typer.Option("--out", metavar="DIR", help="Directory to write model.safetensors and config.json into.")
    ],
    preset: Annotated[
        Preset, typer.Option("--preset", help="gpt2: the 124M shape; tiny: 2 layers, 128 wide.")
    ] = Preset.tiny,
    seed: Annotated[int, typer.Option("--seed", metavar="SEED", help="Same seed, same bytes.")] = 0,
) -> None:
    """Write a deterministic synthetic GPT-2-layout checkpoint (model.safetensors + config.json)."""
    path = write_synthetic(out, preset=preset.value, seed=seed, progress=synth_progress())
    c = PRESETS[preset.value]
    err_console().print(
        f"wrote {path} ({preset.value}: n_layer {c.n_layer}, n_head {c.n_head}, n_embd {c.n_embd}, "
        f"n_ctx {c.n_ctx}, n_vocab {c.n_vocab}; seed {seed})"
    )


def _print_summary(path: Path, console) -> tuple[Path, dict, GPT2Config]:
    """Print a checkpoint's file, origin and config (checking every tensor is there); return what was read."""
    path = locate_checkpoint(path)
    entries, config, _ = inspect_checkpoint(path)
    synthetic = synthetic_description(path)
    console.print(f"file:      {path} ({size_text(path.stat().st_size)})", soft_wrap=True)
    console.print(f"synthetic: {synthetic or 'no (real or third-party weights)'}")
    console.print("config:    " + " · ".join(f"{k} {v}" for k, v in config.as_dict().items()))
    return path, entries, config


def _print_info(path: Path) -> None:
    console = console_for(sys.stdout)
    path, entries, config = _print_summary(path, console)
    table = Table(show_edge=False)
    for column in ("tensor", "shape", "dtype"):
        table.add_column(column)
    for name in expected_shapes(config):
        table.add_row(name, str(entries[name]["shape"]), entries[name]["dtype"])
    console.print(table)


@weights_app.command()
def info(path: Annotated[Path, typer.Argument(metavar="PATH", help="model.safetensors or its directory.")]) -> None:
    """Print a checkpoint's config and tensor table (and check every tensor is there)."""
    _print_info(path)
