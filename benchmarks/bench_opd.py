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

Then, on smollm2-concise (8 prompts of its task, 64 sampled tokens each), side by side:
  * decode time per step ÷ its memory-bandwidth bound (target ≤ 3). A decode step reads every
    weight once: the bound is the weight bytes a step reads ÷ the read bandwidth measured in this
    run (sum over a 1 GiB buffer). Decode time per step = (generate 64 tokens − generate 1) / 63,
    so prefill is excluded. Rows: the default `torch` linear (MKL), the oneDNN-packed linears
    `mismatch.rollout.generate` uses (`mismatch.decode`), both with a static KV cache, and with
    `--compile` a static cache plus `torch.compile`d decode step (compile time printed apart);
  * the OPD update (`recipe.update`: loss forward/backward with the teacher's chunked head, clip,
    AdamW) ÷ one bare forward + backward + AdamW step of the student on the same tokens (Hugging
    Face cross-entropy on the response tokens; target ≤ 1.3), medians of alternating repeats.
"""

from __future__ import annotations

import os
import statistics
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import contextlib  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402

from mismatch.decode import packed_linears  # noqa: E402
from mismatch.opd import OPDConfig, train  # noqa: E402
from mismatch.opd.recipe import sample_rollouts, score_with_teacher, setup, update  # noqa: E402
from mismatch.rollout import pad_id, prompt_batch  # noqa: E402

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
    decode_and_update("--compile" in sys.argv)


def read_bandwidth() -> float:
    """Bytes/s of a streaming read (sum of a 1 GiB fp32 buffer), best of 5."""
    buf = torch.ones(1 << 28)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        buf.sum()
        best = min(best, time.perf_counter() - t0)
    return buf.numel() * buf.element_size() / best


def weight_bytes_per_step(model) -> int:
    """Bytes of the parameters one decode step reads: every unique parameter tensor, except an
    input embedding that is not also the output head (a step reads only B rows of it)."""
    embed, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    seen, total = set(), 0
    for p in model.parameters():
        if p.data_ptr() in seen or (p is embed and embed.data_ptr() != head.data_ptr()):
            continue
        seen.add(p.data_ptr())
        total += p.numel() * p.element_size()
    return total


def decode_seconds(model, ids, attn, pad: int, tokens: int, **kwargs) -> float:
    """Seconds per decode step: (generate `tokens` − generate 1) / (tokens − 1), sampled, best of 2."""
    def timed(n: int) -> float:
        best = float("inf")
        for _ in range(2):
            torch.manual_seed(0)
            t0 = time.perf_counter()
            model.generate(input_ids=ids, attention_mask=attn, max_new_tokens=n, min_new_tokens=n, do_sample=True,
                           top_k=0, pad_token_id=pad, **kwargs)
            best = min(best, time.perf_counter() - t0)
        return best
    with torch.no_grad():
        return (timed(tokens) - timed(1)) / (tokens - 1)


def decode_and_update(compiled: bool) -> None:
    config = OPDConfig(pair="smollm2-concise", steps=1, batch_size=8, eval_every=10 ** 6, eval_prompts=1)
    run = setup(config)
    pair, model = run.pair, run.student.model
    prompts = run.train_pool[:8]
    tok = pair.student.tokenizer
    ids, attn = prompt_batch(tok, prompts, chat=pair.chat, context=pair.student_context)
    pad = pad_id(tok)
    bandwidth = read_bandwidth()
    bound = weight_bytes_per_step(model) / bandwidth
    print(f"\ndecode, smollm2-concise, {len(prompts)} prompts × {run.max_new_tokens} sampled tokens: "
          f"{weight_bytes_per_step(model) / 1e6:.0f} MB of weights per step, read bandwidth "
          f"{bandwidth / 1e9:.1f} GB/s → bound {bound * 1e3:.1f} ms/step")
    rows = [("default linear (MKL), dynamic cache", contextlib.nullcontext, {}),
            ("default linear (MKL), static cache", contextlib.nullcontext, {"cache_implementation": "static",
                                                                           "disable_compile": True}),
            ("oneDNN packed, dynamic cache (used)", lambda: packed_linears(model, rows=len(prompts)), {}),
            ("oneDNN packed, static cache", lambda: packed_linears(model, rows=len(prompts)),
             {"cache_implementation": "static", "disable_compile": True})]
    for label, ctx, kwargs in rows:
        with torch.no_grad(), ctx():
            step = decode_seconds(model, ids, attn, pad, run.max_new_tokens, **kwargs)
        print(f"  {label:40s} {step * 1e3:7.1f} ms/step   ÷ bound {step / bound:5.2f}   (target ≤ 3)")
    if compiled:
        from transformers import CompileConfig
        cc = CompileConfig(dynamic=False, mode=None)
        cc._compile_all_devices = True  # transformers compiles on CUDA only unless told
        t0 = time.perf_counter()
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=attn, max_new_tokens=2, pad_token_id=pad,
                           cache_implementation="static", compile_config=cc)
        compile_s = time.perf_counter() - t0
        step = decode_seconds(model, ids, attn, pad, run.max_new_tokens, cache_implementation="static",
                              compile_config=cc)
        print(f"  {'static cache + torch.compile (inductor)':40s} {step * 1e3:7.1f} ms/step   ÷ bound "
              f"{step / bound:5.2f}   (compile {compile_s:.0f} s)")
    update_ratio(run)


def update_ratio(run, repeats: int = 4) -> None:
    """The OPD update ÷ a bare forward + backward + AdamW step on the same tokens."""
    model = run.student.model
    rollout, t_batch = sample_rollouts(run, run.train_pool[:8], 1)
    hidden_T = score_with_teacher(run, t_batch)
    batch = rollout.batch
    labels = batch.input_ids.masked_fill(~batch.response_mask.bool(), -100)
    bare_opt = torch.optim.AdamW(model.parameters(), lr=1e-7)

    def bare() -> None:
        bare_opt.zero_grad(set_to_none=True)
        model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, labels=labels).loss.backward()
        bare_opt.step()

    times: dict[str, list[float]] = {"update": [], "bare": []}
    for i in range(repeats + 1):  # the first of each (optimizer state allocation) is dropped
        for name, fn in (("update", lambda: update(run, rollout, hidden_T)), ("bare", bare)):
            t0 = time.perf_counter()
            fn()
            if i:
                times[name].append(time.perf_counter() - t0)
    up, ba = statistics.median(times["update"]), statistics.median(times["bare"])
    print(f"\nupdate, smollm2-concise, {batch.response_tokens} response tokens in {tuple(batch.input_ids.shape)}: "
          f"OPD update {up:.2f} s, bare forward+backward+AdamW {ba:.2f} s → ratio {up / ba:.2f} (target ≤ 1.3)")


if __name__ == "__main__":
    main()
