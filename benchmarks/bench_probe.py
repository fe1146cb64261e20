"""Probe cost on SmolLM2-135M, 8 sequences x 256 tokens, everything measured side by side.

    make bench            # or: HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_probe.py

Prints
  (a) time of `mismatch.probe` / time of the two bare forward passes (reference + candidate,
      full logits), with per_layer=False (target <= 1.15) and per_layer=True (target <= 1.35);
  (b) probe vs a naive implementation (both [B, T, V] fp32 logit tensors, log_softmax, kl_div):
      time ratio (target <= 1) and peak extra memory ratio (target >= 3x less).
Times are medians over interleaved repeats in this process. Peak extra memory is the peak RSS
above the RSS just before the call, sampled every 1 ms in a fresh subprocess per method with
glibc's mmap threshold lowered so freed tensors leave RSS.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import threading
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

B, T, REPEATS = 8, 256, 5


def setup():
    import mismatch

    ref = mismatch.load("smollm2-135m").model
    cand = mismatch.load("smollm2-135m").model
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # a slightly different candidate, so the numbers are not all zero
        for p in cand.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.01 * p.float().pow(2).mean().sqrt())
    ids = torch.randint(0, ref.config.vocab_size, (B, T), generator=gen)
    return ref, cand, ids


def bare(ref, cand, ids):
    with torch.no_grad():
        return ref(ids, use_cache=False).logits.sum() + cand(ids, use_cache=False).logits.sum()


def naive(ref, cand, ids):
    with torch.no_grad():
        lp = torch.log_softmax(ref(ids, use_cache=False).logits.float(), -1)[:, :-1]
        lq = torch.log_softmax(cand(ids, use_cache=False).logits.float(), -1)[:, :-1]
        return F.kl_div(lq, lp, log_target=True, reduction="none").sum(-1)  # KL(p||q) per token


def probe(ref, cand, ids, per_layer):
    import mismatch

    return mismatch.probe(ref, cand, ids, per_layer=per_layer)


METHODS = {
    "bare": bare,
    "naive": naive,
    "probe": lambda r, c, i: probe(r, c, i, False),
    "probe_layers": lambda r, c, i: probe(r, c, i, True),
}


def peak_extra_mb(method: str) -> float:
    """Run one method in this script as a child process and return its peak extra RSS (MB)."""
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="65536")
    out = subprocess.run([sys.executable, __file__, "--memory", method], env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["peak_extra_mb"]


def _memory_child(method: str) -> None:
    import psutil

    ref, cand, ids = setup()
    METHODS[method](ref, cand, ids[:, :32])  # one-time kernel/allocator set-up is not the method's
    proc = psutil.Process()
    base = proc.memory_info().rss
    peak, done = [base], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], proc.memory_info().rss)
            time.sleep(0.001)

    thread = threading.Thread(target=sample)
    thread.start()
    METHODS[method](ref, cand, ids)
    done.set()
    thread.join()
    print(json.dumps({"peak_extra_mb": (peak[0] - base) / 2**20}))


def main() -> None:
    ref, cand, ids = setup()
    for fn in METHODS.values():  # warm up allocator and kernels
        fn(ref, cand, ids[:, :32])
    times = {name: [] for name in METHODS}
    for _ in range(REPEATS):
        for name, fn in METHODS.items():
            start = time.perf_counter()
            fn(ref, cand, ids)
            times[name].append(time.perf_counter() - start)
    med = {name: statistics.median(v) for name, v in times.items()}
    mem = {name: peak_extra_mb(name) for name in ("naive", "probe", "probe_layers")}

    print(f"SmolLM2-135M, {B}x{T} tokens, torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"median of {REPEATS}")
    for name in METHODS:
        print(f"  {name:13s} {med[name]:7.2f} s  (runs: {', '.join(f'{t:.2f}' for t in times[name])})")
    print("(a) probe / two bare forward passes")
    print(f"  per_layer=False: {med['probe'] / med['bare']:.3f}   (target <= 1.15)")
    print(f"  per_layer=True : {med['probe_layers'] / med['bare']:.3f}   (target <= 1.35)")
    print("(b) probe vs naive (both fp32 [B,T,V] logits + log_softmax + kl_div)")
    print(f"  time ratio probe/naive      : {med['probe'] / med['naive']:.3f}   (target <= 1.0)")
    print(f"  peak extra memory naive     : {mem['naive']:8.1f} MB")
    print(f"  peak extra memory probe     : {mem['probe']:8.1f} MB  (per_layer=True: {mem['probe_layers']:.1f} MB)")
    print(f"  memory ratio naive/probe    : {mem['naive'] / mem['probe']:.2f}x   (target >= 3x)")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--memory":
        _memory_child(sys.argv[2])
    else:
        main()
