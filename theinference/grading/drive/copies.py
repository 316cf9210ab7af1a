"""Copies made visible: a submission whose code is the bundled reference solution's, or another submission's.

The reference solution ships inside the package (`theinference/_data/course/solution`), so a
submission can simply be a copy of it, and two submissions can be one. `grade` flags both (a
column in the CSV, a field in the JSON); it never changes a score: a person looks.

Each `.py` file under a submission's `src/` is normalised first: comments, blank lines and the
amount of whitespace are dropped (indentation is kept as structure), every string literal counts
as the same, and identifiers are renamed in order of first appearance, so renaming variables or
re-wrapping lines does not hide a copy. Files the starter already holds, and files with almost no
code, are not compared. `tests/adapters.py` is glue written much the same way by everyone, so it
is not compared either.
"""

import hashlib
import io
import keyword
import tokenize
from dataclasses import dataclass
from pathlib import Path

from theinference.bundled import data_dir

SOLUTION = "reference-solution"
_MIN_TOKENS = 40  # a file with fewer normalised tokens is too small to call a copy
_SKIPPED = {tokenize.COMMENT, tokenize.NL, tokenize.ENCODING, tokenize.ENDMARKER}


@dataclass(frozen=True)
class Copy:
    """A submission's files that are, once normalised, files of `of` (SOLUTION or another submission's id)."""

    of: str
    files: tuple[str, ...]


def normalised(source: str) -> str | None:
    """The source's token stream with names, strings, comments and spacing made uniform; None if it is not Python."""
    names: dict[str, str] = {}
    out = []
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type in _SKIPPED:
                continue
            if token.type == tokenize.NAME and not keyword.iskeyword(token.string):
                out.append(names.setdefault(token.string, f"n{len(names)}"))
            elif token.type == tokenize.STRING or token.type in _fstring_types():
                out.append("S")
            else:
                out.append(token.string if token.type == tokenize.OP else tokenize.tok_name[token.type])
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return None
    return " ".join(out) if len(out) >= _MIN_TOKENS else None


def _fstring_types() -> set[int]:
    return {
        getattr(tokenize, name)
        for name in ("FSTRING_START", "FSTRING_MIDDLE", "FSTRING_END")
        if hasattr(tokenize, name)
    }


def code_digests(course: Path) -> dict[str, str]:
    """Normalised digest of each comparable file under course/src, by its path relative to course."""
    found: dict[str, str] = {}
    src = course / "src"
    if not src.is_dir():
        return found
    for path in sorted(src.rglob("*.py")):
        if path.is_symlink() or not path.is_file():
            continue
        try:
            text = normalised(path.read_text(encoding="utf-8", errors="replace"))
        except OSError:
            continue
        if text is not None:
            found[path.relative_to(course).as_posix()] = hashlib.sha256(text.encode()).hexdigest()
    return found


def find_copies(
    courses: dict[str, Path], solution: Path | None = None, starter: Path | None = None
) -> dict[str, list[Copy]]:
    """For each submission id, the copies found: of the reference solution, then of other submissions (by id)."""
    bundled = data_dir("course")
    solution = solution if solution is not None else bundled / "solution"
    starter = starter if starter is not None else bundled / "starter"
    given = set(code_digests(starter).values()) if starter.is_dir() else set()
    reference = {d: f for f, d in code_digests(solution).items()} if solution.is_dir() else {}
    digests = {
        sub_id: {f: d for f, d in code_digests(path).items() if d not in given} for sub_id, path in courses.items()
    }
    owners: dict[str, list[str]] = {}
    for sub_id, files in digests.items():
        for digest in set(files.values()):
            owners.setdefault(digest, []).append(sub_id)
    copies: dict[str, list[Copy]] = {}
    for sub_id, files in sorted(digests.items()):
        found = []
        of_solution = tuple(f for f, d in files.items() if d in reference)
        if of_solution:
            found.append(Copy(SOLUTION, of_solution))
        shared: dict[str, list[str]] = {}
        for f, d in files.items():
            if d in reference:
                continue
            for other in owners.get(d, []):
                if other != sub_id:
                    shared.setdefault(other, []).append(f)
        found += [Copy(other, tuple(fs)) for other, fs in sorted(shared.items())]
        if found:
            copies[sub_id] = found
    return copies


def describe(copies: list[Copy]) -> str:
    """One spreadsheet cell: 'reference-solution: src/kvcache.py; alice: src/gpt2.py'."""
    return "; ".join(f"{c.of}: {' '.join(c.files)}" for c in copies)
