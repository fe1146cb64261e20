"""Where an OPD step's time goes, and what the mismatch metrics cost, measured in one run.

    make bench            # or: HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_opd.py [--steps N]

For each configuration below, runs `mismatch.opd.train` and prints the median per-step seconds of
  rollout (sampling with the rollout copy + its log-probs), teacher scoring, student update (loss
  forward/backward + AdamW), refresh of the rollout copy, and the step's wall time;
and the mismatch metrics' share of a step: (time spent on the student's sampled-token log-probs +
`sampled_token_metrics`) / wall time, measured inside the same steps (target ≤ 5%).

Configurations: the synthetic pair `sort-gpt2` (clean rollouts and int4:group128 rollouts, 64
prompts per step) and `smollm2-concise` (SmolLM2-135M, clean, 8 prompts per step, 64-token
responses). Held-out evaluation is pushed past the last step so it is not timed.
"""

from __future__ import annotations

import os
import statistics
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from mismatch.opd import OPDConfig, train  # noqa: E402

PARTS = ("rollout_s", "teacher_s", "update_s", "refresh_s", "wall_s")


def measure(config: OPDConfig) -> dict[str, float]:
    """Median over the steps (the first one, warm-up, dropped) of each timing metric."""
    rows = train(config)
    out = {}
    for metric in (*PARTS, "metrics_s", "tokens"):
        values = [r["value"] for r in rows if r["metric"] == metric and r["step"] > 1]
        out[metric] = statistics.median(values)
    shares = [m["value"] / w["value"] for m, w in zip(
        (r for r in rows if r["metric"] == "metrics_s" and r["step"] > 1),
        (r for r in rows if r["metric"] == "wall_s" and r["step"] > 1))]
    out["metrics_share"] = statistics.median(shares)
    out["metrics_share_max"] = max(shares)
    return out


def main() -> None:
    steps = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else 8
    no_eval = dict(eval_every=10 ** 6, eval_prompts=1)  # evaluation at step 0 only (1 prompt) and last
    configs = [
        ("sort-gpt2, clean, 64 prompts", OPDConfig(pair="sort-gpt2", steps=steps, batch_size=64, **no_eval)),
        ("sort-gpt2, int4:group128", OPDConfig(pair="sort-gpt2", rollout="int4:group128", steps=steps,
                                              batch_size=64, **no_eval)),
        ("smollm2-concise, clean, 8 prompts", OPDConfig(pair="smollm2-concise", steps=max(3, steps // 3),
                                                         batch_size=8, **no_eval)),
    ]
    print(f"OPD step timing, {torch.get_num_threads()} threads; median over steps 2..N (seconds)")
    header = f"  {'configuration':36s}" + "".join(f"{p[:-2]:>10s}" for p in PARTS) + "   tokens  metrics/step"
    print(header)
    worst = 0.0
    for label, config in configs:
        m = measure(config)
        worst = max(worst, m["metrics_share"])
        print(f"  {label:36s}" + "".join(f"{m[p]:10.3f}" for p in PARTS)
              + f"  {m['tokens']:7.0f}  {m['metrics_share']:.2%} (max {m['metrics_share_max']:.2%})")
    print(f"mismatch metrics / step wall time, worst configuration: {worst:.2%} (target ≤ 5%)")


if __name__ == "__main__":
    main()
