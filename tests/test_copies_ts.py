"""Copy detection (grading/drive/copies.py) on the TypeScript edition: disguised copies of the TS reference solution
are flagged, and no independent correct TS solution (tests/copies/ts-independent-*) is.

The independent solutions are each the TS starter with its functions written anew (`src/gpt2.ts`, `src/kvcache.ts`;
the starter's given code kept, as a student keeps it); each was graded 75/75 by `theinference test --all` on the tiny
weights (`test_each_independent_ts_solution_passes_the_whole_course` checks it again, with Node and tsx).
The disguises are what a copier does cheaply in TypeScript: rename locals (some the names of attributes: `k` and
`.k`, `cache` and `.cache`), reorder the functions, change comments, reindent, and rewrite one function.
"""

import re
import shutil
from pathlib import Path

import pytest

from test_copies import rename
from theinference.bundled import data_dir
from theinference.grading.drive import copies
from theinference.grading.drive.copies import SOLUTION, CodeSnapshot, find_copies, read_code, similarity
from theinference.proc.node import find_tsx, node_executable, strips_types

TS = data_dir("course") / "ts"
CORPUS = Path(__file__).parent / "copies"
INDEPENDENT = ("ts-independent-a", "ts-independent-b")


def independent(name: str, dest: Path) -> Path:
    """tests/copies/<name> as a TS course: the TS starter with this solution's src/ files."""
    shutil.copytree(TS / "starter", dest, ignore=shutil.ignore_patterns("node_modules"))
    for path in (CORPUS / name / "src").iterdir():
        shutil.copy(path, dest / "src" / path.name)
    return dest


RENAMES = {
    "src/gpt2.ts": {"mean": "mu", "variance": "spread", "scores": "weightsRow", "headDim": "hd", "visible": "upto"},
    # k and v are also the cache's attributes (cache.k), and cache a name the module's functions pass around
    "src/kvcache.ts": {"k": "keys", "v": "vals", "cache": "store", "out": "tokens", "earlier": "before"},
}


def renamed(root: Path) -> None:
    for file, names in RENAMES.items():
        path = root / file
        path.write_text(rename(path.read_text(), names))


_TOP = r"\n\n(?=(?:export )?(?:function|class|interface) |/\*\*|// )"


def reordered(root: Path) -> None:
    """Top-level functions, classes and interfaces (each with its comment) in reverse order, after the imports."""
    for file in ("src/gpt2.ts", "src/kvcache.ts"):
        path = root / file
        chunks = re.split(_TOP, path.read_text().rstrip("\n"))
        merged: list[str] = []
        for chunk in chunks:  # a comment's chunk goes with the definition after it
            if merged and (merged[-1].startswith(("/**", "// ")) and "\n" not in merged[-1].strip()):
                merged[-1] += "\n" + chunk
            else:
                merged.append(chunk)
        path.write_text("\n\n".join([merged[0], *reversed(merged[1:])]) + "\n")


def recommented(root: Path) -> None:
    for file in ("src/gpt2.ts", "src/kvcache.ts", "tests/adapters.ts"):
        path = root / file
        text = re.sub(r"/\*\*[\s\S]*?\*/", "/** My own implementation, from the lecture notes. */", path.read_text())
        text = re.sub(r"(?m)^(\s*)// .*$", r"\1// (notes)", text)
        text = re.sub(r" // .*", "", text)
        text = text.replace("\n  return ", "\n  // the result\n\n  return ")
        path.write_text("// Coursework, my own\n" + text)


def reindented(root: Path) -> None:
    for file in ("src/gpt2.ts", "src/kvcache.ts"):
        path = root / file
        path.write_text(re.sub(r"(?m)^((?:  )+)", lambda m: "    " * (len(m.group(1)) // 2), path.read_text()))


REWRITTEN_GENERATE = """
export function generateCached(w: Weights, ids: number[], nNew: number): number[] {
  const store = new ModelCache(w.layers.length);
  const produced: number[] = [];
  let next = argmax(prefill(ids, w, store));
  while (produced.length < nNew) {
    produced.push(next);
    if (produced.length < nNew) next = argmax(decodeStep(next, store.length, w, store));
  }
  return produced;
}
"""


def rewritten(root: Path) -> None:
    """One function (generateCached) written anew."""
    path = root / "src" / "kvcache.ts"
    text = path.read_text()
    start = text.index("/** Greedy decoding with the cache")
    path.write_text(text[:start] + REWRITTEN_GENERATE.lstrip())


DISGUISES = {
    "renamed": [renamed],
    "reordered": [reordered],
    "recommented": [recommented],
    "reindented": [reindented],
    "rewritten": [rewritten],
    "all-at-once": [rewritten, renamed, reordered, recommented, reindented],
}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, CodeSnapshot]:
    root = tmp_path_factory.mktemp("ts-corpus")
    made = {}
    for name, steps in DISGUISES.items():
        made[f"ts-copy-{name}"] = shutil.copytree(TS / "solution", root / f"ts-copy-{name}")
        for step in steps:
            step(made[f"ts-copy-{name}"])
    for name in INDEPENDENT:
        made[name] = independent(name, root / name)
    made["ts-starter"] = shutil.copytree(TS / "starter", root / "ts-starter")
    return {name: read_code(path) for name, path in made.items()}


@pytest.fixture(scope="module")
def found(corpus):
    return find_copies(corpus)


def test_the_disguises_changed_the_code(corpus):
    reference = dict(read_code(TS / "solution").files)
    for name in DISGUISES:
        mine = dict(corpus[f"ts-copy-{name}"].files)
        assert mine["src/kvcache.ts"] != reference["src/kvcache.ts"], name
    renamed = dict(corpus["ts-copy-renamed"].files)["src/kvcache.ts"]
    assert "cache.append(keys, vals, n)" not in renamed and "store.append(keys, vals, n)" in renamed
    assert "store.k" in renamed  # the attribute kept its name


def test_every_disguised_ts_copy_is_flagged_as_the_reference(found):
    for name in DISGUISES:
        copy = found.get(f"ts-copy-{name}")
        assert copy, name
        assert copy[0].of == SOLUTION and copy[0].similarity >= copies.THRESHOLD, (name, copy[0])
        assert "src/kvcache.ts" in copy[0].files


def test_no_independent_ts_solution_is_flagged(found):
    for name in (*INDEPENDENT, "ts-starter"):
        assert name not in found, (name, found.get(name))


def ts_table(corpus: dict[str, CodeSnapshot]) -> list[tuple[str, float, float]]:
    """(submission, share of its own fingerprints found in the reference, the reference's share found in it)."""
    given = set(copies.code_prints(copies.bundled_code("starter")))
    reference = copies._own(copies.code_prints(copies.bundled_code("solution")), given)
    rows = []
    for name, code in sorted(corpus.items()):
        mine = copies._own(copies.code_prints(code), given)
        rows.append((name, similarity(mine, reference), similarity(reference, mine)))
    return rows


@pytest.fixture
def ts_runner() -> Path | None:
    """The node_modules holding the TS course's tsx (None where Node strips types itself); else skip."""
    node, tsx = node_executable(), find_tsx(TS)
    if tsx is not None:
        return tsx.parents[2]
    if node and strips_types(node):
        return None
    pytest.skip("tsx is not installed for the TypeScript course: run `npm install` at the repository's root")


@pytest.mark.slow
@pytest.mark.skipif(node_executable() is None, reason="Node.js is not installed: the TS course cannot run")
@pytest.mark.parametrize("name", INDEPENDENT)
def test_each_independent_ts_solution_passes_the_whole_course(
    cli, tmp_path, tiny_path, proof_cache, monkeypatch, name, ts_runner
):
    monkeypatch.setenv("THEINFERENCE_CACHE", str(proof_cache))
    course = independent(name, tmp_path / name)
    if ts_runner is not None:
        (course / "node_modules").symlink_to(ts_runner, target_is_directory=True)
    result = cli("test", "--all", "--course", course, "--weights", tiny_path)
    assert result.exit_code == 0, result.output
    assert "7 of 7 stage(s) passed · 75/75 points" in result.output


if __name__ == "__main__":  # the figures in the report: python tests/test_copies_ts.py
    import tempfile

    class _Factory:
        def mktemp(self, name):
            return Path(tempfile.mkdtemp(prefix=name))

    corpus_ = corpus.__wrapped__(_Factory())  # type: ignore[attr-defined]
    flagged = find_copies(corpus_)
    print(f"K={copies.K} WINDOW={copies.WINDOW} THRESHOLD={copies.THRESHOLD}")
    for name, share, back in ts_table(corpus_):
        mark = "flagged" if name in flagged else "not flagged"
        print(f"{name:28} in the reference {share:6.1%}   reference in it {back:6.1%}   {mark}")
