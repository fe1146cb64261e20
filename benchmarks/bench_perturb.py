"""Cost of applying and restoring perturbations on SmolLM2-135M, measured side by side.

    make bench            # or: HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_perturb.py [--isolation-only]

Prints
  (a) per spec: (apply + restore time) / one forward pass over 8x256 tokens (target < 1);
  (b) the per-layer isolation map over all 30 decoder blocks for fp8-e4m3:channel (one reference
      pass, then 30 x [perturb one block, probe, restore]) / (30 candidate forward passes + 1
      reference forward pass), per_layer=False (target <= 1.2). The map replays the unperturbed
      leading blocks from the reference pass (`keep_block_outputs`), as `mismatch probe
      --each-layer` does.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

import mismatch  # noqa: E402
from mismatch.perturb import perturb_, restore_  # noqa: E402

B, T = 8, 256
SPECS = ["fp8-e4m3:tensor", "fp8-e4m3:channel", "fp8-e4m3:block128", "fp8-e4m3:channel,w8a8",
         "fp8-e5m2:channel", "int8:channel", "int4:group128", "dtype:bf16", "noise:0.01",
         "bnb-int8", "bnb-nf4", "bnb-fp4", "quanto-int8", "quanto-int4", "quanto-fp8", "quanto-int8:a8"]


def forward_seconds(model, ids) -> float:
    with torch.no_grad():
        start = time.perf_counter()
        model(ids, use_cache=False)
        return time.perf_counter() - start


def main() -> None:
    lm = mismatch.load("smollm2-135m")
    model = lm.model
    ids = torch.randint(0, model.config.vocab_size, (B, T), generator=torch.Generator().manual_seed(0))
    calib = ids[:2, :64]
    forward_seconds(model, ids[:, :32])  # warm-up
    fwd = statistics.median(forward_seconds(model, ids) for _ in range(3))
    print(f"SmolLM2-135M, one forward pass over {B}x{T} tokens: {fwd:.2f} s (median of 3), "
          f"{torch.get_num_threads()} threads")
    print("(a) apply + restore, whole model (layers=linear), ratio to one forward pass (target < 1)")
    for spec in [] if "--isolation-only" in sys.argv else SPECS:
        start = time.perf_counter()
        snap = perturb_(model, spec, calibration_ids=calib)
        restore_(model, snap)
        cost = time.perf_counter() - start
        print(f"  {spec:24s} {cost:6.2f} s   ratio {cost / fwd:.3f}")

    spec = "fp8-e4m3:channel"
    n = len(model.model.layers)
    start = time.perf_counter()
    # computed once, reused 30 times; block i's probe replays blocks 0..i-1 from it
    ref = mismatch.reference(model, ids, per_layer=False, cache_logprobs=True, keep_block_outputs=True)
    for i in range(n):
        snap = perturb_(model, spec, layers=str(i))
        try:
            mismatch.probe(ref, model, per_layer=False)
        finally:
            restore_(model, snap)
    iso = time.perf_counter() - start
    bare = sum(forward_seconds(model, ids) for _ in range(n + 1))
    print(f"(b) isolation map, {spec}, {n} blocks: {iso:.1f} s vs {n}+1 bare forward passes {bare:.1f} s "
          f"-> ratio {iso / bare:.3f} (target <= 1.2)")


if __name__ == "__main__":
    main()
