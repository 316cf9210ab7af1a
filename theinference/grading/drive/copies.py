"""Copies made visible: a submission whose code is largely the reference solution's, or another submission's.

The reference solution ships inside the package (`theinference/_data/course/solution`), so a
submission can simply be a copy of it, and two submissions can be one. `grade` flags both (a
column in the CSV, a field in the JSON, a table in the class report); it never changes a score:
a person looks.

The comparison is the one MOSS and copydetect make (winnowing, Schleimer, Wilkerson and Aiken,
SIGMOD 2003), on tokens made blind to what a copier changes cheaply:

- comments, docstrings, blank lines and all spacing are dropped; every string literal is `S`;
  numbers are compared by value (`1e-5` is `0.00001`);
- every local name (variables, parameters, functions, classes, imports) is the one token `V`,
  so no renaming, consistent or not, changes a token; what a copier cannot rename stays as
  written: attributes (`x.mean`), keyword arguments (`keepdims=`), language keywords and
  builtins, so `mean = x.mean()` and `mu = x.mean()` are the same code, and the API a file uses
  still tells two files apart;
- the token stream is cut into k-grams, hashed, and winnowed: each window of W hashes keeps
  its smallest, so any passage of K + W - 1 tokens the two share is found wherever it sits
  (reordered functions move passages, they do not hide them).

A submission's fingerprints are those of every source file it holds (`tests/adapters.py`
included, Python and the TypeScript edition's files alike), minus those of the starter code,
which everyone was given. Its similarity to another is the share of its own fingerprints found
in the other's (between two submissions, of those not in the reference solution: two copies of the
reference are each flagged as that, not as each other's); a pair is flagged when either side's share
reaches THRESHOLD (measured on
disguised copies and independent solutions: tests/test_copies.py). The text compared is read
when the submission is graded (`read_code`), not at the end of the batch.

A batch graded in shards (`grade --shard I/N`) is compared across them when merged: each row of a shard file
carries the submission's fingerprints (`encode_prints`: hashes and the lines they cover, never the source), and
`grade merge` finds the pairs from them as one batch would (`pairs`); a pair across shards has the lines of its
passages, not their text.

A maintained library (copydetect) does the same winnowing, but renames attributes and keywords
like any other name, works on files on disk rather than on the text as graded, and would bring
pygments, jinja2 and tqdm into the grader: this module is the part of it the grader needs.
"""

import base64
import bisect
import functools
import hashlib
import json
import os
import re
import zlib
import builtins
import keyword
from dataclasses import dataclass
from pathlib import Path

from theinference.bundled import data_dir

SOLUTION = "reference-solution"
K = 12  # tokens per k-gram: shorter runs (one idiom, `x.max(axis=-1, keepdims=True)`) are everyone's
WINDOW = 8  # winnowing window: a shared run of K + WINDOW - 1 = 19 tokens is always found
THRESHOLD = 0.5  # share of a submission's own fingerprints found in the other's (see tests/test_copies.py)
MIN_SHARED = 12  # fewer shared fingerprints than this is never a copy, whatever the share
_MAX_REGIONS, _EXCERPT_LINES = 8, 12

SOURCE_SUFFIXES = (".py", ".ts", ".mts", ".cts", ".js", ".mjs", ".cjs")
_SKIPPED_DIRS = {"node_modules", "__pycache__", "venv", "site-packages", "dist", "build"}
_MAX_FILE_BYTES, _MAX_FILES, _MAX_TOTAL_BYTES = 512 * 1024, 300, 4 * 1024 * 1024


@dataclass(frozen=True)
class CodeSnapshot:
    """The source files of a submission as they were when it was graded: (path relative to its root, text)."""

    files: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Region:
    """A passage of this submission's file (lines first..last) that the other holds at other_file's lines."""

    file: str
    lines: tuple[int, int]
    other_file: str
    other_lines: tuple[int, int]
    text: str = ""  # this submission's lines (at most _EXCERPT_LINES of them)
    other_text: str = ""


@dataclass(frozen=True)
class Copy:
    """Much of a submission's code is also `of`'s (SOLUTION or another submission's id)."""

    of: str
    files: tuple[str, ...]  # this submission's files holding the shared passages
    similarity: float = 1.0  # share of this submission's fingerprints found in `of`'s
    regions: tuple[Region, ...] = ()


def read_code(root: Path) -> CodeSnapshot:
    """Every source file under root (not through links, not in hidden or dependency directories), capped."""
    found: list[tuple[str, str]] = []
    total = 0
    for top, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in _SKIPPED_DIRS)
        for name in sorted(n for n in names if n.endswith(SOURCE_SUFFIXES)):
            path = Path(top) / name
            try:
                if path.is_symlink() or not path.is_file() or path.stat().st_size > _MAX_FILE_BYTES:
                    continue
                data = path.read_bytes()
            except OSError:
                continue
            total += len(data)
            if len(found) >= _MAX_FILES or total > _MAX_TOTAL_BYTES:
                return CodeSnapshot(tuple(found))
            found.append((path.relative_to(root).as_posix(), data.decode("utf-8", errors="replace").lstrip("\ufeff")))
    return CodeSnapshot(tuple(found))


# --- tokens -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Token:
    text: str  # as compared: V, S, a number's value, or the token as written
    line: int  # 1-based, where it starts
    end_line: int


_NUMBER = r"0[xXoObB][\da-fA-F_]+|(?:\d[\d_]*\.?[\d_]*|\.\d[\d_]*)(?:[eE][+-]?\d+)?[jJn]?"
_PY = re.compile(
    r"(?P<comment>\#[^\n]*)"
    r"|(?P<string>(?i:[rbuf]{0,2})(?:\"\"\"[\s\S]*?\"\"\"|'''[\s\S]*?'''|\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])*'))"
    rf"|(?P<number>{_NUMBER})"
    r"|(?P<name>[^\W\d]\w*)"
    r"|(?P<op>\*\*=?|//=?|->|:=|[=!<>]=|<<=?|>>=?|[-+*/%@&|^]=|\S)"
)
_JS = re.compile(
    r"(?P<comment>//[^\n]*|/\*[\s\S]*?\*/)"
    r"|(?P<string>\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])*'|`(?:\\.|[^`\\])*`)"
    rf"|(?P<number>{_NUMBER})"
    r"|(?P<name>[^\W\d][\w$]*|\$[\w$]*)"
    r"|(?P<op>===|!==|\*\*=?|=>|\?\?=?|\?\.|\.\.\.|[=!<>]=|&&|\|\||<<|>>>?|[-+*/%&|^]=|\+\+|--|\S)"
)
_PY_KEPT = frozenset(keyword.kwlist) | frozenset(keyword.softkwlist) | frozenset(dir(builtins))
_JS_KEPT = frozenset(
    "break case catch class const continue debugger default delete do else export extends false finally for "
    "function if import in instanceof let new null return super switch this throw true try typeof var void while "
    "with yield async await of as from type interface enum implements readonly number string boolean any unknown "
    "never undefined Math Array Float32Array Float64Array Number JSON Object Map Set console".split()
)
_OPENERS, _CLOSERS = "([{", ")]}"


def tokens(path: str, text: str) -> list[Token]:
    """The tokens of one file as the comparison sees them (see the module's docstring)."""
    python = path.endswith(".py")
    pattern, kept = (_PY, _PY_KEPT) if python else (_JS, _JS_KEPT)
    raw = [(m.lastgroup, m.group(), m.start(), m.end()) for m in pattern.finditer(text)]
    raw = [r for r in raw if r[0] != "comment"]
    starts = _line_starts(text)
    out: list[Token] = []
    brackets: list[str] = []
    for i, (kind, value, start, end) in enumerate(raw):
        line, end_line = _line(starts, start), _line(starts, max(start, end - 1))
        following = raw[i + 1] if i + 1 < len(raw) else None
        if kind == "op":
            if value in _OPENERS:
                brackets.append(value)
            elif value in _CLOSERS and brackets:
                brackets.pop()
            out.append(Token(value, line, end_line))
        elif kind == "string":
            if python and _alone(out, line, following, starts, end_line):  # a docstring: prose, like a comment
                continue
            out.append(Token("S", line, end_line))
        elif kind == "number":
            out.append(Token(_number(value), line, end_line))
        else:
            out.append(Token(value if _kept(value, kept, out, brackets, following) else "V", line, end_line))
    return out


def _kept(name: str, kept: frozenset[str], before: list[Token], brackets: list[str], following) -> bool:
    """Whether a name is one a copier cannot rename: a keyword or builtin, an attribute, a keyword argument."""
    if name in kept or (before and before[-1].text in (".", "?.")):
        return True
    next_op = following[1] if following is not None and following[0] == "op" else ""
    inner = brackets[-1] if brackets else ""
    return (next_op == "=" and inner == "(") or (next_op == ":" and inner == "{")


def _alone(before: list[Token], line: int, following, starts: list[int], end_line: int) -> bool:
    """A string that is a statement of its own: first on its line, nothing after it on its last line."""
    first = not before or before[-1].end_line < line
    return first and (following is None or _line(starts, following[2]) > end_line)


def _number(text: str) -> str:
    clean = text.replace("_", "").rstrip("nN")
    try:
        return repr(int(clean, 0)) if re.fullmatch(r"0[xXoObB][\da-fA-F]+|\d+", clean) else repr(float(clean))
    except ValueError:
        return text


def _line_starts(text: str) -> list[int]:
    return [0] + [m.end() for m in re.finditer("\n", text)]


def _line(starts: list[int], offset: int) -> int:
    return bisect.bisect_right(starts, offset)


# --- fingerprints -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Print:
    """Where one fingerprint sits: a file and its lines."""

    file: str
    lines: tuple[int, int]


def fingerprints(path: str, text: str) -> dict[int, Print]:
    """The winnowed k-gram hashes of one file, each with the first place it covers."""
    toks = tokens(path, text)
    hashes = [
        (_hash(toks[i : i + K]), Print(path, (toks[i].line, toks[i + K - 1].end_line)))
        for i in range(len(toks) - K + 1)
    ]
    chosen: dict[int, Print] = {}
    for start in range(max(1, len(hashes) - WINDOW + 1)):
        window = hashes[start : start + WINDOW]
        if not window:
            break
        # The rightmost smallest hash of the window (Schleimer et al.): the same choice wherever the passage sits.
        smallest = min(range(len(window)), key=lambda j: (window[j][0], -j))
        value, where = window[smallest]
        chosen.setdefault(value, where)
    return chosen


def _hash(gram: list[Token]) -> int:
    return int.from_bytes(hashlib.blake2b("\x1f".join(t.text for t in gram).encode(), digest_size=8).digest(), "big")


def code_prints(code: CodeSnapshot) -> dict[int, Print]:
    """A submission's fingerprints over all its files (the first place each is found)."""
    found: dict[int, Print] = {}
    for path, text in code.files:
        for value, where in fingerprints(path, text).items():
            found.setdefault(value, where)
    return found


# --- pairs ------------------------------------------------------------------------------------------------------


@functools.cache  # the bundled course does not change while the grader runs
def bundled_code(name: str) -> CodeSnapshot:
    """The bundled course's `solution` or `starter`, in both editions (Python, and TypeScript's under ts/)."""
    course = data_dir("course")
    files: list[tuple[str, str]] = []
    for root in (course / name, course / "ts" / name):
        if root.is_dir():
            files += read_code(root).files
    return CodeSnapshot(tuple(files))


def find_copies(
    code: dict[str, CodeSnapshot], solution: CodeSnapshot | None = None, starter: CodeSnapshot | None = None
) -> dict[str, list[Copy]]:
    """For each submission id, the copies found: of the reference solution, then of other submissions (by id)."""
    prints = {sub_id: code_prints(c) for sub_id, c in code.items()}
    return pairs(prints, {sub_id: dict(c.files) for sub_id, c in code.items()}, solution, starter)


def pairs(
    prints: dict[str, dict[int, Print]],
    texts: dict[str, dict[str, str]] | None = None,
    solution: CodeSnapshot | None = None,
    starter: CodeSnapshot | None = None,
) -> dict[str, list[Copy]]:
    """find_copies() from each submission's fingerprints (code_prints); texts (id -> path -> text), where known, give
    the regions' excerpts."""
    texts = texts or {}
    given = set(code_prints(starter if starter is not None else bundled_code("starter")))
    solution = solution if solution is not None else bundled_code("solution")
    reference = _own(code_prints(solution), given)
    own = {sub_id: _own(found, given) for sub_id, found in prints.items()}
    # Between submissions only what is not the reference's counts: two copies of it are each flagged as that.
    beyond = {sub_id: _own(found, set(reference)) for sub_id, found in own.items()}
    holders: dict[int, set[str]] = {}
    for owner, found in beyond.items():
        for value in found:
            holders.setdefault(value, set()).add(owner)
    solution_texts = dict(solution.files)
    copies: dict[str, list[Copy]] = {}
    for sub_id in sorted(prints):
        flagged = []
        mine = texts.get(sub_id, {})
        if _flagged(own[sub_id], reference):
            flagged.append(_copy(SOLUTION, own[sub_id], reference, mine, solution_texts))
        for other in sorted(set().union(*(holders[v] for v in beyond[sub_id])) - {sub_id}):
            if _flagged(beyond[sub_id], beyond[other]):
                flagged.append(_copy(other, beyond[sub_id], beyond[other], mine, texts.get(other, {})))
        if flagged:
            copies[sub_id] = flagged
    return copies


PRINTS_FORMAT = "tp1"  # the first field of an encoded set of fingerprints: what decode_prints reads


def encode_prints(found: dict[int, Print]) -> str:
    """A submission's fingerprints as one line of text for a shard file (no source in it): 'tp1:' + base64."""
    files = sorted({p.file for p in found.values()})
    index = {f: i for i, f in enumerate(files)}
    rows = [[f"{v:016x}", index[p.file], p.lines[0], p.lines[1]] for v, p in sorted(found.items())]
    packed = zlib.compress(json.dumps({"files": files, "prints": rows}, separators=(",", ":")).encode(), 9)
    return f"{PRINTS_FORMAT}:" + base64.b64encode(packed).decode("ascii")


def decode_prints(text: str) -> dict[int, Print]:
    """encode_prints() read back; ValueError says what is wrong with text."""
    kind, _, body = text.partition(":")
    if kind != PRINTS_FORMAT:
        raise ValueError(f"not fingerprints of format {PRINTS_FORMAT} (it starts {text[:8]!r})")
    try:
        data = json.loads(zlib.decompress(base64.b64decode(body, validate=True)))
        files = [str(f) for f in data["files"]]
        return {int(v, 16): Print(files[i], (int(a), int(b))) for v, i, a, b in data["prints"]}
    except (ValueError, TypeError, KeyError, IndexError, zlib.error, RecursionError) as e:
        raise ValueError(f"damaged fingerprints: {e}") from None


def _own(found: dict[int, Print], given: set[int]) -> dict[int, Print]:
    """found without the fingerprints in given."""
    return {v: p for v, p in found.items() if v not in given}


def _flagged(mine: dict[int, Print], theirs: dict[int, Print]) -> bool:
    shared = len(mine.keys() & theirs.keys())
    return shared >= MIN_SHARED and max(shared / len(mine), shared / max(1, len(theirs))) >= THRESHOLD


def similarity(mine: dict[int, Print], theirs: dict[int, Print]) -> float:
    """The share of mine's fingerprints that theirs holds too."""
    return len(mine.keys() & theirs.keys()) / len(mine) if mine else 0.0


def _copy(
    other: str, mine: dict[int, Print], theirs: dict[int, Print], my_texts: dict[str, str], their_texts: dict[str, str]
) -> Copy:
    pairs = sorted(((mine[v], theirs[v]) for v in mine.keys() & theirs.keys()), key=lambda p: (p[0].file, p[0].lines))
    regions = _regions(pairs)
    files = tuple(sorted({r.file for r in regions}))
    ranked = sorted(regions, key=lambda r: -(r.lines[1] - r.lines[0]))[:_MAX_REGIONS]
    excerpted = tuple(
        Region(
            r.file,
            r.lines,
            r.other_file,
            r.other_lines,
            _excerpt(my_texts.get(r.file, ""), r.lines),
            _excerpt(their_texts.get(r.other_file, ""), r.other_lines),
        )
        for r in sorted(ranked, key=lambda r: (r.file, r.lines))
    )
    return Copy(other, files, round(similarity(mine, theirs), 3), excerpted)


def _regions(pairs: list[tuple[Print, Print]]) -> list[Region]:
    """Shared fingerprints joined into passages: consecutive in this file and in the other's."""
    regions: list[Region] = []
    for mine, theirs in pairs:
        last = regions[-1] if regions else None
        if (
            last is not None
            and last.file == mine.file
            and last.other_file == theirs.file
            and mine.lines[0] <= last.lines[1] + 1
            and last.other_lines[0] - 1 <= theirs.lines[0] <= last.other_lines[1] + 1
        ):
            regions[-1] = Region(
                last.file,
                (last.lines[0], max(last.lines[1], mine.lines[1])),
                last.other_file,
                (last.other_lines[0], max(last.other_lines[1], theirs.lines[1])),
            )
        else:
            regions.append(Region(mine.file, mine.lines, theirs.file, theirs.lines))
    return regions


def _excerpt(text: str, lines: tuple[int, int]) -> str:
    chosen = text.splitlines()[lines[0] - 1 : lines[1]]
    cut = len(chosen) > _EXCERPT_LINES
    return "\n".join(chosen[:_EXCERPT_LINES]) + ("\n…" if cut else "")


def describe(copies: list[Copy]) -> str:
    """One spreadsheet cell: 'reference-solution 92%: src/kvcache.py tests/adapters.py; alice 71%: src/kvcache.py'."""
    return "; ".join(f"{c.of} {c.similarity:.0%}: {' '.join(c.files)}" for c in copies)
