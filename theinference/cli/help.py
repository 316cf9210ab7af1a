"""`--help` in click's conventions: UPPERCASE metavars, nothing after a flag, required arguments bare.

typer's own rich help (0.2x, with its vendored click) writes every value type in its Python
spelling (`<path>`, `<list[Path]>`), gives every flag a type although a flag takes no value
(`--all <bool>`, `--help <bool>`), and braces required arguments in the usage line (`{DIR}`).
Our options each name their metavar (PATH, DIR, FILE, ID, N, SECONDS, MB, SEED); `apply` makes
the rest (flags, arguments, typer's completion options) follow the same style. On a typer
without these methods (older releases already follow click) it changes nothing.
"""

from collections.abc import Callable
from typing import Any

from typer.core import TyperArgument, TyperOption

_TYPER_OPTION_TYPE: Callable[..., Any] | None = getattr(
    TyperOption, "display_type_rich", None
)  # typer's own, kept for options without a metavar


def _option_type(self, ctx) -> str | None:
    """What follows an option in --help: nothing for a flag, its metavar, else click's spelling."""
    if self.is_flag:
        return None
    if self.metavar is not None:
        return self.metavar
    assert _TYPER_OPTION_TYPE is not None  # apply() installs this only where typer has it
    label = _TYPER_OPTION_TYPE(self, ctx).strip("<>")
    if label.startswith("list[") and label.endswith("]"):
        label = label[len("list[") : -1]
    return f"[{label}]" if "|" in label else label.split()[0].upper()


def _argument_type(self, ctx) -> None:
    """Nothing beside an argument: its metavar, in the name column, says what it is."""
    return None


def _argument_usage(self) -> str:
    """An argument in the usage line as click writes it: DIR when required, [DIR] when not."""
    name = self.display_name_raw
    if self.nargs != 1 and not name.endswith("..."):
        name += "..."
    return name if self.required else f"[{name}]"


def apply() -> None:
    """Install the conventions on typer's parameter classes (idempotent)."""
    if _TYPER_OPTION_TYPE is None or not hasattr(TyperArgument, "_usage_display_name"):
        return
    # Replacing methods of typer's classes is the point here (there is no hook for these conventions).
    TyperOption.display_type_rich = _option_type  # type: ignore[method-assign]
    TyperArgument.display_type_rich = _argument_type  # type: ignore[method-assign]
    TyperArgument._usage_display_name = _argument_usage  # type: ignore[method-assign]
