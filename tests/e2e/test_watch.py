"""Watch mode with real file writes in a temporary course: one save, one re-grade."""

import os
import shutil
import threading
import time
from pathlib import Path

import pytest

from conftest import scaled, write_adapters
from theinference.bundled import data_dir
from theinference.grading.drive.plan import plan_run
from theinference.grading.drive.session import open_session
from theinference.grading.drive.watch import Watch, is_relevant

SLOW_ADAPTER = """\
import pathlib, time
from src.gpt2 import load_weights
from src.kvcache import layer_attn_incremental
import theinference

def run_layer_equiv(seq_ids):
    pathlib.Path(RUNNING).touch()  # outside the course: the test waits for it, the watch does not see it
    time.sleep(0.4)
    params, n_head = load_weights(theinference.weights_path())
    return layer_attn_incremental(params, seq_ids, n_head)
"""


class Harness:
    """A Watch running in a thread; `regrades` lists what each re-grade reported."""

    def __init__(self, course: Path, weights: Path, poll: bool = False):
        self.session = open_session(plan_run(course, weights=str(weights)))
        self.regrades = []
        self.watch = Watch(self.session, ["prove-one-layer"], self.regrades.append, poll=poll)
        self.stop = threading.Event()
        self.watch.start_observer()
        self.thread = threading.Thread(target=self.watch.loop, args=(self.stop,), daemon=True)
        self.thread.start()
        self.wait_for(1)  # the first run

    def wait_for(self, count: int, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + scaled(timeout)  # a grade starts student processes: slower on a busy machine
        while len(self.regrades) < count and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(self.regrades) >= count, f"only {len(self.regrades)} grades, expected {count}"

    def settle(self, seconds: float = 0.6) -> int:
        """Wait for quiet and return how many re-grades followed the first run."""
        time.sleep(seconds)
        return len(self.regrades) - 1

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=10)
        self.watch.stop_observer()
        self.session.close()


@pytest.fixture
def harness(solution_course, tiny_path):
    made = []

    def start(poll: bool = False):
        made.append(Harness(solution_course, tiny_path, poll))
        return made[-1]

    yield start
    for h in made:
        h.close()


def touch(path: Path) -> None:
    path.write_text(path.read_text() + "\n")


def test_one_save_one_regrade(harness, solution_course):
    h = harness()
    touch(solution_course / "src" / "kvcache.py")
    h.wait_for(2)
    assert h.settle() == 1
    assert h.regrades[1].changed == [str(solution_course / "src" / "kvcache.py")]
    assert h.regrades[1].result.stages[0].status == "pass"
    assert h.regrades[1].result.advice[0].startswith("next stage: ")  # the watch report ends as `test`'s does


def test_a_burst_of_ten_saves_is_one_regrade(harness, solution_course):
    h = harness()
    target = solution_course / "src" / "kvcache.py"
    for _ in range(10):  # as fast as an editor writes: a pause between them on a busy machine is not this test's
        touch(target)
    h.wait_for(2)
    assert h.settle() == 1


@pytest.mark.slow
def test_saves_during_a_running_grade_give_exactly_one_more(harness, solution_course, tmp_path):
    running = tmp_path / "running"
    write_adapters(solution_course, SLOW_ADAPTER.replace("RUNNING", repr(str(running))))
    h = harness()
    running.unlink()  # the first run's
    touch(solution_course / "src" / "kvcache.py")
    deadline = time.monotonic() + 60
    while not running.exists() and time.monotonic() < deadline:  # the re-grade's first case has started
        time.sleep(0.01)
    assert running.exists(), "the re-grade never started"
    touch(solution_course / "src" / "gpt2.py")
    touch(solution_course / "tests" / "adapters.py")
    h.wait_for(3)
    assert h.settle(1.5) == 2
    assert sorted(Path(p).name for p in h.regrades[2].changed) == ["adapters.py", "gpt2.py"]


def test_editor_temp_files_and_caches_are_ignored(harness, solution_course):
    h = harness()
    src = solution_course / "src"
    for name in (".kvcache.py.swp", "kvcache.py~", "4913", ".#kvcache.py", "flycheck_kvcache.py", "notes.txt"):
        (src / name).write_text("x")
    (src / "__pycache__").mkdir(exist_ok=True)
    (src / "__pycache__" / "kvcache.cpython-311.py").write_text("x")
    (solution_course / ".git").mkdir()
    (solution_course / ".git" / "hook.py").write_text("x")
    assert h.settle(0.8) == 0


def test_vim_style_delete_and_recreate_is_one_regrade(harness, solution_course):
    h = harness()
    src = solution_course / "src"
    text = (src / "kvcache.py").read_text()
    (src / "4913").write_text("")  # vim probes whether it may create files
    (src / "4913").unlink()
    os.rename(src / "kvcache.py", src / "kvcache.py~")  # backup by rename
    (src / "kvcache.py").write_text(text + "\n")
    (src / "kvcache.py~").unlink()
    h.wait_for(2)
    assert h.settle() == 1
    assert h.regrades[1].result.stages[0].status == "pass"


def test_syntax_error_then_fix_in_one_session(harness, solution_course):
    h = harness()
    target = solution_course / "src" / "kvcache.py"
    good = target.read_text()
    target.write_text(good + "\ndef broken(:\n")
    h.wait_for(2)
    broken = h.regrades[1].result.stages[0]
    assert broken.status == "error" and "syntax error" in broken.cases[0].message
    target.write_text(good)
    h.wait_for(3)
    assert h.regrades[2].result.stages[0].status == "pass"
    assert h.thread.is_alive(), "watch mode must keep watching"


def test_polling_observer_sees_a_save(harness, solution_course):
    h = harness(poll=True)
    time.sleep(0.3)  # the polling observer takes its first snapshot
    touch(solution_course / "src" / "kvcache.py")
    h.wait_for(2)
    assert h.settle() == 1


def test_a_stage_file_change_reloads_the_stages(harness, solution_course):
    h = harness()
    (solution_course / "stages").mkdir()
    (solution_course / "stages" / "broken.toml").write_text("id = 'x'\n")
    h.wait_for(2)
    assert "broken.toml: field" in h.regrades[1].error
    (solution_course / "stages" / "broken.toml").unlink()
    h.wait_for(3)
    assert h.regrades[2].result.stages[0].status == "pass"


@pytest.mark.slow
@pytest.mark.parametrize("poll", [False, True], ids=["inotify", "poll"])
def test_course_renamed_away_then_recreated_waits_then_resumes(harness, solution_course, poll):
    h = harness(poll=poll)
    away = solution_course.with_name("moved-away")
    os.rename(solution_course, away)
    h.wait_for(2)
    assert h.regrades[1].waiting and "is gone (renamed or deleted): waiting for it" in h.regrades[1].error
    touch(away / "src" / "kvcache.py")  # the old directory, now elsewhere, is not graded
    assert h.settle() == 1

    shutil.copytree(away, solution_course)
    h.wait_for(3)
    assert not h.regrades[2].waiting and h.regrades[2].result.stages[0].status == "pass"
    target = solution_course / "src" / "kvcache.py"
    target.write_text(target.read_text() + "\ndef broken(:\n")  # the recreated directory is the one watched
    h.wait_for(4)
    assert h.regrades[3].changed == [str(target)] and h.regrades[3].result.stages[0].status == "error"
    assert h.settle() == 3


@pytest.mark.parametrize(
    "name, relevant",
    [
        ("src/kvcache.py", True),
        ("theinference.toml", True),
        ("stages/x.toml", True),
        ("src/kvcache.py~", False),
        ("src/.kvcache.py.swp", False),
        ("src/4913", False),
        ("src/.#kvcache.py", False),
        ("src/flycheck_kvcache.py", False),
        ("src/__pycache__/a.py", False),
        (".venv/lib/a.py", False),
        ("README.md", False),
    ],
)
def test_relevance_filter(tmp_path, name, relevant):
    assert is_relevant(str(tmp_path / name), tmp_path) is relevant


def test_ctrl_c_exits_cleanly_with_code_0(solution_course, tiny_path):
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "theinference",
            "test",
            "--stage",
            "prove-one-layer",
            "--watch",
            "--weights",
            str(tiny_path),
        ],
        cwd=solution_course,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + scaled(30)  # the first grading: a student process starts
    seen = ""
    while "watching" not in seen and time.monotonic() < deadline:
        seen += proc.stdout.readline()
    assert "✔ prove-one-layer" in seen
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=15)
    assert proc.returncode == 0
    assert "Traceback" not in err and "KeyboardInterrupt" not in err


def test_a_failing_native_observer_suggests_polling(solution_course, tiny_path, monkeypatch, capsys):
    from theinference.grading.drive import watch as watch_module
    from theinference.cli.watch import run_watch

    def refuse(self):
        raise OSError("inotify watch limit reached")

    monkeypatch.setattr(watch_module.Watch, "start_observer", refuse)
    session = open_session(plan_run(solution_course, weights=str(tiny_path)))
    try:
        code = run_watch(Watch(session, ["prove-one-layer"], lambda r: None))
    finally:
        session.close()
    assert code == 2
    err = capsys.readouterr().err
    assert "inotify watch limit reached" in err and "--poll" in err


@pytest.mark.slow
def test_changed_weights_are_reloaded_at_the_next_regrade(solution_course, tiny_dir, tmp_path):
    from theinference.model.synth import write_synthetic

    weights_dir = tmp_path / "weights"
    shutil.copytree(tiny_dir, weights_dir)
    h = Harness(solution_course, weights_dir / "model.safetensors")
    try:
        before = h.session.model.stamp
        write_synthetic(weights_dir, preset="tiny", seed=1)  # not a course file: no re-grade by itself
        assert h.settle(0.3) == 0
        touch(solution_course / "src" / "kvcache.py")
        h.wait_for(2)
        assert h.session.model.stamp != before and not h.session.model.is_stale()
        assert h.regrades[1].result.stages[0].status == "pass"
    finally:
        h.close()


def test_the_waiting_screen_says_what_happened(capsys, tmp_path):
    from theinference.cli.watch import render_regrade
    from theinference.grading.drive.watch import Regrade

    render_regrade(
        Regrade(
            changed=[],
            at=0.0,
            waiting=True,
            error=f"{tmp_path} is gone (renamed or deleted): waiting for it to come back",
        ),
        tmp_path,
    )
    out = capsys.readouterr().out
    assert f"{tmp_path} is gone (renamed or deleted): waiting for it to come back" in out and "graded in" not in out


def test_the_verdict_shows_before_the_fingerprint(tmp_path, tiny_path):
    from theinference.grading.tools.mutants import build_mutant, load_mutant

    mutant = load_mutant(data_dir("course") / "mutants" / "wpe-base-off-by-one" / "manifest.toml")
    course = build_mutant(mutant, data_dir("course") / "solution", tmp_path / "course")
    session = open_session(plan_run(course, weights=str(tiny_path)))
    seen = []

    def snapshot(report):
        seen.append((report.fingerprinting, report.result.stages[0].status, report.result.stages[0].diagnosis.bug))

    try:
        Watch(session, ["prove-one-layer"], snapshot, on_fingerprint=snapshot).regrade([])
    finally:
        session.close()
    assert seen == [(True, "fail", ""), (False, "fail", "wpe-off-by-one")]
