"""Benchmark: how far a submission gets past the run directory's quota before it is stopped, per level.

    python bench/run_dir_quota.py [--quota-mb 8] [--fill-mb 256] [--runs 3]

Grades, side by side in one run, an adapter that writes FILL_MB files of 1 MB each into its $TMPDIR under a quota
of QUOTA_MB (THEINFERENCE_RUN_DIR_MB), at each level this machine has: `sandbox` (`test --untrusted` under
bubblewrap: a tmpfs of the quota's size), `zygote` (plain `test`) and `no-bwrap` (untrusted with neither bwrap nor
unshare on PATH; as root, by consent). A thread samples the bytes under the grader's TMPDIR (where run directories
are made) every 2 ms; the largest sample is a lower bound of what reached the grader's disk, printed as a ratio to
the quota, with each run's verdict.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from theinference.bundled import data_dir
from theinference.model.synth import write_synthetic
from theinference.proc.sandbox import strongest_isolation

FILLER = """\
import os, tempfile, uuid

def run_layer_equiv(seq_ids):
    where, chunk = tempfile.gettempdir(), os.urandom(1 << 20)
    for _ in range({fill}):
        with open(os.path.join(where, f"fill-{{uuid.uuid4()}}"), "wb") as f:
            f.write(chunk)
    raise RuntimeError("wrote {fill} MB")
"""


def _bytes_under(directory: str) -> int:
    total = 0
    for root, _, files in os.walk(directory):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def peak_while(command: list[str], env: dict, directory: str) -> tuple[int, str]:
    """Run command; the largest total seen under directory meanwhile, and the first case's message."""
    peak, stop = [0], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], _bytes_under(directory))
            time.sleep(0.002)

    sampler = threading.Thread(target=sample)
    sampler.start()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    stop.set()
    sampler.join()
    try:
        message = json.loads(done.stdout)["stages"][0]["cases"][0]["message"]
    except (ValueError, KeyError, IndexError):
        message = f"exit {done.returncode}: {done.stderr.strip()[-200:]}"
    return peak[0], message


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quota-mb", type=int, default=8)
    parser.add_argument("--fill-mb", type=int, default=256)
    parser.add_argument("--runs", type=int, default=3)
    options = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ti-bench-"))
    try:
        write_synthetic(work / "tiny", preset="tiny", seed=0)
        course = work / "course"
        shutil.copytree(data_dir("course") / "solution" / "src", course / "src")
        (course / "tests").mkdir()
        (course / "tests" / "adapters.py").write_text(FILLER.format(fill=options.fill_mb))
        levels = ["zygote", "no-bwrap"]
        if strongest_isolation(allow_root=True).level == "sandbox":
            levels.insert(0, "sandbox")
        for level in levels:
            for _ in range(options.runs):
                tmp = tempfile.mkdtemp(prefix="ti-q-", dir=work)
                env = {**os.environ, "TMPDIR": tmp, "THEINFERENCE_RUN_DIR_MB": str(options.quota_mb)}
                if level != "zygote":
                    env["CI"] = "true"
                if level == "no-bwrap":
                    env |= {"PATH": str(Path(sys.executable).parent), "THEINFERENCE_ALLOW_ROOT": "1"}
                command = [sys.executable, "-m", "theinference", "test", "--course", str(course), "--weights"]
                command += [str(work / "tiny" / "model.safetensors"), "--stage", "prove-one-layer", "--format", "json"]
                peak, message = peak_while(command, env, tmp)
                ratio = peak / (options.quota_mb * 2**20)
                print(
                    f"{level:9} peak on the grader's disk {peak / 2**20:6.1f} MB = {ratio:4.1f}x the quota | {message[:70]}"
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
