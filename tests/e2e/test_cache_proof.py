"""The cache proof against a student who wants to pass it (bench/scaling_subjects.py holds the submissions).

Six tricks beat the old design, which timed the calls inside the student's process on a prompt it had
seen: a patched clock, a replaced timing function, work done in a forked child, a memo of repeated
prompts, a prefix generated ahead on the warm-up call, and a forged result message. Each runs here
through the real CLI, prints evidence that its mechanism ran in the student's process, and must fail:
the grader now sends every timed call a fresh random prompt and reads the CPU of the whole process
tree itself. Tests at the weaker levels run the grader as a non-root user without bwrap or unshare on
PATH (the /proc accounting); the batches carry the reference cache as a control that must pass.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import as_nobody
from conftest import leased_uid, write_adapters, write_quick_scaling_stage

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from scaling_subjects import FORGERY, FORK_OFFLOAD, PADDING, SOLUTION_CACHE, TRICKS  # noqa: E402

from theinference.proc.sandbox import ALLOW_WEAK_ENV, strongest_isolation  # noqa: E402

EVIDENCE = {
    "clock": "clock patched: process_time() = 0.0",
    "timing-module": "timing patched:",
    "fork-offload": "fork offload: parent CPU",
    "memo": "memo hits: 0",
    "warmup-prefix": "prefix served: 0",
    "forgery": "forgery: done message for call 0 sent",
}


@pytest.fixture
def proof_env(proof_cache, monkeypatch):
    """The user cache that holds the proof preset, so each test does not make it again."""
    monkeypatch.setenv("THEINFERENCE_CACHE", str(proof_cache))
    return proof_cache


# The longest call of the stage a trick alone is graded on (plain `test`): no trick computes less than a recompute, so
# each is stopped at (b) there as at 320 tokens, after a quarter of the CPU (a reference cache near (b) at 160 tokens
# is not graded here: the batches, whose control must pass, run at 320).
TRICK_LONGEST = 160


@pytest.fixture
def quick(tmp_path):
    """The test-sized stage at 160 tokens: for submissions that must fail on cost, with no control beside them."""
    return write_quick_scaling_stage(tmp_path / "quick-stages", longest=TRICK_LONGEST)


@pytest.fixture
def quick320(tmp_path):
    """The test-sized stage at 320 tokens, where the reference cache passes (b) with room."""
    return write_quick_scaling_stage(tmp_path / "quick-stages")


# The warm-up prefix trick's warm-up call: it generates ahead by the careful recompute (bench/scaling_subjects.py).
_WARMUP = "careful_recompute(prompt_ids, min(room, max(n_new, 480)) if not _AHEAD else n_new)"


def trick(name: str, longest: int = TRICK_LONGEST) -> str:
    """The trick's source for a stage whose longest call is `longest`. The warm-up prefix generates exactly that far
    ahead (the bench's 480 is the built-in stage's longest), and with the reference's cache: how the prefix was made
    does not matter to the trick (the old design's timed calls repeated the warm-up's prompt and were served from it
    at no cost), while a careful recompute of 320 tokens ahead is a minute of CPU on every batch. Every other call
    is still the careful recompute, which the grader must fail."""
    source = TRICKS[name]
    if name == "warmup-prefix":
        assert _WARMUP in source
        ahead = f"generate_cached(params, prompt_ids, min(room, max(n_new, {longest})), _model()[1])"
        source = source.replace(_WARMUP, f"{ahead} if not _AHEAD else careful_recompute(prompt_ids, n_new)")
    return source


def _grade_one(cli, course, tiny_path, stages, *extra) -> dict:
    result = cli(
        "test", "--course", course, "--weights", tiny_path, "--stages-dir", stages, "--stage", "quick-scaling",
        "--format", "json", *extra,
    )  # fmt: skip
    assert result.exit_code == 1, result.stdout[-2000:]
    return json.loads(result.stdout)


def _assert_failed_with_evidence(doc: dict, trick: str, evidence: bool = True) -> dict:
    stage = doc["stages"][0]
    case = stage["cases"][0]
    assert stage["status"] != "pass" and stage["points"] == 0, case
    if evidence:
        assert EVIDENCE[trick] in case.get("stdout", ""), case.get("stdout")
    return case


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(TRICKS))
def test_each_trick_fails_in_plain_test(cli, tmp_path, tiny_path, quick, proof_env, name):
    course = tmp_path / name
    write_adapters(course, trick(name))
    case = _assert_failed_with_evidence(_grade_one(cli, course, tiny_path, quick), name)
    if name == "fork-offload":  # the parent's own clock saw almost none of the work
        parent, wall = map(float, re.findall(r"parent CPU ([\d.]+) s in ([\d.]+) s", case["stdout"])[0])
        assert parent < 0.5 * wall
    if case["status"] == "fail":  # stopped or judged on cost: the figures come from the grader's count
        scaling = case["scaling"]
        assert scaling["accounting"].startswith(("cgroup", "process tree"))
        assert "(b) fails" in case["message"] or scaling["ratio"] > scaling["max_ratio"]


_REPEAT = """
import sys, time
sys.path.insert(0, ".")
import importlib.util
spec = importlib.util.spec_from_file_location("adapters", "tests/adapters.py")
adapters = importlib.util.module_from_spec(spec)
spec.loader.exec_module(adapters)
first = adapters.run_greedy([464, 3290], 6)
again = adapters.run_greedy([464, 3290], 4)
print("same:", again == first[:4])
"""


@pytest.mark.slow
@pytest.mark.parametrize("name", ["memo", "warmup-prefix", "clock"])
def test_the_tricks_work_where_inputs_repeat_or_the_clock_is_the_students(tmp_path, tiny_path, name):
    """Against the old design: a repeated prompt is served without work, and the clock is the student's."""
    course = tmp_path / name
    write_adapters(course, trick(name, longest=8))  # a prefix of 8 covers both calls below
    if name == "memo":  # the same (prompt, n) twice: the old timed repeats
        script = _REPEAT.replace(
            "again = adapters.run_greedy([464, 3290], 4)", "again = adapters.run_greedy([464, 3290], 6)[:4]"
        )
    else:
        script = _REPEAT
    env = {**os.environ, "THEINFERENCE_WEIGHTS": str(tiny_path)}
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=course, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr
    assert "same: True" in done.stdout
    expected = {"memo": "memo hits: 1", "warmup-prefix": "prefix served: 1", "clock": "process_time() = 0.0"}[name]
    assert expected in done.stdout


@pytest.mark.slow
def test_padding_short_calls_fails_on_the_floor_in_numbers(cli, tmp_path, tiny_path, quick, proof_env):
    course = tmp_path / "padding"
    write_adapters(course, PADDING)
    case = _grade_one(cli, course, tiny_path, quick)["stages"][0]["cases"][0]
    assert "padded:" in case["stdout"]
    assert case["status"] == "fail" and "(b) fails" in case["message"]
    assert re.search(
        r"passed \d+% of a full recompute of those tokens by the oracle here in float32 \([\d.]+ s\)", case["message"]
    )
    assert case["scaling"]["fraction_of_recompute"] > case["scaling"]["max_fraction"]


def _batch(tmp: Path) -> list[Path]:
    """The control and the six tricks, for the stage at 320 tokens (quick320)."""
    subs = []
    for name, source in [("solution-control", SOLUTION_CACHE), *((t, trick(t, 320)) for t in sorted(TRICKS))]:
        write_adapters(tmp / name, source)
        subs.append(tmp / name)
    return subs


def _check_batch(doc: dict, level: str, accounting: str) -> None:
    """The control passes where a cgroup counts the CPU; on a process tree (which misses processes that end unseen)
    a batch gives no pass at all, so the control is unproven, its figures those of a pass. Every trick fails."""
    by_id = {s["id"]: s for s in doc["submissions"]}
    control = by_id["solution-control"]
    case = control["results"]["stages"][0]["cases"][0]
    assert case["scaling"]["accounting"].startswith(accounting)
    assert control["results"]["isolation"]["level"] == level
    if case["scaling"]["accounting_complete"]:
        assert control["points"] == 10, json.dumps(case)[:3000]
    else:
        assert case["status"] == "unproven" and control["points"] == 0, json.dumps(case)[:3000]
        t = case["scaling"]
        assert t["ratio"] <= t["max_ratio"] and t["fraction_of_recompute"] <= t["max_fraction"]
    for trick in TRICKS:
        case = by_id[trick]["results"]["stages"][0]["cases"][0]
        assert by_id[trick]["points"] == 0 and case["status"] not in ("pass", "unproven"), (trick, case["message"])


@pytest.mark.slow
@pytest.mark.skipif(strongest_isolation().level != "sandbox", reason="bubblewrap does not run here")
def test_every_trick_fails_in_a_sandboxed_grade_batch(cli, tmp_path, tiny_path, quick320, proof_env):
    subs = _batch(tmp_path / "subs")
    out = tmp_path / "grades.json"
    result = cli(
        "grade", *subs, "--weights", tiny_path, "--stages-dir", quick320, "--stage", "quick-scaling",
        "--format", "json", "--out", out,
    )  # fmt: skip
    assert result.exit_code == 0, result.stdout + result.stderr
    _check_batch(json.loads(out.read_text()), "sandbox", "cgroup" if os.geteuid() == 0 else "")


def _weakest_level_command(venv_bin: Path, args: list[str], cache: Path, uid: int) -> list[str]:
    env = {
        "PATH": str(venv_bin),
        "THEINFERENCE_CACHE": str(cache),
        "HOME": str(cache),
        "NO_COLOR": "1",
        "COLUMNS": "120",
        ALLOW_WEAK_ENV: "1",  # the subreaper level, by the instructor's consent
    }
    return as_nobody.command([str(venv_bin / "theinference"), *args], env, uid=uid)


@pytest.mark.slow
@pytest.mark.skipif(bool(as_nobody.available()), reason=as_nobody.available() or "-")
def test_every_trick_fails_at_the_weakest_level_as_a_non_root_user(tiny_path, proof_cache):
    """No bwrap, no unshare, not root: the subreaper level, CPU counted from /proc (no cgroup can be made), where
    a batch proves no cache: the control is unproven, every trick still fails on its own."""
    venv_bin = Path(sys.executable).parent
    work = Path(tempfile.mkdtemp(prefix="theinference-weak-"))
    try:
        os.chmod(work, 0o755)
        subs = _batch(work / "subs")
        stages = write_quick_scaling_stage(work / "stages")
        cache, weights = work / "cache", work / "tiny"
        shutil.copytree(proof_cache, cache)
        shutil.copytree(tiny_path.parent, weights)
        out = work / "grades.json"
        args = ["grade", *map(str, subs), "--weights", str(weights), "--stages-dir", str(stages)]
        args += ["--stage", "quick-scaling", "--format", "json", "--out", str(out)]
        with leased_uid() as uid:  # nobody or a free uid: no root grader's cleanup kills this grader, which runs as it
            subprocess.run(["chown", "-R", f"{uid}:{uid}", str(work)], check=True)
            done = subprocess.run(
                _weakest_level_command(venv_bin, args, cache, uid), capture_output=True, text=True, timeout=1800
            )
        assert done.returncode == 0, done.stdout + done.stderr
        _check_batch(json.loads(out.read_text()), "subreaper", "process tree")
    finally:
        shutil.rmtree(work, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.parametrize(
    "mode,trick,source", [("CI=true", "fork-offload", FORK_OFFLOAD), ("--untrusted", "forgery", FORGERY)]
)
def test_untrusted_test_fails_the_tricks_that_leave_the_process(
    cli, tmp_path, tiny_path, quick, proof_env, monkeypatch, mode, trick, source
):
    if mode == "CI=true":
        monkeypatch.setenv("CI", "true")
    course = tmp_path / trick
    write_adapters(course, source)
    doc = _grade_one(cli, course, tiny_path, quick, *(["--untrusted"] if mode == "--untrusted" else []))
    assert doc["untrusted"] is True and doc["isolation"]["level"] == strongest_isolation().level
    _assert_failed_with_evidence(doc, trick)


MONITOR_KILLER = (
    SOLUTION_CACHE
    + """
import os, signal

_solve = run_greedy
_killed = []


def run_greedy(prompt_ids, n_new):
    if not _killed:  # the monitor (the worker's parent) would have killed whatever it starts
        print("monitor killed:", os.getppid(), flush=True)
        os.kill(os.getppid(), signal.SIGKILL)
        _killed.append(1)
    return _solve(prompt_ids, n_new)
"""
)


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["zygote", "subprocess"])
def test_a_cache_that_kills_its_monitor_is_an_error(
    cli, tmp_path, tiny_path, quick320, proof_env, monkeypatch, launcher
):
    """Plain `test` (the subreaper level): the reference cache, after killing its monitor, earns nothing."""
    from theinference.proc.calls import CallSession

    monkeypatch.setenv("THEINFERENCE_LAUNCHER", launcher)
    course = tmp_path / "killer"
    write_adapters(course, MONITOR_KILLER)
    case = _grade_one(cli, course, tiny_path, quick320)["stages"][0]["cases"][0]
    assert case["status"] == "error" and "killed its monitor" in case["message"], case["message"]
    # Without the check, the same run passes: its calls were answered, and timed from outside.
    monkeypatch.setattr(
        CallSession, "monitor_lost", property(lambda self: False, lambda self, value: None), raising=False
    )
    result = cli("test", "--course", course, "--weights", tiny_path, "--stages-dir", quick320, "--stage",
                 "quick-scaling", "--format", "json")  # fmt: skip
    case = json.loads(result.stdout)["stages"][0]["cases"][0]
    assert case["status"] == "pass" and "monitor killed:" in case["stdout"], case["message"]
