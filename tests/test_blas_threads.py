"""The oracle's outputs are computed with BLAS on one thread on a busy machine (bench/oracle_threads.py), as
fingerprinting is (bench/fingerprint_threads.py), and numpy's default is back once computed."""

import os
import threading

import numpy as np
import pytest
from threadpoolctl import threadpool_info  # type: ignore[import-untyped]

from theinference.grading.oracle.cache import OracleCache


def blas() -> list[int]:
    return [pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"]


@pytest.fixture
def default() -> list[int]:
    found = blas()
    if not found or max(found) == 1:
        pytest.skip("numpy runs BLAS on one thread here already: nothing to tell apart")
    return found


def busy(monkeypatch, yes: bool) -> None:
    load = 100.0 if yes else 0.0
    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load), raising=False)  # Windows has none


def test_the_oracle_cache_computes_on_one_blas_thread_only_on_a_busy_machine(monkeypatch, default):
    cache, seen = OracleCache(), {}

    def compute(name):
        def run():
            seen[name] = blas()
            return np.zeros(1)

        return run

    busy(monkeypatch, False)
    cache.memo(("quiet",), compute("quiet"))
    busy(monkeypatch, True)
    cache.memo(("busy",), compute("busy"), label="stage: case")
    assert seen == {"quiet": default, "busy": [1] * len(default)}
    assert blas() == default


def test_the_oracle_cache_leaves_blas_as_it_is_in_a_thread_grading_one_submission_of_several(monkeypatch, default):
    """grade --jobs: BLAS's thread count is the process's, so a worker thread does not change it under the others."""
    busy(monkeypatch, True)
    cache, seen = OracleCache(), {}

    def compute():
        seen["worker"] = blas()
        return np.zeros(1)

    worker = threading.Thread(target=lambda: cache.memo(("key",), compute))
    worker.start()
    worker.join(20)
    assert seen == {"worker": default}
