"""theinference: the grader for the course *Build your own KV cache*."""

# The sandbox copies this file as the `theinference` that student code sees: keep it free of
# imports from the package (theinference.proc.sandbox).
import os

__version__ = "0.1.0"

WEIGHTS_ENV = "THEINFERENCE_WEIGHTS"


def weights_path() -> str:
    """Return the absolute path of the model.safetensors the grader grades against."""
    path = os.environ.get(WEIGHTS_ENV)
    if not path:
        raise RuntimeError(
            f"{WEIGHTS_ENV} is not set: theinference sets it when it runs your adapters; "
            "to run your code by hand, export it (see `theinference weights`)."
        )
    return path
