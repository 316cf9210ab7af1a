"""The mutant gallery: minimal edits to the reference solution, each reproducing one classic bug.

course/mutants/<name>/manifest.toml:

  description  str, the bug in one sentence
  [[edit]]     file (relative to the solution), find (text occurring exactly once), replace
  [expect]     stage id -> the diagnosis shape that stage must show when it fails, or a list
               of shapes when the bug's shape is genuinely ambiguous for that stage (e.g. an
               error that grows, then saturates); "fail" accepts any failing shape (where the
               fingerprint is the assertion), "pass" a bug that may not show at that stage's
               tolerance on some weights; every stage not named here must pass.
               `no-cache` is cache-scaling's shape: right outputs whose cost grows with position
  [fingerprint] stage id -> the known bug the stage's fingerprint must name when it fails, or
               a list of bugs when several give the same output there (all must be named)
               Besides the diagnosis shapes, "wrong-shape" names a failure whose output has
               the wrong shape or length (e.g. a greedy loop that stops early), and "error" an
               exception the bug makes the solution raise (e.g. state left over between calls)
"""

import shutil
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from theinference.grading.spec.shapes import SHAPES
from theinference.errors import ConfigError

OBSERVABLES = (*SHAPES, "wrong-shape", "error", "pass", "fail")  # what a manifest may expect of a stage


class MutantError(ConfigError):
    """A manifest is invalid or its edit no longer applies to the solution."""


@dataclass(frozen=True)
class Edit:
    file: str
    find: str
    replace: str


@dataclass(frozen=True)
class Mutant:
    name: str
    description: str
    edits: tuple[Edit, ...]
    expect: dict  # stage id -> tuple of acceptable shapes
    source: Path
    fingerprint: dict = field(default_factory=dict)  # stage id -> the set of bug names it must name


def _check_table(path: Path, where: str, table: dict, fields: dict) -> None:
    for key in table:
        if key not in fields:
            raise MutantError(f"{path}: field '{where}{key}': unknown field (known: {', '.join(fields)})")
    for key, kind in fields.items():
        if not isinstance(table.get(key), kind):
            raise MutantError(f"{path}: field '{where}{key}': missing or not a {kind.__name__}")


def load_mutant(path: Path) -> Mutant:
    """Parse and validate one manifest.toml."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8-sig"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise MutantError(f"{path}: cannot read: {e}") from e
    fingerprint = _fingerprint(path, data.pop("fingerprint", {}))
    _check_table(path, "", data, {"description": str, "edit": list, "expect": dict})
    edits = []
    for i, raw in enumerate(data["edit"]):
        if not isinstance(raw, dict):
            raise MutantError(f"{path}: field 'edit[{i}]': each [[edit]] must be a table")
        _check_table(path, f"edit[{i}].", raw, {"file": str, "find": str, "replace": str})
        edits.append(Edit(raw["file"], raw["find"], raw["replace"]))
    expect = {}
    for stage_id, shapes in data["expect"].items():
        shapes = (shapes,) if isinstance(shapes, str) else tuple(shapes) if isinstance(shapes, list) else (None,)
        for shape in shapes:
            if shape not in OBSERVABLES:
                raise MutantError(
                    f"{path}: field 'expect.{stage_id}': unknown shape {shape!r} (known: {', '.join(OBSERVABLES)})"
                )
        expect[stage_id] = shapes
    return Mutant(
        name=path.parent.name,
        description=data["description"],
        edits=tuple(edits),
        expect=expect,
        source=path,
        fingerprint=fingerprint,
    )


def _fingerprint(path: Path, table) -> dict:
    if not isinstance(table, dict):
        raise MutantError(f"{path}: field 'fingerprint': must be a table of stage id -> bug name(s)")
    names = {}
    for stage_id, bugs in table.items():
        bugs = [bugs] if isinstance(bugs, str) else bugs
        if not isinstance(bugs, list) or not bugs or not all(isinstance(b, str) for b in bugs):
            raise MutantError(f"{path}: field 'fingerprint.{stage_id}': expected a bug name or a list of them")
        names[stage_id] = frozenset(bugs)
    return names


def load_mutants(directory: Path) -> list[Mutant]:
    """Every `<name>/manifest.toml` below directory, by name; none if the directory is absent."""
    if not directory.is_dir():
        return []
    return [load_mutant(p) for p in sorted(directory.glob("*/manifest.toml"))]


def gather_mutants(directory: Path, names: list[str] | None = None) -> tuple[list[Mutant], list[str]]:
    """The mutants below directory that load (only those named, if names are given), and one error per
    manifest that does not: one broken manifest never hides the others."""
    paths = sorted(directory.glob("*/manifest.toml")) if directory.is_dir() else []
    if names:
        known = {p.parent.name: p for p in paths}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise MutantError(
                f"--mutant {', '.join(unknown)}: no such mutant in {directory} (there: {', '.join(known) or 'none'})"
            )
        paths = [known[n] for n in dict.fromkeys(names)]
    mutants, errors = [], []
    for path in paths:
        try:
            mutants.append(load_mutant(path))
        except MutantError as e:
            errors.append(str(e))
    return mutants, errors


def check_manifest(mutant: Mutant, stages: dict) -> list[str]:
    """The manifest's mistakes against the stages it can be checked on (stage id -> StageSpec), file and field named:
    a stage id no stage has, or a fingerprint bug its stage does not list in `bugs` (it could never be named)."""
    problems = []
    for where, table in (("expect", mutant.expect), ("fingerprint", mutant.fingerprint)):
        for stage_id in table:
            if stage_id not in stages:
                problems.append(
                    f"{mutant.source}: field '{where}.{stage_id}': unknown stage '{stage_id}' "
                    f"(stages: {', '.join(stages)})"
                )
    for stage_id, bugs in mutant.fingerprint.items():
        if stage_id in stages:
            listed = stages[stage_id].bugs
            for bug in sorted(set(bugs) - set(listed)):
                problems.append(
                    f"{mutant.source}: field 'fingerprint.{stage_id}': bug '{bug}' is not among the bugs stage "
                    f"'{stage_id}' fingerprints ({', '.join(listed) or 'none'}; its file: {stages[stage_id].source})"
                )
    return problems


def build_mutant(mutant: Mutant, solution: Path, dest: Path) -> Path:
    """Copy the solution to dest and apply the mutant's edits; each `find` must occur exactly once.

    A TypeScript solution's node_modules (its own or the nearest above it, which holds tsx) is linked, not copied.
    """
    shutil.copytree(solution, dest, ignore=shutil.ignore_patterns("__pycache__", "node_modules"))
    modules = next((d / "node_modules" for d in (solution, *solution.parents) if (d / "node_modules").is_dir()), None)
    if (solution / "package.json").is_file() and modules is not None:
        (dest / "node_modules").symlink_to(modules.resolve(), target_is_directory=True)
    for edit in mutant.edits:
        target = dest / edit.file
        if not target.is_file():
            raise MutantError(f"{mutant.source}: edit names '{edit.file}', which the solution does not have")
        text = target.read_text()
        count = text.count(edit.find)
        if count != 1:
            raise MutantError(
                f"{mutant.source}: the text to find occurs {count} times in {edit.file} (must be exactly once): {edit.find!r}"
            )
        target.write_text(text.replace(edit.find, edit.replace))
    return dest


@dataclass(frozen=True)
class Proposal:
    """An expectation `stages check` saw for a stage a manifest is silent about: a line to add, for review."""

    mutant: Mutant
    stage: str
    expect: str  # what the stage showed: its diagnosis shape, "wrong-shape" or "error"
    bugs: tuple[str, ...] = ()  # the known bugs its fingerprint named there (none: no [fingerprint] line)

    def lines(self) -> list[tuple[str, str]]:
        """(table, TOML line) pairs."""
        found = [("expect", f'{self.stage} = "{self.expect}"')]
        if self.bugs:
            value = f'"{self.bugs[0]}"' if len(self.bugs) == 1 else "[" + ", ".join(f'"{b}"' for b in self.bugs) + "]"
            found.append(("fingerprint", f"{self.stage} = {value}"))
        return found


def write_proposals(proposals: list[Proposal]) -> list[Path]:
    """Add each proposal's lines to its manifest, under [expect] and [fingerprint]; the manifests written.

    A manifest that would no longer load as written is left as it was (MutantError names it).
    """
    by_manifest: dict[Path, list[Proposal]] = {}
    for proposal in proposals:
        by_manifest.setdefault(proposal.mutant.source, []).append(proposal)
    written = []
    for path, found in sorted(by_manifest.items()):
        original = path.read_text(encoding="utf-8-sig")
        text = original
        for table, line in (pair for p in found for pair in p.lines()):
            text = _add_line(text, table, f"{line}  # proposed by `stages check --propose`: review it")
        path.write_text(text, encoding="utf-8")
        try:
            load_mutant(path)
        except MutantError:
            path.write_text(original, encoding="utf-8")
            raise
        written.append(path)
    return written


def _add_line(text: str, table: str, line: str) -> str:
    """text with line as the first entry of [table] (the table appended when the manifest has none)."""
    lines = text.splitlines()
    header = next((i for i, t in enumerate(lines) if t.strip() == f"[{table}]"), None)
    if header is None:
        return text.rstrip("\n") + f"\n\n[{table}]\n{line}\n"
    return "\n".join([*lines[: header + 1], line, *lines[header + 1 :]]) + "\n"
