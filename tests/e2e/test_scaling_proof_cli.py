"""What a cache-scaling verdict rests on, through the real CLI: the reference cache counted by a meter that misses
processes (forced with THEINFERENCE_METER=proc, the instructor's switch, and the worker left unsealed with
THEINFERENCE_SEAL=0) earns no credit in grading mode and passes as a self-check in plain `test`; sealed, the same
count misses nothing and is a grade of record. A cache whose work runs in children nobody waits for fails as
tampering on an unsealed tree, passes where a cgroup counts it (it is a cache: only where its CPU went was hidden),
and cannot even start on a sealed one. The rules themselves are tested on built inputs in test_scaling_proof.py."""

import json
import os
import sys
from pathlib import Path

import pytest

from conftest import write_adapters, write_quick_scaling_stage

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from scaling_subjects import SOLUTION_CACHE  # noqa: E402

# The reference cache, run in a child per call that nobody waits for: with SIGCHLD ignored the kernel reaps it, and
# a process tree's count loses its CPU when it ends.
UNWAITED_CHILD = (
    SOLUTION_CACHE.replace("def run_greedy(", "def _cached(")
    + """
import signal

signal.signal(signal.SIGCHLD, signal.SIG_IGN)


def run_greedy(prompt_ids, n_new):
    _model()  # loaded here, so the child only computes
    read, write = os.pipe()
    if os.fork() == 0:
        os.close(read)
        os.write(write, ",".join(map(str, _cached(prompt_ids, n_new))).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        data = pipe.read().decode()
    print("unwaited child: done", flush=True)
    return [int(t) for t in data.split(",")]
"""
)


@pytest.fixture
def quick(tmp_path, proof_cache, monkeypatch):
    monkeypatch.setenv("THEINFERENCE_CACHE", str(proof_cache))  # the proof preset, made once per session
    return write_quick_scaling_stage(tmp_path / "quick-stages")


def _grade(cli, course, tiny_path, quick, *extra):
    result = cli(
        "test", "--course", course, "--weights", tiny_path, "--stages-dir", quick, "--stage", "quick-scaling",
        "--format", "json", *extra,
    )  # fmt: skip
    return result.exit_code, json.loads(result.stdout)


@pytest.mark.slow
def test_the_reference_cache_on_a_process_tree_is_unproven_in_grading_mode_and_a_self_check_in_test(
    cli, tmp_path, tiny_path, quick, monkeypatch
):
    monkeypatch.setenv("THEINFERENCE_METER", "proc")
    course = tmp_path / "cache"
    write_adapters(course, SOLUTION_CACHE)
    code, doc = _grade(cli, course, tiny_path, quick, "--untrusted")
    case = doc["stages"][0]["cases"][0]  # sealed (the default): the tree's count misses no process
    assert code == 0 and case["status"] == "pass" and case["scaling"]["guarantee"] == "record", case["message"]
    assert case["scaling"]["accounting"] == "process tree (/proc), sealed: no process of it can be reaped unseen"

    monkeypatch.setenv("THEINFERENCE_SEAL", "0")
    code, doc = _grade(cli, course, tiny_path, quick, "--untrusted")
    stage = doc["stages"][0]
    case = stage["cases"][0]
    assert code == 1 and stage["status"] == "unproven" and stage["points"] == 0, case["message"]
    t = case["scaling"]
    assert t["accounting"] == "process tree (/proc)" and t["accounting_complete"] is False
    assert t["guarantee"] == "unprovable" and "run the grader as root" in case["message"]
    assert t["ratio"] <= t["max_ratio"] and t["fraction_of_recompute"] <= t["max_fraction"]  # it would have passed

    code, doc = _grade(cli, course, tiny_path, quick)
    case = doc["stages"][0]["cases"][0]
    # What the terminal says of a self-check is read off a built result (test_scaling_proof.py), not a fourth grading.
    assert code == 0 and case["status"] == "pass" and case["scaling"]["guarantee"] == "self-check"
    assert case["scaling"]["accounting"] == "process tree (/proc)" and case["scaling"]["accounting_complete"] is False


@pytest.mark.slow
@pytest.mark.skipif(getattr(os, "geteuid", lambda: -1)() != 0, reason="a cgroup is made by root here")
def test_work_in_unwaited_children_is_tampering_on_a_process_tree_and_counted_by_a_cgroup(
    cli, tmp_path, tiny_path, quick, monkeypatch
):
    course = tmp_path / "unwaited"
    write_adapters(course, UNWAITED_CHILD)
    monkeypatch.setenv("THEINFERENCE_METER", "proc")
    code, doc = _grade(cli, course, tiny_path, quick)  # sealed: SIGCHLD cannot be ignored
    case = doc["stages"][0]["cases"][0]
    assert code == 1 and case["status"] == "error" and "Operation not permitted" in case["message"], case["message"]

    monkeypatch.setenv("THEINFERENCE_SEAL", "0")
    monkeypatch.delenv("THEINFERENCE_METER")
    code, doc = _grade(cli, course, tiny_path, quick)
    case = doc["stages"][0]["cases"][0]
    assert code == 0 and case["scaling"]["guarantee"] == "record", case["message"]  # a cgroup counts the children

    monkeypatch.setenv("THEINFERENCE_METER", "proc")
    code, doc = _grade(cli, course, tiny_path, quick)
    case = doc["stages"][0]["cases"][0]
    assert code == 1 and case["status"] == "fail" and "unwaited child: done" in case["stdout"]
    assert case["diagnosis"]["shape"] == "cost-tampered", case["message"]
    assert "no cache costs less than" in case["message"] or "fell by" in case["message"]
