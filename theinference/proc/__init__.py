"""Student processes: how they are started, confined, limited, timed and killed.

    grader (runner.py) ──job.json──▶ zygote (zygote.py, numpy pre-imported; or a fresh interpreter)
       ▲                                  │ fork
       │ protocol pipe (JSON lines:       ▼
       │ ready / case / done / error)  monitor (reaper.py: subreaper, kills every descendant)
       │                                  │ exec
       └──────────── case-<i>.npy ◀──── worker (child.py: imports the student's adapters, calls them)

Channels: the job file (arguments, limits, cases) goes down; events come back up one JSON object a
line on the pipe whose fd is in THEINFERENCE_PROTOCOL_FD; arrays come back as .npy files in the
run's output directory; stdout/stderr go to files the grader slices per case.

The worker side (child.py, timing.py) is copied into the sandbox's stub package, so it, this
file and everything it imports must stay stdlib-only. Nothing in `proc` imports grading, reports
or the CLI.
"""
