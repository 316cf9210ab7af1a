"""Student processes: how they are started, confined, limited, timed and killed.

    grader   runner.py: writes the job file (protocol.Job), starts a worker through a Launcher
      │        (launch.py), reads its events, loads its arrays, enforces the timeouts
      │ launcher.start()
      ▼
    zygote   zygote.py: numpy pre-imported, forks per run on a Unix-socket request
      │        ({"pid"}, then {"status"} back); or a fresh `python -m theinference.proc.reaper`
      │ fork
      ▼
    monitor  reaper.py: a child subreaper; reports the exit status only after killing every
      │        process the worker left behind
      │ fork (under bubblewrap for untrusted work: sandbox.py)
      ▼
    worker   child.py: applies the limits, imports the student's tests/adapters.py, calls it

Channels: the job file goes down; events come up, one JSON object a line, on the pipe whose fd
is in protocol.PROTOCOL_FD_ENV (loaded | load-error, then start and done per case); each array
comes back as case-<i>.npy in the run's directory; stdout and stderr go to files the grader
slices per case. interrupt.py kills every live process group on Ctrl-C or SIGTERM.
The grader reads its pipes through channels.py: with select where select takes pipes (POSIX), else a
reader thread per pipe (Windows). A Node worker that cannot open a pipe by its fd number (Windows
hands on handles) connects to a loopback socket instead and says a one-time token first
(channels.NodeSocket); the pipe then only says when the worker is gone.

Holds: a worker runs no student code before the grader knows its pid. A forked one waits before
its exec (reaper.fork_held); one started with subprocess (no fork) waits on the pipe in
protocol.GO_FD_ENV (reaper.popen_held) and exits unrun if its monitor dies first. The monitor's
first line ({"pid"}, and {"mark"} where no subreaper keeps its orphans) is sent before that
release, so the grader may trust it: if student code kills the monitor, the grader kills the
worker's group and, without a subreaper, every process that carries the mark (launch.py).

The worker side (child.py, protocol.py, this file) is copied into the sandbox's stub
package (sandbox.STUB_FILES), so it imports only the standard library. Nothing in `proc`
imports grading, reports or the CLI (tests/test_architecture.py).
"""
