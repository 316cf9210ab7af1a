"""proc/channels.py: the grader's end of a worker's event pipe."""

import os

from theinference.proc.channels import SelectPipe


def test_a_pipe_closed_twice_leaves_a_file_opened_meanwhile_alone():
    read, write = os.pipe()
    channel = SelectPipe(read)
    os.write(write, b"hello")
    assert channel.read(1.0) == b"hello"
    channel.close()  # a stopped worker's runner finishes it...
    other, other_write = os.pipe()  # ...the grader opens something (the lowest free number: read's)...
    try:
        channel.close()  # ...and the session closes the channel again
        os.fstat(other)  # still open
        assert channel.read(0.0) == b""  # closed reads as the end of the stream
    finally:
        for fd in (write, other, other_write):
            os.close(fd)
