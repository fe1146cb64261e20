"""What `MismatchDistillationTrainer` costs per optimizer step against TRL's own `DistillationTrainer`, in one run.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_trl.py [--steps 8] [--repeats 3]

On the sort-gpt2 pair (64 prompts per step, ≤ 11 tokens, fp32, 1 thread), side by side and interleaved
(`--repeats` rounds of each configuration, medians of per-step times after the first step):
  * `trl.DistillationTrainer` itself (the baseline);
  * `MismatchDistillationTrainer(rollout=None)`: TRL's own sampling plus the mismatch statistics (one extra
    teacher-forced pass of the student per batch) and the gates every 10 steps;
  * `rollout="int4:group128"`: the copy re-quantized before every batch, sampling in the student's place,
    and its own teacher-forced pass for the statistics.
Prints each configuration's seconds per step and its ratio to the baseline.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import trl  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

import mismatch  # noqa: E402
from mismatch.integrations.trl import MismatchDistillationTrainer  # noqa: E402


class StepTimes(TrainerCallback):
    """Wall seconds of each optimizer step (on_step_begin → on_step_end)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._t0 = 0.0

    def on_step_begin(self, args, state, control, **kwargs):
        self._t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.times.append(time.perf_counter() - self._t0)


def run(pair, label: str, steps: int, batch: int) -> list[float]:
    args = trl.DistillationConfig(output_dir="/tmp/bench-trl", per_device_train_batch_size=batch, max_steps=steps,
                                  learning_rate=1e-3, beta=1.0, max_completion_length=pair.max_new_tokens,
                                  bf16=False, use_cpu=True, report_to="none", save_strategy="no", logging_steps=10,
                                  disable_tqdm=True, disable_dropout=True, seed=0)
    timer = StepTimes()
    common = dict(model=copy.deepcopy(pair.student.model), teacher_model=pair.teacher.model, args=args,
                  train_dataset=Dataset.from_dict({"prompt": pair.prompts("train", 1024, seed=0)}),
                  processing_class=pair.student.tokenizer, callbacks=[timer])
    if label == "trl":
        trainer = trl.DistillationTrainer(**common)
    else:
        trainer = MismatchDistillationTrainer(**common, rollout=None if label == "none" else label, gate_every=10)
    trainer.train()
    return timer.times[1:]  # the first step pays one-time costs (allocations, the first re-quantization)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch", type=int, default=64)
    a = parser.parse_args()
    torch.set_num_threads(1)
    pair = mismatch.load_pair("sort-gpt2")
    labels = ("trl", "none", "int4:group128")
    times: dict[str, list[float]] = {label: [] for label in labels}
    for _ in range(a.repeats):
        for label in labels:
            times[label] += run(pair, label, a.steps, a.batch)
    base = statistics.median(times["trl"])
    print(f"sort-gpt2, {a.batch} prompts/step, 1 thread, medians of {len(times['trl'])} steps per configuration")
    print(f"{'configuration':<42} {'s/step':>8} {'× TRL':>7}")
    names = {"trl": "trl.DistillationTrainer", "none": "MismatchDistillationTrainer(rollout=None)",
             "int4:group128": "MismatchDistillationTrainer(int4:group128)"}
    for label in labels:
        med = statistics.median(times[label])
        print(f"{names[label]:<42} {med:8.3f} {med / base:7.3f}")


if __name__ == "__main__":
    main()
