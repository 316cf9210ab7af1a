"""Benchmark: the oracle's full forward vs the bare matmuls of the same shapes, and grader memory.

    python bench/oracle.py [--weights DIR] [--tokens 64] [--repeat 5]

Prints (1) the median time of one full forward (logits at every position) on gpt2-shape weights,
the median time of just its matrix multiplications done bare in the same run, and their ratio
(target <= 1.3); (2) the grading process's peak RSS while grading per-step-identity on those
weights, as a multiple of the weights file's size (target <= 1.3; the student's process is
separate and not counted); (3) the grader's time verifying the greedy stage's tokens (one
teacher-forced forward per case) against one forward over prompt + n_new tokens per case, and
the recompute the grader used to do (the oracle's own greedy continuation, token by token), all
in the same run (target <= 1.5x one forward).
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from theinference.model import gpt2 as oracle
from theinference.bundled import data_dir
from theinference.grading.judge.results import CaseResult
from theinference.grading.spec.stages import load_stages
from theinference.model.synth import write_synthetic
from theinference.grading.judge.verification import verify_tokens
from theinference.model.weights import load_model


def bare_matmuls(params, n_seq: int, n_head: int) -> None:
    """Every matrix product of a GPT-2 forward, on ready-made inputs, and nothing else."""
    n_embd = params["wte"]["weight"].shape[1]
    head_dim = n_embd // n_head
    x = np.ones((n_seq, n_embd), np.float32)
    hidden = np.ones((n_seq, 4 * n_embd), np.float32)
    q = np.ones((n_head, n_seq, head_dim), np.float32)
    scores = np.ones((n_head, n_seq, n_seq), np.float32)
    for block in params["h"]:
        x @ block["attn"]["c_attn"]["weight"]
        q @ q.transpose(0, 2, 1)
        scores @ q
        x @ block["attn"]["c_proj"]["weight"]
        x @ block["mlp"]["c_fc"]["weight"]
        hidden @ block["mlp"]["c_proj"]["weight"]
    x @ params["wte"]["weight"].T


def median_seconds(fn, repeat: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


_MEMORY_PROBE = """
import json, resource, sys
from pathlib import Path
from theinference.grading.drive.plan import plan_run
from theinference.grading.drive.session import open_session, select_stages
session = open_session(plan_run(Path(sys.argv[1]), weights=sys.argv[2]))
run = session.run(select_stages(session.stages, ["per-step-identity"]))
print(json.dumps({"status": run.stages[0].status, "maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


def grader_peak_memory(weights: Path) -> dict:
    """Grade per-step-identity in a fresh process; its own peak RSS (children excluded)."""
    course = data_dir("course") / "solution"
    out = subprocess.run(
        [sys.executable, "-c", _MEMORY_PROBE, str(course), str(weights)], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def time_forward(path: Path, tokens: int, repeat: int) -> tuple[float, float]:
    """(median seconds of one full forward, median seconds of its bare matmuls), in the same run."""
    model = load_model(path)
    ids = list(np.random.default_rng(0).integers(0, model.config.n_vocab, tokens))
    n_head = model.config.n_head
    forward = median_seconds(lambda: oracle.logits(model.params, ids, n_head), repeat)
    matmuls = median_seconds(lambda: bare_matmuls(model.params, tokens, n_head), repeat)
    return forward, matmuls


def time_greedy(path: Path) -> tuple[float, float, float]:
    """Seconds, summed over the greedy stage's cases: verifying the tokens, one forward, the recompute."""
    model = load_model(path)
    stage = next(s for s in load_stages([data_dir("stages")]) if s.id == "greedy")
    n_head, totals = model.config.n_head, [0.0, 0.0, 0.0]
    for case in stage.cases:
        prompt, n_new = case.inputs["prompt"], case.inputs["n_new"]
        start = time.perf_counter()
        tokens = oracle.greedy(model.params, prompt, n_new, n_head)
        totals[2] += time.perf_counter() - start
        ran = CaseResult(name=case.name, status="", inputs=case.inputs)
        totals[0] += median_seconds(lambda: verify_tokens(ran, np.asarray(tokens), model, stage.check.tie_rtol, {}), 3)
        assert verify_tokens(ran, np.asarray(tokens), model, stage.check.tie_rtol, {}).status == "pass"
        totals[1] += median_seconds(lambda: oracle.logits(model.params, prompt + tokens, n_head), 3)
    return totals[0], totals[1], totals[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--weights", type=Path, help="a gpt2-shape checkpoint directory (default: made in a temp dir)")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        weights_dir = args.weights or Path(tmp)
        if not (weights_dir / "model.safetensors").is_file():
            print("making gpt2-shape synthetic weights ...", flush=True)
            write_synthetic(weights_dir, preset="gpt2", seed=0)
        path = weights_dir / "model.safetensors"
        forward, matmuls = time_forward(path, args.tokens, args.repeat)
        print(f"oracle full forward, {args.tokens} tokens: {forward * 1e3:8.1f} ms (median of {args.repeat})")
        print(f"bare matmuls of the same shapes:        {matmuls * 1e3:8.1f} ms")
        print(f"ratio forward / matmuls:                {forward / matmuls:8.2f}   (target <= 1.3)")
        memory = grader_peak_memory(path)
        size = path.stat().st_size
        peak = memory["maxrss_kb"] * 1024
        print(
            f"grader peak RSS grading per-step-identity ({memory['status']}): {peak / 1e6:.0f} MB; "
            f"weights file {size / 1e6:.0f} MB; ratio {peak / size:.2f}   (target <= 1.3)"
        )
        verify, forward, recompute = time_greedy(path)
        print(f"greedy stage, grader time verifying the tokens: {verify * 1e3:8.1f} ms (all cases)")
        print(f"one forward over prompt + n_new per case:       {forward * 1e3:8.1f} ms")
        print(f"the oracle's own continuation, recomputed:      {recompute * 1e3:8.1f} ms")
        print(f"ratio verify / forward:                         {verify / forward:8.2f}   (target <= 1.5)")
        print(f"ratio recompute / forward (the old way):        {recompute / forward:8.2f}")


if __name__ == "__main__":
    main()
