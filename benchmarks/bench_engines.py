"""llama.cpp as a rollout engine on SmolLM2-135M, side by side in one run (needs `make engines`).

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_engines.py [--tokens 64] [--prompts 4]

  * decode speed: one response at a time, sampled at temperature 1 to exactly `--tokens` tokens
    (EOS not honoured, so every engine decodes the same number), ms per generated token, for
    PyTorch (`transformers` `generate`, fp32, batch 1) and llama.cpp with each GGUF weight type
    (SmolLM2's own Q4_1 file, and exports f32 / f16 / q8_0 / q4_0), beside the memory-bandwidth bound
    of reading the weights once per token (weight bytes ÷ a measured copy bandwidth);
  * the cost of following the trainer (an OPD rollout copy in llama.cpp is re-exported after every
    optimizer step): GGUF export + reopening the engine, per weight type, against the decode time of
    one OPD batch of 8 × 64 tokens.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

import mismatch  # noqa: E402
from mismatch.rollout.llamacpp import LlamaCpp, open_engine  # noqa: E402
from mismatch.model.loader import LM  # noqa: E402
from mismatch.model.generate import encode, read_prompts  # noqa: E402

WEIGHTS = ("gguf", "f32", "f16", "q8_0", "q4_0")


def bandwidth_gb_s() -> float:
    """Memory copy bandwidth (GB/s, bytes read + written), the best of 5 copies of 256 MB."""
    src = torch.ones(64 << 20, dtype=torch.float32)
    dst = torch.empty_like(src)
    best = min(_timed(lambda: dst.copy_(src)) for _ in range(5))
    return 2 * src.numel() * 4 / best / 1e9


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def torch_ms_per_token(lm: LM, prompts: list[list[int]], tokens: int) -> float:
    times = []
    for i, ids in enumerate(prompts):
        torch.manual_seed(i)
        x = torch.tensor([ids])
        with torch.no_grad():
            times.append(_timed(lambda: lm.model.generate(input_ids=x, attention_mask=torch.ones_like(x), do_sample=True,
                                                          top_k=0, max_new_tokens=tokens, min_new_tokens=tokens)))
    return 1e3 * statistics.median(times) / tokens


def engine_ms_per_token(engine: LlamaCpp, prompts: list[list[int]], tokens: int) -> float:
    times = [_timed(lambda: engine.sample(ids, tokens, seed=i, eos_id=None)) for i, ids in enumerate(prompts)]
    return 1e3 * statistics.median(times) / tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=4)
    args = parser.parse_args()
    lm = mismatch.load("smollm2-135m")
    texts = read_prompts(Path(mismatch.__file__).parent / "data" / "prompts.txt")[:args.prompts]
    prompts = encode(lm.tokenizer, texts, chat=True)
    bw = bandwidth_gb_s()
    n_params = sum(p.numel() for p in lm.model.parameters())
    print(f"SmolLM2-135M, {args.prompts} prompts × {args.tokens} sampled tokens, one at a time, "
          f"{torch.get_num_threads()} threads; copy bandwidth {bw:.1f} GB/s")
    print(f"{'rollout engine':28s} {'ms/token':>9s} {'file MB':>8s} {'bound ms':>9s} {'÷ bound':>8s}")
    pt = torch_ms_per_token(lm, prompts, args.tokens)
    bound = n_params * 4 / bw / 1e6
    print(f"{'PyTorch fp32 (generate)':28s} {pt:9.1f} {n_params * 4 / 1e6:8.0f} {bound:9.1f} {pt / bound:8.2f}")
    for weights in WEIGHTS:
        engine = open_engine(lm, weights)
        mb = engine.path.stat().st_size / 1e6
        ms = engine_ms_per_token(engine, prompts, args.tokens)
        bound = mb / bw  # MB ÷ GB/s = ms
        print(f"{'llama.cpp ' + weights:28s} {ms:9.1f} {mb:8.0f} {bound:9.1f} {ms / bound:8.2f}   (× PyTorch {ms / pt:.2f})")
        engine.close()
    print("\nfollowing the trainer: export + reopen per optimizer step, vs decoding one OPD batch of 8 × 64 tokens")
    with tempfile.TemporaryDirectory() as tmp:
        for weights in WEIGHTS[1:]:
            engine = open_engine(lm, weights)
            batch_s = 8 * 64 * engine_ms_per_token(engine, prompts[:2], 64) / 1e3
            engine.close()
            cost = min(_timed(lambda: open_engine(lm, weights, path=Path(tmp) / "r.gguf").close()) for _ in range(2))
            print(f"  {weights:5s} export + open {cost:5.2f} s   batch decode {batch_s:5.2f} s   "
                  f"export ÷ decode {cost / batch_s:.2f}")


if __name__ == "__main__":
    main()
