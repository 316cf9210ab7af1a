"""Timing a generation adapter at several lengths, inside the student's process (cache-scaling).

Runs in the student's process (imported by theinference.proc.child before the student's code). It
measures process CPU time with BLAS held to one thread, so a busy machine slows every length
alike and the ratio between lengths stays put; wall time and extra BLAS threads would not.
Like child.py it is copied into the sandbox's stub package: it must import nothing from theinference.
"""

import time


def _blas_threads() -> list[dict]:
    from threadpoolctl import threadpool_info  # type: ignore[import-untyped]

    return [
        {"api": p.get("internal_api", p.get("user_api", "?")), "threads": p["num_threads"]} for p in threadpool_info()
    ]


def measure(func, prompt: list[int], lengths: list[int], repeats: int) -> tuple[object, dict]:
    """Call func(prompt, n) for each n in lengths, `repeats` times each after a warm-up call.

    Returns (the value of the last call at the longest length, {"seconds": best CPU seconds per
    length, "blas": the BLAS pools and their thread counts while timing}).
    """
    from threadpoolctl import threadpool_limits

    func(prompt, lengths[0])  # the first call loads weights and warms caches: not timed
    best, value = [float("inf")] * len(lengths), None
    # The limit is applied after the warm-up, when the student's numpy (and its BLAS) is loaded.
    with threadpool_limits(limits=1):
        blas = _blas_threads()
        for _ in range(repeats):  # lengths interleaved: a burst of load hits each of them alike
            for i, n in enumerate(lengths):
                started = time.process_time()
                value = func(prompt, n)
                best[i] = min(best[i], time.process_time() - started)
    return value, {"seconds": best, "blas": blas}


def single_thread_cpu(fn) -> tuple[object, float]:
    """fn() with BLAS on one thread -> (its value, the process CPU seconds it took)."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1):
        started = time.process_time()
        value = fn()
        return value, time.process_time() - started
