"""Every runner outcome, produced by a small deliberately broken adapter, through the real CLI."""

import json
import os
import time
from pathlib import Path

import pytest

from conftest import scaled, write_adapters

QUICK_STAGE = """\
format_version = 1
id = "quick-layer"
title = "Layer 0, two quick cases"
order = 1
lesson = "none.md"
adapter = "run_layer_equiv"
oracle = "layer0-attn-sublayer"
compare = "rows"
timeout = 30
points = 1

[tolerance]
atol = 1e-4
rtol = 1e-3

[[case]]
name = "one"
seq = [464]

[[case]]
name = "three"
seq = [464, 2068, 7586]
"""

SOLUTION_IMPORTS = """\
import numpy as np
import theinference
from src.gpt2 import load_weights
from src.kvcache import layer_attn_incremental

def _solve(seq_ids):
    params, n_head = load_weights(theinference.weights_path())
    return layer_attn_incremental(params, seq_ids, n_head)
"""


def quick_stage_dir(tmp_path: Path) -> Path:
    """A --stages-dir holding only QUICK_STAGE."""
    stages = tmp_path / "extra-stages"
    stages.mkdir()
    (stages / "quick.toml").write_text(QUICK_STAGE)
    return stages


@pytest.fixture(params=["zygote", "subprocess", "threads"])
def launcher(request, monkeypatch):
    """Every outcome is checked with both ways of starting the student's process, and with the grader reading the
    events' pipe with a thread, as where select takes sockets only (Windows: THEINFERENCE_PIPES=threads)."""
    if request.param == "threads":
        monkeypatch.setenv("THEINFERENCE_PIPES", "threads")
        monkeypatch.setenv("THEINFERENCE_LAUNCHER", "subprocess")
    else:
        monkeypatch.setenv("THEINFERENCE_LAUNCHER", request.param)
    return request.param


@pytest.fixture
def grade_quick(tmp_path, tiny_path, cli, launcher):
    """Write adapters into a fresh course, grade the quick stage; return (exit code, stage JSON, rich text)."""
    stages = quick_stage_dir(tmp_path)

    def run(source: str, *extra):
        course = tmp_path / "course"
        write_adapters(course, source)
        args = [
            "test",
            "--course",
            course,
            "--weights",
            tiny_path,
            "--stages-dir",
            stages,
            "--stage",
            "quick-layer",
            *extra,
        ]
        as_json = cli(*args, "--format", "json")
        rich = cli(*args)
        assert as_json.exit_code == rich.exit_code
        return as_json.exit_code, json.loads(as_json.stdout)["stages"][0], rich.stdout

    return run


def test_solution_passes(grade_quick):
    code, stage, text = grade_quick(SOLUTION_IMPORTS + "def run_layer_equiv(seq_ids):\n    return _solve(seq_ids)\n")
    assert code == 0
    assert stage["status"] == "pass" and [c["status"] for c in stage["cases"]] == ["pass", "pass"]
    assert "✔ quick-layer" in text


def test_camel_case_alias_and_nested_lists_of_float64_are_accepted(grade_quick):
    code, stage, _ = grade_quick(
        SOLUTION_IMPORTS + "def runLayerEquiv(seq_ids):\n    return _solve(seq_ids).astype(np.float64).tolist()\n"
    )
    assert (code, stage["status"]) == (0, "pass")


def test_not_implemented_is_not_started(grade_quick):
    code, stage, text = grade_quick("def run_layer_equiv(seq_ids):\n    raise NotImplementedError\n")
    assert code == 1
    assert stage["status"] == "not-started"
    assert "not started: run_layer_equiv() in" in text and "raises NotImplementedError" in text


def test_syntax_error(grade_quick):
    code, stage, text = grade_quick("def run_layer_equiv(seq_ids)\n    return 1\n")
    assert code == 1
    case = stage["cases"][0]
    assert case["status"] == "error"
    assert "syntax error in" in case["message"] and "adapters.py, line 1" in case["message"]
    assert "SyntaxError" in text


def test_import_error_shows_the_students_line(grade_quick):
    code, stage, text = grade_quick("import numpy\nimport no_such_module_xyz\n")
    case = stage["cases"][1]
    assert (code, case["status"]) == (1, "error")
    assert "ModuleNotFoundError" in case["message"] and "no_such_module_xyz" in case["message"]
    assert 'adapters.py", line 2' in case["traceback"]
    assert "importlib" not in case["traceback"]


def test_missing_function_names_expected_name_and_aliases(grade_quick):
    code, stage, text = grade_quick("def run_layer(seq_ids):\n    return []\n")
    assert code == 1
    assert (
        stage["cases"][0]["message"]
        == "adapters.py defines no function 'run_layer_equiv' (also accepted: runLayerEquiv)"
    )
    assert "defines no function 'run_layer_equiv'" in text


def test_exception_traceback_is_the_students_only(grade_quick):
    code, stage, text = grade_quick(
        "def helper(x):\n    raise ValueError(f'bad {x}')\n\ndef run_layer_equiv(seq_ids):\n    return helper(len(seq_ids))\n"
    )
    case = stage["cases"][1]
    assert (code, case["status"], case["message"]) == (1, "error", "ValueError: bad 3")
    assert "in helper" in case["traceback"] and "in run_layer_equiv" in case["traceback"]
    assert "theinference" not in case["traceback"] and "child.py" not in case["traceback"]
    assert "ValueError: bad 3" in text


def test_wrong_shape_says_expected_and_got(grade_quick):
    code, stage, text = grade_quick(
        "import numpy as np\ndef run_layer_equiv(seq_ids):\n    return np.zeros((len(seq_ids), 7))\n"
    )
    case = stage["cases"][1]
    assert (code, case["status"], case["detail"]) == (1, "fail", "wrong-shape")
    assert case["message"] == "expected shape [3, 128], got [3, 7]"
    assert "expected shape [3, 128], got [3, 7]" in text


@pytest.mark.parametrize("value", ["'hello'", "[[1.0, 2.0], [3.0]]", "{'a': 1}", "None"])
def test_non_numeric_output(grade_quick, value):
    code, stage, text = grade_quick(f"def run_layer_equiv(seq_ids):\n    return {value}\n")
    case = stage["cases"][0]
    assert (code, case["status"], case["detail"]) == (1, "fail", "non-numeric")
    assert "not" in case["message"] and ("numeric" in case["message"] or "array of numbers" in case["message"])


def test_nan_output_fails_with_nonfinite_rows(grade_quick):
    code, stage, _ = grade_quick(
        SOLUTION_IMPORTS
        + "def run_layer_equiv(seq_ids):\n    out = _solve(seq_ids)\n    out[-1, 5] = np.nan\n    return out\n"
    )
    case = stage["cases"][1]
    assert (code, case["status"]) == (1, "fail")
    assert [r["ok"] for r in case["rows"]] == [True, True, False]
    assert case["rows"][2]["n_nonfinite"] == 1 and case["rows"][2]["max_abs"] == "inf"
    assert case["diagnosis"]["shape"] == "nonfinite-row"


@pytest.mark.slow
def test_timeout_kills_the_child_and_its_children(grade_quick, tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    source = (
        "import subprocess, time\n"
        "def run_layer_equiv(seq_ids):\n"
        f"    p = subprocess.Popen(['sleep', '300'])\n"
        f"    open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
        "    time.sleep(300)\n"
    )
    timeout = scaled(1)  # the process starts (a fresh interpreter with the subprocess launcher) within it
    started = time.monotonic()
    code, stage, text = grade_quick(source, "--timeout", timeout)
    # Two runs (json + rich) of a timeout each, not the sleepers' 300 s: returning before half of that shows the
    # grader did not wait for them, however busy the machine.
    assert time.monotonic() - started < 150
    assert (code, stage["status"]) == (1, "timeout")
    assert stage["cases"][0]["message"] == f"timed out after {timeout:g} s while running"
    grandchild = int(pid_file.read_text())
    time.sleep(0.2)
    assert not _alive(grandchild), "the adapter's own child process was left running"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (killed, waiting to be reaped by init) counts as dead.
    status = Path(f"/proc/{pid}/status")
    return status.exists() and "State:\tZ" not in status.read_text()


def test_crash_names_the_signal_and_later_cases_still_run(grade_quick):
    code, stage, text = grade_quick(
        SOLUTION_IMPORTS + "import os, signal\n"
        "def run_layer_equiv(seq_ids):\n"
        "    if len(seq_ids) == 1:\n"
        "        os.kill(os.getpid(), signal.SIGSEGV)\n"
        "    return _solve(seq_ids)\n"
    )
    first, second = stage["cases"]
    assert (code, stage["status"]) == (1, "crash")
    assert first["status"] == "crash" and "SIGSEGV" in first["message"]
    assert second["status"] == "pass"
    assert "crashed" in text and "SIGSEGV" in text


def test_hard_exit_is_a_crash_and_sys_exit_an_error(grade_quick):
    code, stage, _ = grade_quick("import os\ndef run_layer_equiv(seq_ids):\n    os._exit(7)\n")
    assert stage["cases"][0]["status"] == "crash"
    assert "exited with code 7" in stage["cases"][0]["message"]
    code, stage, _ = grade_quick("import sys\ndef run_layer_equiv(seq_ids):\n    sys.exit(3)\n")
    assert stage["cases"][0]["status"] == "error"
    assert "sys.exit(3)" in stage["cases"][0]["message"]


def test_students_prints_are_captured_per_case(grade_quick):
    code, stage, text = grade_quick(
        "import sys\ndef run_layer_equiv(seq_ids):\n"
        "    print(f'debug {len(seq_ids)}')\n    print('warn', file=sys.stderr)\n    raise RuntimeError('x')\n"
    )
    assert code == 1
    assert [c["stdout"] for c in stage["cases"]] == ["debug 1\n", "debug 3\n"]
    assert [c["stderr"] for c in stage["cases"]] == ["warn\n", "warn\n"]
    # The two cases fail alike: the report shows the traceback once.
    assert text.count("RuntimeError: x") == 2 and "same error as case one" in text


GREEDY_STAGE = """\
format_version = 1
id = "quick-greedy"
title = "Greedy, one quick case"
order = 2
lesson = "none.md"
adapter = "run_greedy"
oracle = "greedy"
compare = "tokens"
timeout = 30
points = 1

[tie]
rtol = 1e-4

[[case]]
name = "four"
prompt = [464, 2068]
n_new = 4
"""


def test_greedy_mismatch_marks_the_step_and_shows_both_paths(tmp_path, tiny_path, tiny_model, cli):
    from theinference.model import gpt2 as oracle

    expected = oracle.greedy(tiny_model.params, [464, 2068], 4, tiny_model.config.n_head)
    wrong = expected[:2] + [(expected[2] + 1) % 50257, expected[3]]
    (tmp_path / "stages").mkdir()
    (tmp_path / "stages" / "g.toml").write_text(GREEDY_STAGE)
    write_adapters(tmp_path / "course", f"def run_greedy(prompt_ids, n_new):\n    return {wrong}\n")
    args = [
        "test",
        "--course",
        tmp_path / "course",
        "--weights",
        tiny_path,
        "--stages-dir",
        tmp_path / "stages",
        "--stage",
        "quick-greedy",
    ]
    doc = json.loads(cli(*args, "--format", "json").stdout)
    case = doc["stages"][0]["cases"][0]
    assert case["status"] == "fail" and case["got_tokens"] == wrong
    assert [s["verdict"] for s in case["steps"]] == ["match", "match", "mismatch"]
    assert case["expected_tokens"][:3] == expected[:3]
    assert case["diagnosis"]["shape"] == "token-mismatch"
    text = cli(*args).stdout
    assert "◀ first mismatch" in text and "step 3 generated" in text  # the third token, counted from one


def test_a_launch_that_fails_leaves_no_descriptor_open(tmp_path, tiny_path):
    """A setup error at launch (no TypeScript runner, say) is raised; every pipe the run opened is closed."""
    from theinference.errors import ConfigError
    from theinference.proc.runner import AdapterJob, run_all
    from theinference.proc.sandbox import basic_isolation

    class Refusing:
        isolation = basic_isolation()

        def start(self, *args, **kwargs):
            raise ConfigError("no runner for these adapters")

        def finished(self, cwd):  # the launcher's after-run cleanup (what the submission's uid left behind)
            pass

    adapters = write_adapters(tmp_path / "course", "def run_single_step(ids):\n    return ids\n")
    job = AdapterJob(
        course_root=tmp_path / "course",
        adapters=adapters,
        names=("run_single_step",),
        calls=(([464],),),
        weights=tiny_path,
        timeout=10,
        launcher=Refusing(),  # type: ignore[arg-type]
    )
    before = set(os.listdir("/proc/self/fd"))
    for _ in range(3):
        with pytest.raises(ConfigError, match="no runner"):
            run_all(job)
    assert set(os.listdir("/proc/self/fd")) == before
