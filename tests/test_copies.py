"""Copy detection (grading/drive/copies.py) measured on disguised copies and on independent correct solutions.

The independent solutions (tests/copies/) were each graded correct on every stage when written; the
disguises are what a copier does cheaply: rename locals (some of them names that are also attributes
or keyword arguments), reorder functions, change comments and docstrings, reindent, and rewrite one
function. Every copy must be flagged, and no independent solution.
"""

import re
import shutil
from pathlib import Path

import pytest

from theinference.bundled import data_dir
from theinference.grading.drive import copies
from theinference.grading.drive.copies import SOLUTION, CodeSnapshot, find_copies, read_code, similarity
from theinference.grading.tools.mutants import build_mutant, load_mutants

COURSE = data_dir("course")
CORPUS = Path(__file__).parent / "copies"


def independent(name: str, dest: Path) -> Path:
    """tests/copies/<name> as a course: the starter, its given gpt2.py part, this solution's maths and cache."""
    shutil.copytree(COURSE / "starter", dest)
    given = (COURSE / "starter" / "src" / "gpt2.py").read_text().split("\n\ndef gelu")[0]
    (dest / "src" / "gpt2.py").write_text(given + "\n\n\n" + (CORPUS / name / "src" / "gpt2.py").read_text())
    shutil.copy(CORPUS / name / "src" / "kvcache.py", dest / "src" / "kvcache.py")
    return dest


# --- disguises --------------------------------------------------------------------------------------------------


def rename(text: str, names: dict[str, str]) -> str:
    """An editor's rename of locals: never an attribute (`.mean`) nor a keyword argument (`count=`)."""
    for old, new in names.items():
        text = re.sub(rf"(?<![.\w]){old}\b(?!=[^=])", new, text)
    return text


RENAMES = {
    "src/gpt2.py": {"mean": "mu", "variance": "var", "count": "n_items", "params": "weights", "scores": "logits"},
    "src/kvcache.py": {"cache": "kv", "keys": "k_all", "values": "v_all", "rows": "out", "layer": "blk"},
}


def renamed(root: Path) -> None:
    for file, names in RENAMES.items():
        path = root / file
        path.write_text(rename(path.read_text(), names))


def reordered(root: Path) -> None:
    """Top-level functions and classes in reverse order, after the imports and constants."""
    for file in ("src/gpt2.py", "src/kvcache.py"):
        path = root / file
        chunks = re.split(r"\n\n\n(?=def |class |@)", path.read_text())
        path.write_text("\n\n\n".join([chunks[0], *reversed(chunks[1:])]) + "\n")


def recommented(root: Path) -> None:
    """Every comment and docstring replaced by other words; blank lines and comments added."""
    for file in ("src/gpt2.py", "src/kvcache.py", "tests/adapters.py"):
        path = root / file
        text = re.sub(
            r'"""[\s\S]*?"""', '"""My own implementation, written from the lecture notes."""', path.read_text()
        )
        text = re.sub(r"  # .*", "", text)
        text = text.replace("\n    return ", "\n    # the result\n\n    return ")
        path.write_text("# Coursework, my own\n" + text)


def reindented(root: Path) -> None:
    for file in ("src/gpt2.py", "src/kvcache.py"):
        path = root / file
        path.write_text(re.sub(r"(?m)^((?:    )+)", lambda m: "  " * (len(m.group(1)) // 4), path.read_text()))


REWRITTEN_GENERATE = """
def generate_cached(params, ids, n_new, n_head):
    produced = []
    logits, cache = prefill(params, ids, n_head)
    nxt = logits[-1].argmax()
    while len(produced) < n_new:
        produced.append(int(nxt))
        if len(produced) < n_new:
            nxt = decode_step(params, cache, produced[-1], len(cache), n_head).argmax()
    return produced
"""


def rewritten(root: Path) -> None:
    """One function (generate_cached) written anew."""
    path = root / "src" / "kvcache.py"
    text = path.read_text()
    start = text.index("def generate_cached")
    path.write_text(text[:start] + REWRITTEN_GENERATE.lstrip())


DISGUISES = {
    "renamed": [renamed],
    "reordered": [reordered],
    "recommented": [recommented],
    "reindented": [reindented],
    "rewritten": [rewritten],
    "all-at-once": [renamed, reordered, recommented, reindented, rewritten],
}


def disguised(source: Path, dest: Path, steps) -> Path:
    shutil.copytree(source, dest)
    for step in steps:
        step(dest)
    return dest


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, CodeSnapshot]:
    """Disguised copies of the reference solution, a disguised copy of independent-a, three independent solutions,
    and two mutants (the reference with one bug: a near relative that is still the reference's code)."""
    root = tmp_path_factory.mktemp("corpus")
    solution = COURSE / "solution"
    made = {f"copy-{name}": disguised(solution, root / f"copy-{name}", steps) for name, steps in DISGUISES.items()}
    for name in ("independent-a", "independent-b", "independent-c"):
        made[name] = independent(name, root / name)
    made["copy-of-a"] = disguised(made["independent-a"], root / "copy-of-a", DISGUISES["all-at-once"][:4])
    (made["copy-of-a"] / "src" / "kvcache.py").write_text(  # its own adapters and cache are the rest of a's
        (made["copy-of-a"] / "src" / "kvcache.py").read_text().replace("nxt", "next_token")
    )
    mutants = {m.name: m for m in load_mutants(COURSE / "mutants")}
    for name in ("gelu-erf", "cache-rebuilt-each-step"):
        made[f"mutant-{name}"] = build_mutant(mutants[name], solution, root / f"mutant-{name}")
    made["starter"] = shutil.copytree(COURSE / "starter", root / "starter")
    return {name: read_code(path) for name, path in made.items()}


@pytest.fixture(scope="module")
def found(corpus):
    return find_copies(corpus)


def test_every_disguised_copy_of_the_reference_is_flagged_with_its_files(found):
    for name in [*(f"copy-{d}" for d in DISGUISES), "mutant-gelu-erf", "mutant-cache-rebuilt-each-step"]:
        assert name in found, name
        of_solution = found[name][0]
        assert of_solution.of == SOLUTION and of_solution.similarity >= copies.THRESHOLD, (name, of_solution)
        assert "src/kvcache.py" in of_solution.files  # the file the student writes, not only the given ones


def test_a_disguised_copy_of_another_submission_is_flagged_both_ways_and_not_as_the_reference(found):
    assert [c.of for c in found["copy-of-a"]] == ["independent-a"]
    assert [c.of for c in found["independent-a"]] == ["copy-of-a"]


def test_no_independent_solution_is_flagged(found):
    for name in ("independent-b", "independent-c", "starter"):
        assert name not in found, (name, found.get(name))


def test_a_local_named_like_an_attribute_or_keyword_changes_nothing():
    before = "def f(x):\n    mean = x.mean(axis=-1, keepdims=True)\n    return np.fromfile(p, count=mean)\n"
    after = "def f(y):\n    mu = y.mean(axis=-1, keepdims=True)\n    return np.fromfile(p, count=mu)\n"
    assert [t.text for t in copies.tokens("a.py", before)] == [t.text for t in copies.tokens("a.py", after)]
    other_api = "def f(x):\n    mean = x.sum(axis=-1, keepdims=True)\n    return np.fromfile(p, offset=mean)\n"
    assert [t.text for t in copies.tokens("a.py", before)] != [t.text for t in copies.tokens("a.py", other_api)]


def test_regions_name_the_lines_both_sides_share(corpus, found):
    region = next(r for r in found["copy-renamed"][0].regions if r.file == "src/kvcache.py")
    assert region.other_file == "src/kvcache.py"
    mine = corpus["copy-renamed"].files
    text = dict(mine)["src/kvcache.py"].splitlines()
    assert region.text.splitlines()[0] == text[region.lines[0] - 1]
    reference = dict(copies.bundled_code("solution").files)["src/kvcache.py"].splitlines()
    assert region.other_text.splitlines()[0] == reference[region.other_lines[0] - 1]
    assert region.text != region.other_text  # the renamed side and the reference's, each as written


def test_the_files_as_graded_are_what_is_compared(tmp_path):
    course = shutil.copytree(COURSE / "solution", tmp_path / "sub")
    graded = read_code(course)
    shutil.rmtree(course / "src")  # removed after grading: the snapshot still holds what was graded
    assert find_copies({"sub": graded})["sub"][0].of == SOLUTION
    assert "sub" not in find_copies({"sub": read_code(course)})


def test_links_hidden_and_dependency_directories_are_not_read(tmp_path):
    course = shutil.copytree(COURSE / "starter", tmp_path / "sub")
    (course / "linked.py").symlink_to(COURSE / "solution" / "src" / "kvcache.py")
    for hidden in (".venv", "node_modules"):
        shutil.copytree(COURSE / "solution" / "src", course / hidden)
    assert sorted(f for f, _ in read_code(course).files) == sorted(f for f, _ in read_code(COURSE / "starter").files)


def similarity_table(corpus: dict[str, CodeSnapshot]) -> list[tuple[str, float, str, float]]:
    """(submission, share of it found in the reference, its closest other submission, the share of its code not
    in the reference found there)."""
    given = set(copies.code_prints(copies.bundled_code("starter")))
    prints = {n: copies._own(copies.code_prints(c), given) for n, c in corpus.items()}
    reference = copies._own(copies.code_prints(copies.bundled_code("solution")), given)
    rows = []
    for name, mine in sorted(prints.items()):
        ours = copies._own(mine, set(reference))  # between submissions, what is not the reference's
        others = [(similarity(ours, copies._own(p, set(reference))), o) for o, p in prints.items() if o != name]
        best, other = max(others)
        rows.append((name, similarity(mine, reference), other, best))
    return rows


if __name__ == "__main__":  # the table in the report: python tests/test_copies.py
    import tempfile

    class _Factory:
        def mktemp(self, name):
            return Path(tempfile.mkdtemp(prefix=name))

    table = similarity_table(corpus.__wrapped__(_Factory()))  # type: ignore[attr-defined]
    print(f"K={copies.K} WINDOW={copies.WINDOW} THRESHOLD={copies.THRESHOLD}")
    for name, ref, other, best in table:
        print(f"{name:32} reference {ref:6.1%}   closest {other:28} {best:6.1%}")


@pytest.mark.slow
def test_a_submission_named_like_the_reference_is_compared_as_a_submission():
    solution = copies.bundled_code("solution")
    found = find_copies({"reference-solution": solution, "bob": solution})
    assert [c.of for c in found["bob"]] == [SOLUTION]  # the bundled reference, not the submission of that name
    assert [c.of for c in found["reference-solution"]] == [SOLUTION]
