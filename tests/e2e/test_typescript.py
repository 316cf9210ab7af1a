"""The TypeScript edition: tests/adapters.ts graded by the same stages through the Node harness (proc/harness.mjs).

They need Node.js and, for .ts, the course's tsx (`npm install` at the repository's root, which .ci/run does) or a Node
that strips types itself; without them they skip and say why. cache-scaling runs the harness interactively (the
grader sends each call and counts its CPU from outside), on the synthetic `proof` preset at the quick stage's lengths.
"""

import json
import re
import shutil
import threading
import time
from pathlib import Path

import pytest

from conftest import write_quick_scaling_stage

from theinference.bundled import data_dir
from theinference.grading.drive.plan import plan_run
from theinference.grading.drive.session import open_session
from theinference.grading.drive.watch import Watch
from theinference.proc.node import find_tsx, node_executable, strips_types

TS = data_dir("course") / "ts"
STAGES = ["forward", "single-step-attention", "prove-one-layer", "decode-step", "per-step-identity", "greedy"]

pytestmark = pytest.mark.skipif(
    node_executable() is None,
    reason="Node.js is not installed: the TypeScript edition's tests need it (.ci/run installs it where apt can)",
)


@pytest.fixture(scope="session")
def node_modules() -> Path | None:
    """The tsx the bundled TypeScript course was given (None where Node strips types itself); else skip."""
    node = node_executable()
    tsx = find_tsx(TS)
    if tsx is not None:
        return tsx.parents[2]
    if node and strips_types(node):
        return None
    pytest.skip(
        "tsx is not installed for the TypeScript course: run `npm install` at the repository's root (.ci/run does)"
    )


def ts_course(dest: Path, node_modules: Path | None, source: Path = TS / "solution") -> Path:
    """A copy of the TypeScript solution (or another TS course) that finds the bundled course's tsx."""
    shutil.copytree(source, dest, ignore=shutil.ignore_patterns("node_modules"))
    if node_modules is not None:
        (dest / "node_modules").symlink_to(node_modules, target_is_directory=True)
    return dest


def stage_args() -> list[str]:
    return [arg for stage in STAGES for arg in ("--stage", stage)]


@pytest.mark.slow
def test_ts_solution_passes_every_stage_plain_untrusted_and_in_a_mixed_grade(
    cli, tmp_path, tiny_path, node_modules, solution_course
):
    course = ts_course(tmp_path / "ts", node_modules)
    result = cli("test", *stage_args(), "--course", course, "--weights", tiny_path)
    assert result.exit_code == 0, result.output
    assert "6 of 6 stage(s) passed" in result.output
    result = cli("test", "--untrusted", "--stage", "prove-one-layer", "--course", course, "--weights", tiny_path)
    assert result.exit_code == 0, result.output
    assert "✔ prove-one-layer" in result.output
    subs = tmp_path / "subs"
    subs.mkdir()
    shutil.move(course, subs / "ts")
    shutil.move(solution_course, subs / "py")
    broken = ts_course(subs / "ts-broken", node_modules)
    (broken / "src" / "kvcache.ts").write_text((broken / "src" / "kvcache.ts").read_text().replace("nNew)", "nNew +"))
    out = tmp_path / "grades.csv"
    result = cli("grade", *sorted(subs.iterdir()), "--stage", "prove-one-layer", "--weights", tiny_path, "--out", out)
    assert result.exit_code == 0, result.output  # the batch ran; each submission's verdict is in the CSV
    assert "ts-broken: fail" in result.output and "syntax error in src/kvcache.ts" in result.output
    rows = {line.split(",")[0]: line.split(",")[1] for line in out.read_text().splitlines()[1:]}
    assert rows == {"py": "pass", "ts": "pass", "ts-broken": "fail"}


@pytest.mark.slow
def test_each_ts_mutant_is_caught_by_its_stage_with_its_finding(cli, tmp_path, tiny_path, node_modules):
    source = tmp_path / "ts"
    # The decode-recomputes mutants are left out: their findings are cache-scaling's (test_ts_cache_scaling_...).
    shutil.copytree(TS, source, ignore=shutil.ignore_patterns("node_modules", "decode-recomputes*"))
    if node_modules is not None:
        (source / "node_modules").symlink_to(node_modules, target_is_directory=True)
    result = cli("stages", "check", "--source", source, "--stage", "per-step-identity", "--weights", tiny_path)
    assert result.exit_code == 0, result.output
    assert "0 mismatches, 0 problems" in result.output
    for finding in ("position-reset", "missing-scale-decode", "no-self-attention"):
        assert finding in result.output
    assert "not-started" in result.output  # the starter


@pytest.mark.slow
def test_ts_cache_scaling_passes_the_solution_and_fails_the_careful_recompute(
    cli, tmp_path, tiny_path, node_modules, proof_cache, monkeypatch
):
    """The Node worker serves cache-scaling's interactive calls; the grader counts its tree's CPU, as for Python.

    The careful recompute (every layer over the whole sequence, the LM head on the last row only) is the
    submission without a cache whose cost is nearest a cache's: its short calls are dear, so the diagnostic calls
    (a token after a long prompt against one in the short calls) must name it `no-cache`, never `too-slow`.
    """
    monkeypatch.setenv("THEINFERENCE_CACHE", str(proof_cache))
    source = ts_course(tmp_path / "ts" / "solution", node_modules).parent
    mutant = source / "mutants" / "decode-recomputes-last-row"
    shutil.copytree(TS / "mutants" / mutant.name, mutant)
    manifest = mutant / "manifest.toml"
    manifest.write_text(manifest.read_text().replace("cache-scaling =", "quick-scaling ="))
    if node_modules is not None:
        (source / "node_modules").symlink_to(node_modules, target_is_directory=True)
    stages = write_quick_scaling_stage(tmp_path / "stages")
    result = cli(
        "stages", "check", "--source", source, "--stages-dir", stages, "--weights", tiny_path, "--stage", "quick-scaling"
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "0 mismatches, 0 problems" in result.output
    lines = {line.split("|")[0].strip(): line for line in result.output.splitlines() if "|" in line}
    assert "✔ pass" in lines["solution"], result.output
    assert re.search(r"✔ no-cache\b", lines["decode-recomputes-last-row"]), result.output


def test_init_edition_ts_starts_a_course_whose_stages_are_not_started(cli, tmp_path, tiny_path, node_modules):
    course = tmp_path / "my-course"
    result = cli("init", course, "--edition", "ts")
    assert result.exit_code == 0, result.output
    assert "tests/adapters.ts" in result.output and "npm install" in result.output
    assert (course / "src" / "kvcache.ts").is_file() and not (course / "tests" / "adapters.py").exists()
    if node_modules is not None:  # as `npm install` in the course would
        (course / "node_modules").symlink_to(node_modules, target_is_directory=True)
    result = cli("test", "--course", course, "--weights", tiny_path)  # the first stage not yet passed
    assert result.exit_code == 1, result.output
    assert "forward" in result.output and "not started" in result.output
    assert "NotImplementedError: forward" in result.output


def test_a_ts_syntax_error_points_at_the_students_file_and_line(cli, tmp_path, tiny_path, node_modules):
    course = ts_course(tmp_path / "ts", node_modules)
    gpt2 = course / "src" / "gpt2.ts"
    lines = gpt2.read_text().splitlines()
    line = next(i for i, text in enumerate(lines, 1) if text.startswith("export function embed("))
    lines[line - 1] = lines[line - 1].replace("ids: number[]", "ids: number[")
    gpt2.write_text("\n".join(lines))
    result = cli("test", "--stage", "forward", "--course", course, "--weights", tiny_path)
    assert result.exit_code == 1, result.output
    assert f"syntax error in {gpt2}, line {line}" in result.output
    assert "harness.mjs" not in result.output and "node_modules" not in result.output


def test_a_js_syntax_error_in_an_imported_module_points_at_its_file_and_line(cli, tmp_path, tiny_path):
    course = tmp_path / "js"
    (course / "tests").mkdir(parents=True)
    (course / "src").mkdir()
    (course / "src" / "lib.mjs").write_text("export function f(x) {\n  return x +;\n}\n")
    (course / "tests" / "adapters.mjs").write_text(
        'import { f } from "../src/lib.mjs";\nexport function runSingleStep(ids) { return f(ids); }\n'
    )
    result = cli("test", "--stage", "single-step-attention", "--course", course, "--weights", tiny_path)
    assert result.exit_code == 1, result.output
    assert f"syntax error in {course / 'src' / 'lib.mjs'}, line 2" in result.output


def test_a_ts_runtime_error_shows_the_students_frames_only(cli, tmp_path, tiny_path, node_modules):
    course = ts_course(tmp_path / "ts", node_modules)
    adapters = course / "tests" / "adapters.ts"
    text = adapters.read_text().replace(
        "  return singleStepAttention(model(), seqIds);", '  throw new TypeError("no cache yet");'
    )
    adapters.write_text(text)
    line = text.splitlines().index('  throw new TypeError("no cache yet");') + 1
    result = cli("test", "--stage", "single-step-attention", "--course", course, "--weights", tiny_path)
    assert result.exit_code == 1, result.output
    assert "TypeError: no cache yet" in result.output
    assert f"at runSingleStep ({adapters}:{line}:" in result.output  # the .ts line, through the source map
    assert "harness.mjs" not in result.output


def _single_step_messages(cli, course: Path, tiny_path: Path) -> list[str]:
    result = cli(
        "test", "--stage", "single-step-attention", "--course", course, "--weights", tiny_path, "--format", "json"
    )
    return [c["message"] for c in json.loads(result.stdout)["stages"][0]["cases"]]


def test_wrong_shapes_and_non_numbers_read_as_in_python(cli, tmp_path, tiny_path):
    """A JavaScript adapter (no tsx needed) and a Python one that return the same wrong things get the same words."""
    js, py = tmp_path / "js", tmp_path / "py"
    (js / "tests").mkdir(parents=True)
    (py / "tests").mkdir(parents=True)
    (js / "tests" / "adapters.mjs").write_text(
        "export async function runSingleStep(ids) {\n"
        "  return ids.length === 1 ? 'abc' : ids.length === 2 ? [[1, 2], [3]] : [1.5, 2.5];\n}\n"
    )
    (py / "tests" / "adapters.py").write_text(
        "def run_single_step(ids):\n    return 'abc' if len(ids) == 1 else [[1, 2], [3]] if len(ids) == 2 else [1.5, 2.5]\n"
    )
    js_messages, py_messages = _single_step_messages(cli, js, tiny_path), _single_step_messages(cli, py, tiny_path)
    assert len(js_messages) == len(py_messages) == 10
    assert js_messages[0].startswith("the return value is not numeric (got string")  # Python: "(got str of dtype <U3)"
    assert py_messages[0].startswith("the return value is not numeric (got str")
    assert js_messages[1] == py_messages[1]  # ragged: numpy's own words
    assert js_messages[1].startswith("the return value is not an array of numbers (ValueError: ")
    assert js_messages[2:] == py_messages[2:] == ["expected shape [128], got [2]"] * 8


def test_exit_late_throws_and_not_implemented_are_each_cases_outcome(cli, tmp_path, tiny_path):
    course = tmp_path / "js"
    (course / "tests").mkdir(parents=True)
    (course / "tests" / "adapters.mjs").write_text(
        "export function runSingleStep(ids) {\n"
        "  if (ids.length === 1) process.exit(3);\n"
        "  if (ids.length === 2) { setTimeout(() => { throw new Error('late'); }, 1); return new Promise(() => {}); }\n"
        "  const e = new Error('todo'); e.name = 'NotImplementedError'; throw e;\n"
        "}\n"
    )
    result = cli(
        "test", "--stage", "single-step-attention", "--course", course, "--weights", tiny_path, "--format", "json"
    )
    cases = json.loads(result.stdout)["stages"][0]["cases"]
    assert [(c["status"], c["message"]) for c in cases[:3]] == [
        ("error", "the adapter called process.exit(3)"),
        ("error", "Error: late (thrown outside the adapter's own calls)"),
        ("not-started", "NotImplementedError: todo"),
    ]
    assert f"at runSingleStep ({course / 'tests' / 'adapters.mjs'}:2:" in cases[0]["traceback"]


def test_ts_course_without_a_runner_is_a_setup_error_naming_the_install(cli, tmp_path, tiny_path):
    node = node_executable()
    if node and strips_types(node):
        pytest.skip("this Node strips types itself: a .ts course needs no tsx here")
    course = ts_course(tmp_path / "ts", None)
    result = cli("test", "--stage", "forward", "--course", course, "--weights", tiny_path)
    assert result.exit_code == 2
    assert "npm install --save-dev tsx" in result.output


@pytest.mark.slow
def test_watch_regrades_on_a_ts_save(tmp_path, tiny_path, node_modules):
    course = ts_course(tmp_path / "ts", node_modules)
    regrades: list = []
    with open_session(plan_run(course, weights=str(tiny_path))) as session:
        watch = Watch(session, ["prove-one-layer"], regrades.append)
        stop = threading.Event()
        watch.start_observer()
        thread = threading.Thread(target=watch.loop, args=(stop,), daemon=True)
        thread.start()
        try:
            _wait(lambda: len(regrades) >= 1)
            kvcache = course / "src" / "kvcache.ts"
            kvcache.write_text(
                kvcache.read_text().replace(
                    "const out = attention(q, cache.k", "const out = attention(q.map((x) => 2 * x), cache.k"
                )
            )
            _wait(lambda: len(regrades) >= 2)
        finally:
            stop.set()
            thread.join(timeout=10)
            watch.stop_observer()
    assert regrades[0].result.stages[0].status == "pass"
    assert regrades[1].changed == [str(kvcache)]
    assert regrades[1].result.stages[0].status == "fail"


def _wait(condition, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert condition(), "timed out waiting for the watch"


def test_the_harness_serves_interactive_calls_until_end_of_file(tmp_path):
    """An interactive job (cache-scaling): calls arrive one JSON line at a time; START/DONE each; exit 0 at EOF."""
    import os
    import subprocess

    import numpy as np

    from theinference.proc import protocol
    from theinference.proc.node import HARNESS

    (tmp_path / "tests").mkdir()
    adapters = tmp_path / "tests" / "adapters.mjs"
    adapters.write_text(
        "export async function runGreedy(prompt, n) { return Array.from({ length: n }, (_, i) => prompt[0] + i); }\n"
    )
    out_dir = tmp_path / "run"
    out_dir.mkdir()
    job = {
        "course_root": str(tmp_path),
        "adapters": str(adapters),
        "names": ["run_greedy", "runGreedy"],
        "calls": [],
        "start": 0,
        "out_dir": str(out_dir),
        "interactive": True,
        "limits": {"memory_bytes": None, "file_bytes": None},
    }
    (out_dir / "job.json").write_text(json.dumps(job))
    events_r, events_w = os.pipe()
    calls_r, calls_w = os.pipe()
    env = {**os.environ, protocol.PROTOCOL_FD_ENV: str(events_w), "THEINFERENCE_CALLS_FD": str(calls_r)}
    proc = subprocess.Popen(
        [node_executable(), str(HARNESS), str(out_dir / "job.json")], env=env, pass_fds=(events_w, calls_r)
    )
    os.close(events_w)
    os.close(calls_r)
    with os.fdopen(calls_w, "w") as calls:
        calls.write(json.dumps({"case": 3, "args": [[7], 4]}) + "\n")
        calls.write(json.dumps({"case": 5, "args": [[100], 2]}) + "\n")
    with os.fdopen(events_r) as events:
        messages = [json.loads(line) for line in events]
    assert proc.wait(timeout=30) == 0
    assert [(m["event"], m.get("case"), m.get("status")) for m in messages] == [
        ("loaded", None, None),
        ("start", 3, None),
        ("done", 3, "ok"),
        ("start", 5, None),
        ("done", 5, "ok"),
    ]
    assert messages[0]["defined_at"] == [str(adapters), 1]
    assert np.load(out_dir / "case-3.npy").tolist() == [7, 8, 9, 10]
    assert np.load(out_dir / "case-5.npy").dtype == np.int64


@pytest.mark.slow
def test_the_gradescope_bundle_grades_a_ts_upload(cli, tmp_path, tiny_path, node_modules):
    from test_autograder import build, run_autograder

    from theinference import __version__

    wheel = tmp_path / "dist" / f"theinference-{__version__}-py3-none-any.whl"
    wheel.parent.mkdir()
    wheel.write_bytes(b"not installed by this test")
    root = build(cli, tmp_path, wheel, "--weights", tiny_path, "--stage", "prove-one-layer")
    if node_modules is not None:  # where setup.sh's `npm install --prefix $ROOT tsx` puts it
        (root / "node_modules").symlink_to(node_modules, target_is_directory=True)
    upload = tmp_path / "upload"
    ts_course(upload / "my-course", None)  # uploaded without node_modules, as students do
    doc = run_autograder(root, upload)
    assert doc["score"] == doc["extra_data"]["max_score"] == 10, doc["output"]
    assert [(t["name"].split(":")[0], t["status"]) for t in doc["tests"]] == [("prove-one-layer", "passed")]
