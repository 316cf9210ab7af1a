"""The TypeScript edition where a pipe is inherited as a handle, not an fd number (Windows): the harness reports over a
loopback socket (channels.NodeSocket), the grader reading its pipes with threads. Proven on Linux by forcing both
(THEINFERENCE_NODE_CHANNEL=socket, THEINFERENCE_PIPES=threads) through the real CLI; tests/e2e/test_typescript.py passes
under the same switches too."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import scaled
from theinference.bundled import data_dir
from theinference.proc import channels, protocol
from theinference.proc.node import HARNESS, find_tsx, node_executable

pytestmark = pytest.mark.skipif(node_executable() is None, reason="Node.js is not installed")

TS = data_dir("course") / "ts"
PORTABLE = {"THEINFERENCE_NODE_CHANNEL": "socket", "THEINFERENCE_PIPES": "threads"}

# Each pipe this process holds gets a line that is not JSON: on the events' pipe, that is a protocol break.
FORGE = """
import fs from "node:fs";
function forge() {
  for (const fd of fs.readdirSync("/proc/self/fd")) {
    let target = "";
    try { target = fs.readlinkSync(`/proc/self/fd/${fd}`); } catch { continue; }
    if (target.startsWith("pipe:")) { try { fs.writeSync(Number(fd), "not json\\n"); } catch {} }
  }
}
"""


@pytest.fixture
def portable(monkeypatch):
    for name, value in PORTABLE.items():
        monkeypatch.setenv(name, value)


def _grade(cli, course: Path, weights: Path, stage: str, *extra) -> dict:
    result = cli("test", "--stage", stage, "--course", course, "--weights", weights, "--format", "json", *extra)
    return json.loads(result.stdout)


@pytest.mark.slow
def test_the_ts_solution_passes_over_the_socket_and_the_header_says_so(cli, tmp_path, tiny_path, portable):
    tsx = find_tsx(TS)
    if tsx is None:
        pytest.skip("tsx is not installed for the TypeScript course: run `npm install` at the repository's root")
    course = tmp_path / "ts"
    shutil.copytree(TS / "solution", course, ignore=shutil.ignore_patterns("node_modules"))
    (course / "node_modules").symlink_to(tsx.parents[2], target_is_directory=True)
    doc = _grade(cli, course, tiny_path, "prove-one-layer")
    assert doc["stages"][0]["status"] == "pass"
    assert doc["processes"]["node-channel"].startswith("a loopback socket")
    assert doc["processes"]["pipes"].startswith("a reader thread")


@pytest.mark.linux  # /proc/self/fd
def test_what_the_adapter_writes_into_the_inherited_pipe_is_no_event(cli, tmp_path, tiny_path, monkeypatch):
    """Over the socket, the pipe only says when the worker is gone: lines forged into it are not read as events.
    Over the pipe (Linux's default), the same adapter breaks the protocol, so the events did come by the socket."""
    course = tmp_path / "js"
    (course / "tests").mkdir(parents=True)
    (course / "tests" / "adapters.mjs").write_text(
        FORGE + "export function runSingleStep(ids) { forge(); return new Array(128).fill(0); }\n"
    )
    for name in PORTABLE:
        monkeypatch.delenv(name, raising=False)
    over_pipe = _grade(cli, course, tiny_path, "single-step-attention")["stages"][0]["cases"][0]
    assert over_pipe["status"] == "error" and "broke the result protocol" in over_pipe["message"]
    for name, value in PORTABLE.items():
        monkeypatch.setenv(name, value)
    over_socket = _grade(cli, course, tiny_path, "single-step-attention")["stages"][0]["cases"][0]
    # Zeros, judged as any answer is: a wrong one, not a broken protocol.
    assert over_socket["status"] == "fail" and "protocol" not in over_socket["message"]


@pytest.mark.slow
@pytest.mark.linux  # a signal's name (Windows has none to kill with)
def test_a_crash_a_hang_and_an_exit_are_each_cases_outcome_over_the_socket(cli, tmp_path, tiny_path, portable):
    course = tmp_path / "js"
    (course / "tests").mkdir(parents=True)
    (course / "tests" / "adapters.mjs").write_text(
        "export function runSingleStep(ids) {\n"
        "  if (ids.length === 1) process.kill(process.pid, 'SIGKILL');\n"
        "  if (ids.length === 2) process.exit(3);\n"
        "  for (;;) {}\n"
        "}\n"
    )
    timeout = scaled(2)  # Node starts and the third case is running within it, however busy the machine
    cases = _grade(cli, course, tiny_path, "single-step-attention", "--timeout", timeout)["stages"][0]["cases"]
    assert (cases[0]["status"], cases[0]["message"]) == ("crash", "the adapter's process was killed by SIGKILL")
    assert (cases[1]["status"], cases[1]["message"]) == ("error", "the adapter called process.exit(3)")
    # Timed out while running; or, on a machine too busy to give it its timeout in CPU, ended at the wall-clock
    # backstop and said to be the machine's (clock.backstop_outcome): either way the hang ends, as the student's.
    assert cases[2]["status"] == "timeout", cases[2]
    assert cases[2]["message"].startswith((f"timed out after {timeout:g} s while running", "the machine was too busy"))


@pytest.mark.linux  # pass_fds
def test_a_harness_that_cannot_import_dies_before_it_reports_and_the_stream_ends(tmp_path):
    """No event ever comes (the job file names no adapters that exist and Node exits at once, or before connecting):
    the pipe's end tells the grader, which does not wait for a connection that cannot come."""
    node = channels.NodeSocket()
    read, write = os.pipe()
    node.alive = channels.ThreadPipe(read)
    env = {**os.environ, **node.env, protocol.PROTOCOL_FD_ENV: str(write)}
    proc = subprocess.Popen(
        [node_executable(), str(HARNESS), str(tmp_path / "no-job.json")],
        env=env,
        pass_fds=(write,),
        stderr=subprocess.PIPE,
    )
    os.close(write)
    try:
        chunks = []
        while (chunk := node.read(scaled(30))) not in (b"", None):
            chunks.append(chunk)
        assert chunk == b"" and chunks == []
        assert proc.wait(timeout=scaled(10)) == 1
    finally:
        proc.kill()
        proc.wait()
        node.close()


@pytest.mark.linux  # /proc/self/fd
def test_a_loopback_socket_that_cannot_be_opened_is_a_clear_error_and_leaves_no_fd_open(
    cli, tmp_path, tiny_path, portable, monkeypatch
):
    course = tmp_path / "js"
    (course / "tests").mkdir(parents=True)
    (course / "tests" / "adapters.mjs").write_text("export function runSingleStep(ids) { return []; }\n")

    def refused() -> channels.NodeSocket:
        raise OSError(97, "Address family not supported by protocol")

    cli("test", "--stage", "single-step-attention", "--course", course, "--weights", tiny_path)  # what a run keeps open
    monkeypatch.setattr(channels, "NodeSocket", refused)
    before = set(os.listdir("/proc/self/fd"))
    result = cli("test", "--stage", "single-step-attention", "--course", course, "--weights", tiny_path)
    assert result.exit_code == 2, result.output
    assert "could not open a loopback socket (127.0.0.1) for the TypeScript worker" in result.output
    assert "Traceback" not in result.output
    left = set(os.listdir("/proc/self/fd")) - before
    assert not left, [os.readlink(f"/proc/self/fd/{fd}") for fd in left]


def test_a_cgroup_that_cannot_be_made_after_the_socket_opened_leaves_no_fd_open(
    cli, tmp_path, tiny_path, portable, monkeypatch
):
    from theinference.proc import accounting

    course = tmp_path / "js"
    (course / "tests").mkdir(parents=True)
    (course / "tests" / "adapters.mjs").write_text("export function runSingleStep(ids) { return []; }\n")

    probe = accounting.run_cgroup

    def refused(limits=None):  # the header's probe (no limits) still works: the worker's own cgroup fails
        if limits is None:
            return probe()
        raise accounting.MeterUnavailable("no cgroup can be made here (THEINFERENCE_METER=cgroup)")

    cli("test", "--stage", "single-step-attention", "--course", course, "--weights", tiny_path)  # what a run keeps open
    monkeypatch.setattr(accounting, "run_cgroup", refused)
    before = set(os.listdir("/proc/self/fd"))
    result = cli("test", "--stage", "single-step-attention", "--course", course, "--weights", tiny_path)
    assert result.exit_code == 2, result.output
    assert "no cgroup can be made here" in result.output and "Traceback" not in result.output
    left = set(os.listdir("/proc/self/fd")) - before
    assert not left, [os.readlink(f"/proc/self/fd/{fd}") for fd in left]
