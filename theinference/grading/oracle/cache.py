"""OracleCache: every oracle output a session computes, once per (weights file, oracle, case inputs)."""

import threading
import time
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from theinference.grading.oracle.registry import OracleSpec, compute_expected
from theinference.grading.oracle.store import OracleStore, oracle_version
from theinference.grading.oracle.threads import blas_threads_for_load
from theinference.model.weights import Model


class _Stage(Protocol):  # what of a stage spec (theinference.grading.spec.stages.StageSpec) the cache reads
    @property
    def id(self) -> str: ...

    @property
    def oracle(self) -> str: ...


class _Case(Protocol):  # and of one of its cases (CaseSpec)
    @property
    def name(self) -> str: ...

    @property
    def inputs(self) -> dict: ...


@dataclass
class OracleCache:
    """Oracle outputs per (weights file, oracle, case inputs); lives as long as a watch or batch session.

    With a store (trusted runs only: see theinference.grading.oracle.store), outputs also outlive the session.
    """

    entries: dict = field(default_factory=dict)
    costs: dict = field(default_factory=dict)  # key -> CPU seconds its computation took (time.process_time)
    store: OracleStore | None = None
    progress: object = None  # told when an output is computed (slow on the gpt2 shape): start(label), finish(label)
    _locks: dict = field(default_factory=dict, repr=False)  # key -> the lock of the one computing it
    _locks_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def get(self, model: Model, stage: _Stage, spec: OracleSpec, case: _Case) -> np.ndarray:
        key, compute = self._oracle(model, stage, spec, case)
        return self.memo(
            key,
            compute,
            model=model,
            durable=("oracle", stage.oracle, oracle_version(spec.stamp), case.inputs),
            label=f"{stage.id}: {case.name}",
        )

    def cost(self, model: Model, stage: _Stage, spec: OracleSpec, case: _Case) -> float:
        """CPU seconds the oracle takes for the case (what a case's CPU budget is made from: spec.timeouts). Timed
        as the output is computed; an output the store kept was not computed here, so it is computed once more."""
        key, compute = self._oracle(model, stage, spec, case)
        self.get(model, stage, spec, case)
        if key not in self.costs:
            self._timed(key, _on_threads_for_load(compute))()
        return self.costs[key]

    @staticmethod
    def _oracle(model: Model, stage: _Stage, spec: OracleSpec, case: _Case):
        inputs = tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in case.inputs.items())
        key = (str(model.path), model.stamp, stage.oracle, spec.stamp, inputs)
        return key, lambda: compute_expected(spec, model, case.inputs, f"stage '{stage.id}'", case.name)

    def memo(self, key: tuple, compute, model: Model | None = None, durable: tuple = (), label: str = "") -> np.ndarray:
        """Any output computed from these weights (the oracle's, a bug oracle's), once per key.

        durable: what besides the weights' content determines the output (the oracle's name and version, the
        inputs); given with model, the output is also kept in the store across runs. Submissions graded in
        parallel (`grade --jobs`) that need the same output wait for the one computing it.
        """
        if key in self.entries:
            return self.entries[key]
        with self._locks_lock:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            if key not in self.entries:
                counted = self._counted(self._timed(key, _on_threads_for_load(compute)), label)
                if self.store is not None and model is not None and durable:
                    self.entries[key] = self.store.output(model, durable, counted)
                else:
                    self.entries[key] = counted()
        with self._locks_lock:
            self._locks.pop(key, None)
        return self.entries[key]

    def _timed(self, key: tuple, compute):
        """compute, its CPU kept in costs: the grader's whole process (BLAS's threads too, as the student's tree is
        counted whole); submissions graded in parallel add theirs, which only makes a budget more generous."""

        def run():
            before = time.process_time()
            value = compute()
            self.costs[key] = time.process_time() - before
            return value

        return run

    def _counted(self, compute, label: str):
        def run():
            if self.progress is None or not label:
                return compute()
            self.progress.start(label)
            try:
                return compute()
            finally:
                self.progress.finish(label)

        return run


def _on_threads_for_load(compute):
    """compute with BLAS on one thread if the machine is busy (grading/oracle/threads.py; measured with
    bench/oracle_threads.py), when asked from the main thread (test, watch, a batch's warm-up). Submissions graded
    in parallel threads leave BLAS as it is: its thread count is the whole process's, and blocks of several threads
    that overlap would undo each other's. Only ever in the grader's process: no student's process holds this cache."""

    def run():
        if threading.current_thread() is not threading.main_thread():
            return compute()
        with blas_threads_for_load():
            return compute()

    return run
