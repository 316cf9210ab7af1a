"""How many BLAS threads the grader's own numpy work uses: theinference.grading.oracle.threads (the oracle's room,
so the oracle cache can ask too), named here for the drivers."""

from theinference.grading.oracle.threads import blas_threads_for_load, busy_blas_limit

__all__ = ["blas_threads_for_load", "busy_blas_limit"]
