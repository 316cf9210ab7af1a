"""Benchmark: what confinement costs per student process.

    python bench/sandbox.py [--runs 15]

Runs a trivial adapter (imports numpy, returns one number) once per student process, through
the runner, with each launcher in the same run: the zygote fork (the student's own loop), a
fresh interpreter under the subreaper monitor, and a fresh interpreter in the bubblewrap
sandbox (when this machine has one). Prints the median and p90 wall time per process and the
ratios to the zygote and to the fresh interpreter: the sandbox's own overhead is the last.
"""

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from theinference.proc.launch import SubprocessLauncher, ZygoteLauncher
from theinference.proc.runner import AdapterJob, run_all
from theinference.proc.sandbox import strongest_isolation

ADAPTER = "import numpy as np\n\ndef run_layer_equiv(seq_ids):\n    return np.zeros(1)\n"


def measure(launcher, course: Path, weights: Path, runs: int) -> list[float]:
    """Wall seconds of one student process (start, import, one call, exit, reap), `runs` times."""
    job = AdapterJob(
        course_root=course,
        adapters=course / "tests" / "adapters.py",
        names=("run_layer_equiv",),
        calls=((1,),),
        weights=weights,
        timeout=60,
        launcher=launcher,
    )
    run_all(job)  # warm up (the zygote starts, files are cached)
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        outcome = run_all(job)[0]
        samples.append(time.perf_counter() - started)
        assert outcome.status == "ok", outcome.message
    launcher.close()
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        course, weights = Path(tmp) / "course", Path(tmp) / "model.safetensors"
        (course / "tests").mkdir(parents=True)
        (course / "tests" / "adapters.py").write_text(ADAPTER)
        weights.write_bytes(b"")  # the adapter never reads it; the sandbox only binds its directory
        isolation = strongest_isolation()
        launchers = {"zygote (fork)": ZygoteLauncher(), "fresh interpreter": SubprocessLauncher()}
        if isolation.level == "sandbox":
            launchers["sandbox (bwrap)"] = SubprocessLauncher(isolation)
        results = {
            name: statistics.median(measure(launcher, course, weights, args.runs))
            for name, launcher in launchers.items()
        }
        for name, median in results.items():
            print(f"{name:18s} median {median * 1000:7.1f} ms per student process")
        base, fresh = results["zygote (fork)"], results["fresh interpreter"]
        print(f"fresh interpreter / zygote: {fresh / base:.2f}x")
        if "sandbox (bwrap)" in results:
            sandboxed = results["sandbox (bwrap)"]
            print(
                f"sandbox / zygote: {sandboxed / base:.2f}x · sandbox / fresh interpreter: {sandboxed / fresh:.2f}x "
                f"(+{(sandboxed - fresh) * 1000:.0f} ms per process)"
            )
        else:
            print(f"no sandbox here: {isolation.summary}")


if __name__ == "__main__":
    main()
