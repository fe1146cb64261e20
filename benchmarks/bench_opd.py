"""Where an OPD step's time goes, and what the mismatch metrics cost, measured in one run.

    make bench            # or: HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_opd.py [--steps N]
                          #     (--flops-only [--pair P]: the step ÷ FLOPs rows alone)

For each configuration below, runs `mismatch.opd.train` and prints the median per-step seconds of
  rollout (sampling with the rollout copy + its log-probs), teacher scoring, student update (loss
  forward/backward + AdamW), refresh of the rollout copy, and the step's wall time;
and the mismatch metrics' share of a step: (time spent on the student's sampled-token log-probs +
`sampled_token_metrics`) / wall time, measured inside the same steps (target ≤ 5%).

Configurations: the synthetic pair `sort-gpt2` (clean rollouts and int4:group128 rollouts, 64
prompts per step) and `smollm2-concise` (SmolLM2-135M, clean, 8 prompts per step, 64-token
responses). Held-out evaluation is pushed past the last step so it is not timed.

Then, on smollm2-concise (8 prompts of its task, 64 sampled tokens each), side by side:
  * an OPD step's seconds ÷ the seconds its fp32 matmul FLOPs take at the rate this machine's matmul
    reaches (`step_vs_flops`), per part: how far the step is from compute;
  * decode time per step ÷ its memory-bandwidth bound (target ≤ 3). A decode step reads every
    weight once: the bound is the weight bytes a step reads ÷ the read bandwidth measured in this
    run (sum over a 1 GiB buffer). Decode time per step = (generate 64 tokens − generate 1) / 63,
    so prefill is excluded. Rows: the default `torch` linear (MKL), the oneDNN-packed linears
    `mismatch.model.generate.generate` uses (`mismatch.model.packed_linear`), both with a static KV cache, and with
    `--compile` a static cache plus `torch.compile`d decode step (compile time printed apart); and,
    where the optional extra is installed (`make engines`), llama.cpp decoding the same 8 prompts as
    one batch of 8 sequences from an f32 GGUF export of the same weights with an f32 KV cache (the
    spec `engine:llama.cpp,f32,kv-f32`, within fp32 rounding of the model: docs/engines.md),
    sampled by llama.cpp's own sampler: what a dedicated engine's kernels reach on this CPU;
    `generate` ÷ llama.cpp (target ≤ 1.2), the two alternated three times;
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

import numpy as np  # noqa: E402
import torch  # noqa: E402

from mismatch.model.packed_linear import packed_linears  # noqa: E402
from mismatch.opd import OPDConfig, train  # noqa: E402
from mismatch.opd.trainer import sample_rollouts, score_with_teacher, setup, update  # noqa: E402
from mismatch.model.generate import pad_id, prompt_batch  # noqa: E402

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
    if "--decode-only" in sys.argv:
        return decode_and_update("--compile" in sys.argv)
    if "--flops-only" in sys.argv:  # the step ÷ FLOPs rows alone, on smollm2-concise or --pair P
        pair = sys.argv[sys.argv.index("--pair") + 1] if "--pair" in sys.argv else "smollm2-concise"
        return step_vs_flops(setup(OPDConfig(pair=pair, steps=1, batch_size=8, eval_every=10 ** 6, eval_prompts=1)))
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
    engine_vs_ours(run, model, ids, attn, pad, bound)
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
    step_vs_flops(run)


def matmul_flops_per_s(rows: int, d_in: int, d_out: int) -> float:
    """fp32 FLOP/s of one `[rows, d_in] @ [d_in, d_out]` matmul on this thread count, best of 7."""
    a, w = torch.randn(rows, d_in), torch.randn(d_in, d_out)
    best = float("inf")
    for _ in range(7):
        t0 = time.perf_counter()
        a @ w
        best = min(best, time.perf_counter() - t0)
    return 2 * rows * d_in * d_out / best


def step_vs_flops(run, steps: int = 3) -> None:
    """A SmolLM2 OPD step's time ÷ the time its fp32 matmul FLOPs take at this machine's matmul rate (the
    rate of one `[512, D] @ [D, 4D]` product, the step's typical shape): how far the step is from compute.
    FLOPs are counted per part from the step's own tokens: 2·N_trunk per trunk token (a shared prefix once),
    2·V·D per head row; generation = prefill + one token per sequence per step; the update ×3 (forward and
    backward). Attention's T²-terms are left out (≈ 3% at these lengths)."""
    from mismatch.model.head import shared_prefix

    model, teacher = run.student.model, run.pair.teacher.model
    cfg = model.config
    V, D = cfg.vocab_size, cfg.hidden_size
    trunk = sum(p.numel() for n, p in model.named_parameters() if "layers." in n)  # the blocks' weights
    teacher_trunk = sum(p.numel() for n, p in teacher.named_parameters() if "layers." in n)
    rate = matmul_flops_per_s(512, D, 4 * D)

    def trunk_tokens(ids, mask) -> int:
        P, _ = shared_prefix(ids, mask)
        P = P if P >= 16 else 0
        return int(mask.sum()) - P * (len(ids) - 1)

    rows = []
    for step in range(2, 2 + steps):  # opd_step's parts, timed one by one (its metrics and refresh are ~1%)
        prompts = run.rng.sample(run.train_pool, run.config.batch_size)
        t0 = time.perf_counter()
        rollout, t_batch = sample_rollouts(run, prompts, step)
        t1 = time.perf_counter()
        hidden_T = score_with_teacher(run, t_batch)
        t2 = time.perf_counter()
        update(run, rollout, hidden_T)
        t3 = time.perf_counter()
        batch = rollout.batch
        mask, resp = batch.attention_mask, batch.response_mask.bool()
        prompt_tokens = int((mask.bool() & ~resp).sum())
        n_resp = int(resp.sum())
        gen = 2 * trunk * (prompt_tokens + n_resp) + 2 * V * D * (n_resp + len(batch.input_ids))
        teach = 2 * teacher_trunk * trunk_tokens(t_batch.input_ids, t_batch.attention_mask) + 2 * V * D * n_resp
        upd = 3 * (2 * trunk * trunk_tokens(batch.input_ids, mask) + 2 * V * D * n_resp)
        rows.append((t1 - t0, gen / rate, t2 - t1, teach / rate, t3 - t2, upd / rate, t3 - t0, (gen + teach + upd) / rate))
    med = [statistics.median(r[i] for r in rows) for i in range(8)]
    print(f"\nSmolLM2 OPD step vs its fp32 FLOPs ({torch.get_num_threads()} threads; matmul rate {rate / 1e9:.1f} GFLOP/s "
          f"at [512, {D}] @ [{D}, {4 * D}]), median of {steps} steps, seconds measured ÷ FLOP time:")
    for name, i in (("rollout (generate)", 0), ("teacher", 2), ("update", 4), ("step", 6)):
        print(f"  {name:20s} {med[i]:7.2f} s ÷ {med[i + 1]:6.2f} s = {med[i] / med[i + 1]:5.2f}")


def engine_vs_ours(run, model, ids, attn, pad: int, bound: float, repeats: int = 3) -> None:
    """`generate`'s decode (oneDNN-packed linears, dynamic cache) ÷ llama.cpp's batched decode of the
    same prompts and weights (target ≤ 1.2), alternated `repeats` times; every pair's ratio and the
    median printed."""
    ratios = []
    for _ in range(repeats):
        with torch.no_grad(), packed_linears(model, rows=len(ids)):
            ours = decode_seconds(model, ids, attn, pad, run.max_new_tokens)
        engine = llamacpp_batched_decode_seconds(run, ids, attn, run.max_new_tokens)
        if engine is None:
            return
        ratios.append(ours / engine)
        print(f"  {'llama.cpp f32, kv f32, 8 sequences batched':40s} {engine * 1e3:7.1f} ms/step   ÷ bound "
              f"{engine / bound:5.2f}   (`generate` beside it: {ours * 1e3:.1f} ms/step)")
    print(f"  `generate` ÷ llama.cpp batched decode: {', '.join(f'{r:.2f}' for r in ratios)}; "
          f"median {statistics.median(ratios):.2f} (target ≤ 1.2)")
    # where part of the gap is: torch.multinomial draws one exponential per logit (argmax p / q,
    # q ~ Exp(1)); llama.cpp's `dist` sampler draws one uniform per sequence
    q = torch.empty(len(ids), model.config.vocab_size)
    draws = []
    for _ in range(21):
        t0 = time.perf_counter()
        q.exponential_()
        draws.append(time.perf_counter() - t0)
    print(f"  of a `generate` step: torch.multinomial's exponential draw over {tuple(q.shape)} logits "
          f"{statistics.median(draws) * 1e3:.1f} ms")


def llamacpp_batched_decode_seconds(run, ids, attn, tokens: int) -> float | None:
    """Seconds per decode step of llama.cpp sampling one response per prompt, all prompts as one
    batch (one sequence id each; f32 weights, f32 KV cache, temperature-1 `dist` sampler, no stop
    token), timed as (`tokens` − 1 token) / (tokens − 1), best of 2. None without the extra."""
    try:
        import llama_cpp as L
        from llama_cpp import _internals
    except ImportError:
        print("  (llama.cpp row skipped: the optional extra is not installed; `make engines`)")
        return None
    from mismatch.rollout.llamacpp import gguf_file

    prompts = [row[mask.bool()].tolist() for row, mask in zip(ids, attn)]
    n_seq, n_ctx = len(prompts), 512 * len(prompts)
    with open(os.devnull, "w") as devnull, contextlib.redirect_stderr(devnull):  # llama.cpp's load log
        model = _internals.LlamaModel(path_model=str(gguf_file(run.student, "f32")),
                                      params=L.llama_model_default_params(), verbose=False)
        params = L.llama_context_default_params()
        params.n_ctx, params.n_batch, params.n_ubatch, params.n_seq_max = n_ctx, n_ctx, 512, n_seq
        params.n_threads = params.n_threads_batch = torch.get_num_threads()
        params.type_k = params.type_v = 0  # GGML_TYPE_F32
        params.kv_unified = True
        ctx = _internals.LlamaContext(model=model, params=params, verbose=False)
    batch = L.llama_batch_init(n_ctx, 0, 1)
    chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
    L.llama_sampler_chain_add(chain, L.llama_sampler_init_dist(0))

    def submit(entries: list[tuple[int, int, int, bool]]) -> None:  # (token, position, sequence, logits?)
        batch.n_tokens = len(entries)
        for k, (token, pos, seq, want) in enumerate(entries):
            batch.token[k], batch.pos[k], batch.n_seq_id[k], batch.logits[k] = token, pos, 1, want
            batch.seq_id[k][0] = seq
        if L.llama_decode(ctx.ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")

    def generate(n: int) -> float:
        L.llama_memory_clear(ctx.memory, True)
        t0 = time.perf_counter()
        submit([(t, p, s, p == len(pr) - 1) for s, pr in enumerate(prompts) for p, t in enumerate(pr)])
        rows = [int(i) for i in np.cumsum([len(pr) for pr in prompts]) - 1]  # batch rows holding logits
        for step in range(n):
            new = [L.llama_sampler_sample(chain, ctx.ctx, row) for row in rows]
            if step < n - 1:
                submit([(t, len(pr) + step, s, True) for s, (t, pr) in enumerate(zip(new, prompts))])
                rows = list(range(n_seq))
        return time.perf_counter() - t0

    try:
        generate(2)  # warm-up
        return (min(generate(tokens) for _ in range(2)) - min(generate(1) for _ in range(2))) / (tokens - 1)
    finally:
        L.llama_sampler_free(chain)
        L.llama_batch_free(batch)
        with open(os.devnull, "w") as devnull, contextlib.redirect_stderr(devnull):  # and its closing log
            ctx.close()
            model.close()


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
    pairs = ", ".join(f"{u / b:.2f}" for u, b in zip(times["update"], times["bare"]))
    print(f"\nupdate, smollm2-concise, {batch.response_tokens} response tokens in {tuple(batch.input_ids.shape)}: "
          f"OPD update {up:.2f} s, bare forward+backward+AdamW {ba:.2f} s → ratio {up / ba:.2f} (target ≤ 1.3); "
          f"each repeat's ratio: {pairs}")


if __name__ == "__main__":
    main()
