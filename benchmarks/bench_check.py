"""What the admission check costs against one OPD step on the same model and batch, in one run.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_check.py [--steps 3]

On SmolLM2-135M (the `smollm2-concise` pair's student), side by side:
  * `mismatch.check(smollm2-135m, fp8-e4m3:block128)` with its defaults (16 prompts, ≤ 128 sampled
    tokens each, the fitted gate only; the model is loaded before timing), its parts timed apart
    (sampling, reference pass, candidate pass, statistics and bootstrap);
  * one OPD step of `smollm2-concise` with the same batch: 16 prompts, ≤ 128 sampled tokens, clean
    rollouts (median of the steps after the first; held-out evaluation pushed past the last step);
and the ratio check ÷ step (the issue's target: ≤ 5%; ≤ 2 minutes for the check). Then the in-loop
form: `mismatch.admission.judge` on one OPD step's own rollout tokens (fp8-e4m3:block128 rollouts, the
trainer's log-probs from the update's forward pass), timed against that step.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import mismatch  # noqa: E402
from mismatch.admission import checker  # noqa: E402
from mismatch.admission import judge  # noqa: E402
from mismatch.opd import OPDConfig, train  # noqa: E402
from mismatch.opd.trainer import sample_rollouts, score_with_teacher, setup, update  # noqa: E402


def timed_check(lm: mismatch.LM) -> tuple[float, dict[str, float], mismatch.Admission]:
    """Wall time of one default check, and of its parts (wrapping the functions it calls)."""
    parts: dict[str, float] = {"sampling": 0.0, "reference pass": 0.0, "candidate pass": 0.0, "bootstrap": 0.0}
    originals = {name: getattr(checker, name) for name in ("generate", "reference", "probe", "_bootstrap")}
    labels = {"generate": "sampling", "reference": "reference pass", "probe": "candidate pass",
              "_bootstrap": "bootstrap"}

    def wrap(name):
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return originals[name](*args, **kwargs)
            finally:
                parts[labels[name]] += time.perf_counter() - t0
        return timed

    for name in originals:
        setattr(checker, name, wrap(name))
    try:
        t0 = time.perf_counter()
        result = checker.check(lm, "fp8-e4m3:block128")
        total = time.perf_counter() - t0
    finally:
        for name, fn in originals.items():
            setattr(checker, name, fn)
    return total, parts, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="OPD steps to time (the first is dropped)")
    args = parser.parse_args()
    lm = mismatch.load("smollm2-135m")
    total, parts, result = timed_check(lm)
    rows = train(OPDConfig(pair="smollm2-concise", steps=args.steps, batch_size=16, max_new_tokens=128,
                           eval_every=args.steps + 1, eval_prompts=1, lr=3e-5))
    walls = [r["value"] for r in rows if r["metric"] == "wall_s" and r["step"] > 1]
    tokens = [r["value"] for r in rows if r["metric"] == "tokens" and r["step"] > 1]
    step = statistics.median(walls)
    print(f"admission check, SmolLM2-135M, fp8-e4m3:block128: {total:.1f} s "
          f"({result.calibration['sequences']} responses, {result.calibration['tokens']} tokens; {result.status})")
    for name, seconds in parts.items():
        print(f"  {name:<16} {seconds:6.1f} s")
    print(f"  {'other':<16} {total - sum(parts.values()):6.1f} s (quantizing twice, loading prompts, …)")
    print(f"one OPD step, smollm2-concise, 16 prompts ≤ 128 tokens: {step:.1f} s "
          f"(median of {len(walls)}, {statistics.median(tokens):.0f} tokens)")
    print(f"check ÷ OPD step: {total / step:.2f} (target ≤ 0.05); check ≤ 120 s: {'yes' if total <= 120 else 'no'}")
    in_loop, loop_step = timed_judge()
    print(f"in-loop judge on one step's own tokens: {in_loop:.2f} s; that step {loop_step:.1f} s; "
          f"÷ step {in_loop / loop_step:.4f}")


def timed_judge() -> tuple[float, float]:
    """Seconds of `judge` on one fp8-rollout OPD step's tokens, and of that step (rollout, teacher, update)."""
    run = setup(OPDConfig(pair="smollm2-concise", rollout="fp8-e4m3:block128", steps=1, batch_size=16,
                          max_new_tokens=128, eval_prompts=1, lr=3e-5))
    t0 = time.perf_counter()
    rollout, teacher_batch = sample_rollouts(run, run.train_pool[:16], 1)
    result, _, _ = update(run, rollout, score_with_teacher(run, teacher_batch))
    t1 = time.perf_counter()
    mask = rollout.batch.response_mask.bool()
    judge(result.logp_student, rollout.logprobs[mask], mask.nonzero()[:, 0])
    return time.perf_counter() - t1, t1 - t0


if __name__ == "__main__":
    main()
