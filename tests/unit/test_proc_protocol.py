"""proc/protocol.py: the grader ↔ student-process protocol both ends of the pipe import."""

import os

import pytest

from theinference.proc import protocol


def test_events_and_statuses_are_distinct_words():
    assert protocol.EVENTS == ("loaded", "load-error", "start", "done")
    assert protocol.DONE_STATUSES == ("ok", "not-started", "error", "bad-output")
    # what the runner concludes itself is never a status the worker may send
    assert not {protocol.TOO_LARGE, protocol.TIMEOUT, protocol.CRASH} & set(protocol.DONE_STATUSES)


def test_the_job_and_limits_fields_are_what_the_worker_reads():
    assert set(protocol.Job.__annotations__) == {
        "course_root", "adapters", "names", "calls", "start", "out_dir", "interactive", "limits",
    }  # fmt: skip
    assert set(protocol.Limits.__annotations__) == {"memory_bytes", "file_bytes", "shares_uid", "seal"}


@pytest.mark.skipif(os.name != "posix", reason="POSIX hands fds on by number")
def test_a_pipe_handed_on_is_found_again_by_its_token():
    read, write = os.pipe()
    try:
        assert protocol.handed_on([read], [write]) == {"pass_fds": (read, write)}
        found = protocol.inherited(protocol.token(write), os.O_WRONLY)
        assert found == write
        os.write(found, b'{"event": "loaded"}\n')
        assert os.read(read, 100) == b'{"event": "loaded"}\n'
    finally:
        os.close(read)
        os.close(write)
