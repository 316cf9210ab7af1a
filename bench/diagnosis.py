"""Benchmark: how often diagnosis names a student's own mistake exactly, and what it costs next to the oracle.

    python bench/diagnosis.py [--seeds 0] [--gpt2] [--only NAME...] [--runs 3]

Mistakes written the way students write them: three whole student implementations of every stage in
different styles (bench/students/*.py.tmpl: `functional` — pure functions and einsum, a list cache; `classes`
— a GPT2 object and a KVCache class; `loops` — Python loops over heads, a dict-of-lists cache), each
with placeholders filled by its correct code or by one mistake. Each mistake is graded through the
real grading path (student processes and all) on the stages where it first shows, after the stages
it should pass (so evidence from the run is there too). For each failing stage the named diagnosis is

  exact   the expected bug (a mistake outside every family: nothing named, "not one of the known bugs")
  partly  the expected bug among others
  not     nothing named where a bug was expected
  wrong   a bug named that is not the mistake (a wrong claim stated as fact: must never happen)

and its cost is the fingerprinting time over the oracle's time for that stage's cases, both from a cold cache
(each mistake starts with only the oracle's outputs, which grading computes anyway: no bug output computed for an
earlier mistake is reused), both the fastest of three runs (a busy machine only ever adds time), and both counted as this process's CPU time with BLAS held to one thread (both run in
the grader's process; with several threads, a busy machine turns many small products into CPU time spent
spinning, which says nothing about the work), so the ratio is the work's and not the machine's.
Targets: >= 80% exact, 0 wrong, cost <= 3x.
"""

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]

from theinference.bundled import data_dir
from theinference.course import Course
from theinference.grading.tools.check import named_bugs
from theinference.grading.oracle.cache import OracleCache
from theinference.grading.drive.grader import Grader, RunOptions
from theinference.grading.oracle.registry import resolve_oracle
from theinference.grading.spec.stages import load_stages, stage_dirs
from theinference.model.synth import write_synthetic
from theinference.model.weights import load_model
from theinference.model.weights_choice import WeightsChoice

STUDENTS = Path(__file__).parent / "students"
INDENT = "\n        "

DEFAULTS = {
    "functional": {
        "N_HEAD": 'CFG["n_head"]',
        "EPS": "1e-5",
        "GELU": "0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))",
        "SPLIT": "q, k, v = np.split(y, 3, axis=-1)",
        "SCALE": "(1 / np.sqrt(HD))",
        "MASK": "np.triu(np.full((n, n), -1e10), k=1)",
        "FWD_POS": "np.arange(len(ids))",
        "FWD_LN_ATTN": "ln_1",
        "NEW_CACHE": "return [None] * N_LAYER",
        "STEP_POS": "np.arange(start, start + n)",
        "APPEND": INDENT.join(
            [
                "K = k if cache[i] is None else np.concatenate([cache[i][0], k], 1)",
                "V = v if cache[i] is None else np.concatenate([cache[i][1], v], 1)",
                "cache[i] = (K, V)",
            ]
        ),
        "CACHED_LN_MLP": "ln_2",
        "FWD_MLP_RESIDUAL": "x + ",
        "DECODE_POS": "len(prompt_ids)",
        "PER_STEP_J": "j",
        "N_OUT": "n_new",
        "FED": "out[-1]",
        "GREEDY_POS": "len(prompt_ids) + len(out) - 1",
        "CHOICE": "np.argmax(row)",
    },
    "classes": {
        "CACHE_LEN": "0 if self.layers[0][0] is None else self.layers[0][0].shape[1]",
        "SPLIT": "q, k, v = np.split(fused, 3, axis=1)",
        "SCALE": "/ math.sqrt(self.n_embd // self.n_head)",
        "C_PROJ": 'self.w[p + "c_proj.weight"]',
        "FWD_START": "0",
        "HEAD": 'self.norm(x, "ln_f") @ self.w["wte.weight"].T',
        "NEW_CACHE": "return KVCache(self.n_layer)",
        "CACHED_LN_MLP": "ln_2",
        "CACHED_ATTN_RESIDUAL": "x + ",
        "PREFILL_ROW": "-1",
        "GREEDY_FIRST_ROW": "-1",
        "DECODE_POS": "pos",
        "GREEDY_BODY": "tokens.append(int(np.argmax(m.decode(cache, tokens[-1], len(cache)))))",
        "VAR": "np.var(x, axis=-1, keepdims=True)",
    },
    "loops": {
        "GELU": "0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))",
        "SCALE": "/ math.sqrt(D)",
        "SOFTMAX_AXIS": "-1",
        "SOFTMAX_MAX_AXIS": "-1",
        "SPLIT": "q, k, v = y[:, :E], y[:, E : 2 * E], y[:, 2 * E :]",
        "MASK_EXTRA": "",
        "DECODE_POS": "len(prompt_ids)",
        "PER_STEP_POS": "len(prompt_ids) + i",
        "PICK": "tok = int(np.argmax(logits))",
        "FED": "tok",
    },
}

FWD, DEC, PER, GREEDY = ["forward"], ["forward", "decode-step"], ["forward", "per-step-identity"], ["greedy"]
OUTSIDE: set = set()  # a mistake outside every family: nothing may be named

# name: (style, placeholder -> code, stages graded (the last is scored; the earlier must pass), the bug(s) expected)
MISTAKES: dict[str, tuple[str, dict, list[str], set]] = {
    # functional
    "f-scale-sqrt-n-embd": ("functional", {"SCALE": "(1 / np.sqrt(N_EMBD))"}, FWD, {"attention-scale"}),
    "f-scale-head-dim": ("functional", {"SCALE": "(1 / HD)"}, FWD, {"attention-scale"}),
    "f-scale-constant": ("functional", {"SCALE": "0.1"}, FWD, {"attention-scale"}),
    "f-mask-triu-k0": ("functional", {"MASK": "np.triu(np.full((n, n), -1e10), k=0)"}, FWD, {"mask-diagonal"}),
    "f-attn-uses-ln-2": ("functional", {"FWD_LN_ATTN": "ln_2"}, FWD, {"layer-norm-params"}),
    "f-ln-no-eps": ("functional", {"EPS": "0.0"}, FWD, {"ln-eps-missing"}),
    "f-four-heads": ("functional", {"N_HEAD": "N_EMBD // 32"}, FWD, {"head-count"}),
    "f-split-qvk": ("functional", {"SPLIT": "q, v, k = np.split(y, 3, axis=-1)"}, FWD, {"qkv-order-qvk"}),
    "f-cached-mlp-ln-1": ("functional", {"CACHED_LN_MLP": "ln_1"}, DEC, {"layer-norm-params"}),
    "f-decode-pos-minus-one": ("functional", {"DECODE_POS": "len(prompt_ids) - 1"}, DEC, {"position-offset"}),
    "f-per-step-pos-plus-one": ("functional", {"PER_STEP_J": "j + 1"}, PER, {"wpe-off-by-one"}),
    "f-cache-kept": (
        "functional",
        {"NEW_CACHE": "if not CACHE_STORE:\n        CACHE_STORE.extend([None] * N_LAYER)\n    return CACHE_STORE"},
        DEC,
        {"cache-not-cleared"},
    ),
    "f-no-mlp-residual": ("functional", {"FWD_MLP_RESIDUAL": ""}, FWD, {"no-mlp-residual"}),
    "f-greedy-len-out": ("functional", {"GREEDY_POS": "len(out)"}, GREEDY, {"greedy-position"}),
    "f-greedy-one-short": ("functional", {"N_OUT": "n_new - 1"}, GREEDY, {"greedy-one-short"}),
    "f-greedy-lags": (
        "functional",
        {"FED": "(out[-2] if len(out) > 1 else prompt_ids[-1])"},
        GREEDY,
        {"greedy-fed-token"},
    ),
    "f-gelu-constant": (
        "functional",
        {"GELU": "0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.44715 * x**3)))"},
        FWD,
        OUTSIDE,
    ),
    # classes
    "c-len-cache-counts-layers": (
        "classes",
        {"CACHE_LEN": "len(self.layers)", "DECODE_POS": "len(cache)"},
        DEC,
        {"position-offset"},
    ),
    "c-cached-mlp-ln-1": ("classes", {"CACHED_LN_MLP": "ln_1"}, DEC, {"layer-norm-params"}),
    "c-no-attn-residual": ("classes", {"CACHED_ATTN_RESIDUAL": ""}, DEC, {"no-attn-residual"}),
    "c-prefill-first-row": ("classes", {"PREFILL_ROW": "0"}, PER, {"prefill-first-row"}),
    "c-no-scale": ("classes", {"SCALE": ""}, FWD, {"missing-scale"}),
    "c-split-kqv": ("classes", {"SPLIT": "k, q, v = np.split(fused, 3, axis=1)"}, FWD, {"qkv-order-kqv"}),
    "c-c-proj-transposed": ("classes", {"C_PROJ": 'self.w[p + "c_proj.weight"].T'}, FWD, {"c-proj-transposed"}),
    "c-positions-from-one": ("classes", {"FWD_START": "1"}, FWD, {"position-offset"}),
    "c-decode-position-zero": ("classes", {"DECODE_POS": "0"}, DEC, {"position-zero"}),
    "c-no-ln-f": ("classes", {"HEAD": 'x @ self.w["wte.weight"].T'}, FWD, {"no-ln-f"}),
    "c-cache-shared": (
        "classes",
        {"NEW_CACHE": '_SHARED.setdefault("c", KVCache(self.n_layer))\n        return _SHARED["c"]'},
        DEC,
        {"cache-not-cleared"},
    ),
    "c-greedy-feeds-prompt-token": (
        "classes",
        {"GREEDY_BODY": "tokens.append(int(np.argmax(m.decode(cache, prompt_ids[-1], len(cache)))))"},
        GREEDY,
        {"greedy-fed-token"},
    ),
    "c-greedy-prefill-first-row": ("classes", {"GREEDY_FIRST_ROW": "0"}, GREEDY, {"greedy-prefill-first-row"}),
    "c-greedy-stops-at-eot": (
        "classes",
        {
            "GREEDY_BODY": "if tokens[-1] == 50256:"
            + INDENT
            + "    break"
            + INDENT
            + "tokens.append(int(np.argmax(m.decode(cache, tokens[-1], len(cache)))))"
        },
        GREEDY,
        {"greedy-stops-at-eot"},
    ),
    "c-greedy-position-stuck": (
        "classes",
        {"GREEDY_BODY": "tokens.append(int(np.argmax(m.decode(cache, tokens[-1], len(prompt_ids)))))"},
        GREEDY,
        {"greedy-position"},
    ),
    "c-var-ddof": ("classes", {"VAR": "np.var(x, axis=-1, keepdims=True, ddof=1)"}, FWD, OUTSIDE),
    # loops
    "l-scale-n-head": ("loops", {"SCALE": "/ NH"}, FWD, {"attention-scale"}),
    "l-softmax-over-queries": ("loops", {"SOFTMAX_AXIS": "0", "SOFTMAX_MAX_AXIS": "0"}, FWD, {"softmax-over-queries"}),
    "l-softmax-sum-over-queries": ("loops", {"SOFTMAX_AXIS": "0"}, FWD, {"softmax-sum-over-queries"}),
    "l-qkv-per-head": (
        "loops",
        {"SPLIT": "q, k, v = (y.reshape(n, NH, 3, D)[:, :, j].reshape(n, E) for j in range(3))"},
        FWD,
        {"qkv-split"},
    ),
    "l-split-vkq": ("loops", {"SPLIT": "v, k, q = y[:, :E], y[:, E : 2 * E], y[:, 2 * E :]"}, FWD, {"qkv-split"}),
    "l-mask-sees-next": ("loops", {"MASK_EXTRA": "+ 1"}, FWD, {"mask-diagonal"}),
    "l-decode-pos-plus-one": ("loops", {"DECODE_POS": "len(prompt_ids) + 1"}, DEC, {"wpe-off-by-one"}),
    "l-per-step-stuck": ("loops", {"PER_STEP_POS": "len(prompt_ids)"}, PER, {"position-stuck"}),
    "l-greedy-runner-up-once": (
        "loops",
        {"PICK": "tok = int(np.argsort(logits)[-2] if i == 1 else np.argmax(logits))"},
        GREEDY,
        {"greedy-runner-up"},
    ),
    "l-greedy-feeds-first": ("loops", {"FED": "(out[0])"}, GREEDY, {"greedy-fed-token"}),
}


def render(style: str, subs: dict) -> str:
    text = (STUDENTS / f"{style}.py.tmpl").read_text()
    for key, value in {**DEFAULTS[style], **subs}.items():
        text = text.replace("{{" + key + "}}", value)
    assert "{{" not in text, f"{style}: a placeholder left unfilled"
    return text


def make_course(root: Path, style: str, subs: dict) -> Course:
    (root / "src").mkdir(parents=True)
    (root / "tests").mkdir()
    shutil.copy(data_dir("course") / "solution" / "src" / "gpt2.py", root / "src" / "gpt2.py")  # the loader
    (root / "src" / "__init__.py").write_text("")
    (root / "src" / "student.py").write_text(render(style, subs))
    (root / "tests" / "adapters.py").write_text("from src.student import *  # noqa: F401,F403\n")
    return Course(root=root, adapters=root / "tests" / "adapters.py")


def verdict(named: set, expected: set) -> str:
    if named == expected:
        return "exact"
    if not named:
        return "not"
    return "partly" if named & expected else "wrong"


def oracle_seconds(model, stages) -> tuple[dict[str, float], dict]:
    """The oracle's time for all of each stage's cases, from a fresh cache (greedy: its teacher-forced walk is
    the student's path, so the oracle's own greedy continuation), and the oracle's outputs it computed."""
    seconds, entries = {}, {}
    for stage in stages:
        spec, runs = resolve_oracle(stage.oracle, stage.source), []
        for _ in range(3):  # the fastest of three: a busy machine only ever adds time
            cache, start = OracleCache(), time.process_time()
            for case in stage.cases:
                cache.get(model, stage, spec, case)
            runs.append(time.process_time() - start)
        seconds[stage.id] = min(runs)
        entries.update(cache.entries)
    return seconds, entries


def fingerprint_seconds(grader: Grader, stages, graded, oracle_entries: dict, runs: int = 3):
    """The fastest of a few cold fingerprintings of one graded run (the arrays kept for it put back each time:
    fingerprinting takes them), as the oracle's time is, and the run fingerprinted."""
    best, done, kept = float("inf"), graded, grader.unmatched
    for _ in range(runs):
        grader.cache.entries.clear()  # cold: only the oracle's outputs, as on a student's first failing run
        grader.cache.entries.update(oracle_entries)
        grader.unmatched = kept
        start = time.process_time()
        done = grader.fingerprint(stages, graded)
        best = min(best, time.process_time() - start)
    return best, done


def run(weights: Path, label: str, only: list[str], runs: int = 3) -> list[tuple[str, float, str]]:
    model = load_model(weights)
    by_id = {s.id: s for s in load_stages(stage_dirs(None))}
    oracle_s, oracle_entries = oracle_seconds(
        model, [by_id[i] for i in ("forward", "decode-step", "per-step-identity", "greedy")]
    )
    print(f"oracle time per stage ({label}): " + ", ".join(f"{k} {v:.2f} s" for k, v in oracle_s.items()), flush=True)
    results = []
    with tempfile.TemporaryDirectory() as tmp, Grader(WeightsChoice(weights, "--weights", ""), model) as grader:
        for name in only or MISTAKES:
            style, subs, stage_ids, expected = MISTAKES[name]
            course = make_course(Path(tmp) / name, style, subs)
            stages = [by_id[i] for i in stage_ids]
            graded = grader.grade(course, stages, RunOptions(fingerprint=False))
            spent, graded = fingerprint_seconds(grader, stages, graded, oracle_entries, runs)
            context = [s.id for s in graded.stages[:-1] if s.status != "pass"]
            scored = graded.stages[-1]
            if scored.status != "fail":
                v = f"{scored.status}?"  # the mistake does not show (or errors) here: a bench defect, shown as such
            else:
                v = verdict(set(named_bugs(scored)), expected)
            ratio = spent / oracle_s[scored.id]
            d = scored.diagnosis
            said = (d.evidence if d else scored.cases[0].message)[:150]
            extra = f" (earlier stages failing: {', '.join(context)})" if context else ""
            print(
                f"  {label:7} {name:30} {scored.id:18} {v:7} named: {', '.join(sorted(named_bugs(scored))) or '-':22} "
                f"fingerprint {spent:5.2f} s = {ratio:5.2f}x oracle{extra}\n      {said}",
                flush=True,
            )
            results.append((v, ratio, scored.id))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="*", default=[0], help="tiny seeds")
    parser.add_argument("--gpt2", action="store_true", help="also on the gpt2 shape (slow: minutes per mistake)")
    parser.add_argument("--only", nargs="*", default=[], help="only these mistakes")
    parser.add_argument("--runs", type=int, default=3, help="cold fingerprintings per mistake, the fastest counting")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp, threadpool_limits(limits=1):
        presets = [("tiny", seed) for seed in args.seeds] + ([("gpt2", 0)] if args.gpt2 else [])
        for preset, seed in presets:
            out = Path(tmp) / f"{preset}-{seed}"
            write_synthetic(out, preset=preset, seed=seed)
            results += run(out / "model.safetensors", f"{preset}-{seed}", args.only, args.runs)
    verdicts = [v for v, _, _ in results]
    n = len(verdicts)
    print(
        f"{n} mistake × weights: exact {verdicts.count('exact')} ({100 * verdicts.count('exact') / max(1, n):.0f}%, "
        f"target >= 80%), partly {verdicts.count('partly')}, not {verdicts.count('not')}, "
        f"wrong {verdicts.count('wrong')} (target 0), not failing {sum(v.endswith('?') for v in verdicts)}"
    )
    stages = sorted({stage for _, _, stage in results}, key=[stage for _, _, stage in results].index)
    for stage in [*stages, "all"]:
        ratios = [r for _, r, s in results if stage in (s, "all")]
        print(
            f"cost {stage:18} median {statistics.median(ratios):4.2f}x, max {max(ratios):5.2f}x, within 3x "
            f"{sum(r <= 3 for r in ratios)} of {len(ratios)} (the stage's oracle time; target <= 3x)"
        )


if __name__ == "__main__":
    main()
