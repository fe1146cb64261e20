"""Cost of the sweep runner, measured side by side in one run.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_sweep.py [--seeds 15] [--parts ab]     (make bench)

Prints
  (a) sweep overhead, serial: wall time of a sweep of 6 sort-gpt2 OPD runs (40 steps of 64 prompts)
      ÷ Σ of its tasks' own times (ledger `seconds`) (target ≤ 1.03);
  (b) the same grid as Ray tasks on 2 workers (1 torch thread each) vs serially (1 thread per task, the
      study's default): the speed-up of the wall time, Ray's start-up included, and the start-up alone
      (target ≥ 1.25× on a grid of at least five serial minutes: `--seeds 15`);
  (c) a static sweep of S = 3 specs on SmolLM2-135M over one prompt set (teacher-forced text) ÷
      (1 reference + S candidate forward passes of the same batch) (target ≤ 1.15);
  (d) the ceiling of training G = 8 seeds of sort-gpt2 as one batched computation: the work of one
      OPD step (FLOPs counted by `torch.utils.flop_counter`), and each part of it — the rollout
      generation, the teacher's pass, the student's forward + backward — on one batch of 64 prompts
      × 8 calls vs one call on the 8 batches' 512 prompts with the same weights (what stacked weights
      or grouped matmuls could at best reach: the per-call overhead they remove), at 1 thread.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import ray  # noqa: E402
import torch  # noqa: E402

import mismatch  # noqa: E402
from mismatch.model.generate import teacher_forced  # noqa: E402
from mismatch.sweep import plan_study, read_ledger, run_study  # noqa: E402
from mismatch.sweep.study import Study  # noqa: E402

OPD_GRID = {"dynamic": {"pairs": ["sort-gpt2"], "rollouts": ["fp8-e4m3", "stale:1"], "seeds": [0, 1],
                        "settings": {"steps": 40, "batch_size": 64, "eval_every": 40, "eval_prompts": 256}}}
PROMPTS = Path(__file__).resolve().parents[1] / "mismatch" / "data" / "prompts.txt"
SPECS = ["fp8-e4m3:channel", "int8:channel", "int4:group128"]
STATIC = {"static": {"models": ["smollm2-135m"], "prompts": str(PROMPTS), "max_new_tokens": 0,
                     "perturb": SPECS, "layers": ["linear"], "per_layer": False}}


def _sweep(cfg: dict, **options) -> tuple[float, float]:
    """(wall seconds, Σ task seconds) of one sweep into a fresh directory."""
    study = Study("bench", Path("bench.toml"), plan_study(cfg))
    out = Path(tempfile.mkdtemp(prefix="bench-sweep-"))
    try:
        start = time.perf_counter()
        run_study(study, out, **options)
        wall = time.perf_counter() - start
        return wall, sum(r["seconds"] for r in read_ledger(out).values())
    finally:
        shutil.rmtree(out, ignore_errors=True)


def load_seconds() -> float:
    """Seconds to load SmolLM2 (part of a static sweep's task, not of its forward passes)."""
    start = time.perf_counter()
    mismatch.load("smollm2-135m")
    return time.perf_counter() - start


def forward_passes(n: int) -> float:
    """Seconds of n forward passes of SmolLM2 over the static sweep's batch (after a warm-up)."""
    lm = mismatch.load("smollm2-135m")
    texts = PROMPTS.read_text().splitlines()
    batch = teacher_forced(lm, texts, chat=False)
    with torch.no_grad():
        lm.model(batch.input_ids, attention_mask=batch.attention_mask, use_cache=False)
        start = time.perf_counter()
        for _ in range(n):
            lm.model(batch.input_ids, attention_mask=batch.attention_mask, use_cache=False)
    return time.perf_counter() - start


def _seconds(f, n: int = 3) -> float:
    f()
    start = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - start) / n


def batching_ceiling(groups: int = 8, batch: int = 64) -> None:
    """(d): one OPD step's FLOPs, and each part's time on `groups` × `batch` prompts as `groups` calls vs one."""
    from torch.utils.flop_counter import FlopCounterMode

    from mismatch.model.generate import generate
    from mismatch.opd import OPDConfig
    from mismatch.model.generate import response_hidden
    from mismatch.opd.trainer import opd_step, setup, teacher_hidden

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run = setup(OPDConfig(pair="sort-gpt2", batch_size=batch))
        opd_step(run, 1)
        step_s = _seconds(lambda: opd_step(run, 2), 5)
        with FlopCounterMode(display=False) as counter:
            opd_step(run, 3)
        flops = counter.get_total_flops()
        pair = run.pair
        prompts = pair.prompts("train", groups * batch, seed=0)
        parts = {}
        for name, rows in (("one call per seed", batch), ("one call for all", groups * batch)):
            chunks = [prompts[i:i + rows] for i in range(0, groups * batch, rows)]
            sampled = [generate(pair.student, c, max_new_tokens=pair.max_new_tokens, temperature=1.0, seed=1) for c in chunks]

            def student(b):
                response_hidden(pair.student.model, b).sum().backward()

            parts[name] = (_seconds(lambda: [generate(pair.student, c, max_new_tokens=pair.max_new_tokens, temperature=1.0,
                                                      seed=1) for c in chunks]),
                           _seconds(lambda: [teacher_hidden(pair.teacher.model, b) for b in sampled]),
                           _seconds(lambda: [student(b) for b in sampled]))
    finally:
        torch.set_num_threads(before)
    per, one = parts["one call per seed"], parts["one call for all"]
    print(f"(d) one sort-gpt2 OPD step of {batch} prompts: {flops / 1e9:.2f} GFLOP in {1000 * step_s:.0f} ms at 1 thread "
          f"({flops / step_s / 1e9:.0f} GFLOP/s). {groups} seeds' parts as {groups} calls vs one call of "
          f"{groups * batch} prompts (same weights: the ceiling of batching seeds): rollouts {per[0]:.2f} vs {one[0]:.2f} s, "
          f"teacher {per[1]:.2f} vs {one[1]:.2f} s, student forward + backward {per[2]:.2f} vs {one[2]:.2f} s; "
          f"all three {sum(per):.2f} vs {sum(one):.2f} s: ceiling {sum(per) / sum(one):.2f}× (issue target ≥ 5×)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=2, help="seeds per rollout of the OPD grid of (a) and (b): "
                        "15 makes a grid of about five minutes serially")
    parser.add_argument("--parts", default="abcd", help="which parts to run")
    a = parser.parse_args()
    grid = {"dynamic": {**OPD_GRID["dynamic"], "seeds": list(range(a.seeds))}}
    if "a" in a.parts or "b" in a.parts:
        threads = Study("bench", Path("bench.toml"), plan_study(grid)).threads  # the study's: 1 by default
        _sweep(OPD_GRID)  # warm-up: imports, caches
        wall, own = _sweep(grid)
        print(f"(a) serial sweep of {len(plan_study(grid).opd)} sort-gpt2 OPD runs ({threads} thread per task): "
              f"wall {wall:.1f} s, Σ task times {own:.1f} s, overhead ratio {wall / own:.3f} (target ≤ 1.03)")
    if "b" in a.parts:
        start = time.perf_counter()
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
        ray.shutdown()
        startup = time.perf_counter() - start
        ray_wall, ray_own = _sweep(grid, workers=2)
        print(f"(b) Ray, 2 workers × 1 thread: wall {ray_wall:.1f} s (Σ task times {ray_own:.1f} s; Ray start-up alone "
              f"{startup:.1f} s) vs serial {wall:.1f} s: speed-up {wall / ray_wall:.2f}× (target ≥ 1.25× on a grid of "
              f"≥ 5 serial minutes)")
    if "c" in a.parts:
        static_wall = statistics.median(_sweep(STATIC)[0] for _ in range(3))
        load = statistics.median(load_seconds() for _ in range(3))
        bare = forward_passes(1 + len(SPECS))
        print(f"(c) static sweep of {len(SPECS)} specs on SmolLM2-135M, the 36 prompts teacher-forced: {static_wall:.2f} s, "
              f"of which loading the model {load:.2f} s; vs 1 + {len(SPECS)} bare forward passes {bare:.2f} s: ratio "
              f"{(static_wall - load) / bare:.2f} without loading, {static_wall / bare:.2f} with it (target ≤ 1.15)")
    if "d" in a.parts:
        batching_ceiling()


if __name__ == "__main__":
    main()
