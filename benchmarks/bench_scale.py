"""Scale, measured on this machine (issue 35 §4): the admission check on a checkpoint of 1.7B parameters in
bf16, and a probe of one 8,192-token response, each with its peak resident memory against its bound.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_scale.py [--workdir DIR] [--no-compare]

* The checkpoint: SmolLM2-1.7B's architecture (Llama: 24 blocks, width 2048, MLP 8192, 32 heads, vocabulary
  49,152, tied embeddings; 1.71B parameters), random-init (seed 0) and saved in bf16 with SmolLM2's tokenizer
  under `--workdir` (default `~/.cache/mismatch/bench-scale`; built once, ~3.4 GB; no download).
* `mismatch check DIR --rollout fp8-e4m3:channel --ref-dtype bf16 --device cpu` (4 prompts, ≤ 32 new tokens:
  two cores) runs in a fresh process; its peak RSS (the kernel's `ru_maxrss` of that child) is compared with
  1.3 × the bf16 weight bytes + the fixed overhead, the peak RSS of the same command on the built-in
  `tiny-llama` (the interpreter, torch, transformers, the tokenizer). The model's 1.71B parameters exceed
  `OFFLOAD_BYTES`, so the check offloads the weights the FP8 copy replaced to a temporary file while it runs;
  with `--compare` (default) the same check with `--no-offload` runs beside it (two copies: ~2×).
* The probe: `mismatch.reference` + `mismatch.probe` (per_layer=False) of SmolLM2-135M (the real weights, fp32)
  on one sequence of 8,192 tokens (its whole context: a 9-token prompt, 8,183 response tokens drawn at random:
  memory does not depend on which tokens) under fp8-e4m3:channel, in a fresh process; its peak RSS above the loaded
  model is compared with one `[T, V]` fp32 logit tensor (8,192 × 49,152 × 4 bytes = 1.61 GB), which the
  chunked head never builds: the bound is the chunk's `[chunk, V]` plus the `[T, D]` hidden states.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[1]
MISMATCH = [str(Path(sys.executable).parent / "mismatch")]
SMOLLM2_1_7B = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=24, num_attention_heads=32,
                    num_key_value_heads=32, vocab_size=49152, max_position_embeddings=8192, rope_theta=130000.0,
                    rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2,
                    hidden_act="silu")
CHECK = ["--rollout", "fp8-e4m3:channel", "--ref-dtype", "bf16", "--device", "cpu", "--max-prompts", "4",
         "--max-new-tokens", "32", "--no-recipe", "--json"]
LONG_T = 8192
GIB = 1 << 30


def build_checkpoint(where: Path, tokenizer: str = "smollm2-135m") -> Path:
    """SmolLM2-1.7B's architecture, random-init in bf16, with SmolLM2's tokenizer (built once, in a child
    process: this one stays small, so the children whose peak memory is measured inherit nothing).
    `tokenizer`: the built-in model whose tokenizer it takes, or a directory holding that tokenizer (where
    the weights are not, e.g. benchmarks/device_check.py's packed stand-in on a lent GPU)."""
    if not (where / "tokenizer_config.json").is_file():
        peak_rss([sys.executable, __file__, "--part", "build", "--workdir", str(where), "--tokenizer", tokenizer])
    return where


def build(where: Path, tokenizer: str = "smollm2-135m") -> int:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    import mismatch

    print(f"building the 1.7B random-init checkpoint in {where} (once)", flush=True)
    where.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**SMOLLM2_1_7B, torch_dtype="bfloat16")).to(torch.bfloat16)
    model.save_pretrained(where)
    del model
    tok = AutoTokenizer.from_pretrained(tokenizer) if Path(tokenizer).is_dir() else mismatch.load(tokenizer).tokenizer
    tok.save_pretrained(where)  # last: its file marks the build done
    return 0


def peak_rss(cmd: list[str], ok: tuple[int, ...] = (0,)) -> tuple[int, float, str]:
    """Run `cmd` in a fresh process: its peak RSS in bytes (the kernel's `ru_maxrss` of that one child, read by
    `os.wait4`), its wall time and its stdout. An exit status outside `ok` raises with its last stderr line."""
    import tempfile

    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - start
        proc.returncode = code = os.waitstatus_to_exitcode(status)
        out.seek(0), err.seek(0)
        stdout, stderr = out.read(), err.read()
    if code not in ok:
        raise SystemExit(f"{' '.join(cmd[:5])} … exited {code}: {(stderr.strip().splitlines() or [''])[-1]}")
    return usage.ru_maxrss * 1024, seconds, stdout


def check_part(checkpoint: Path, compare: bool) -> dict:
    """Peak RSS of the check on the 1.7B checkpoint (offloading; with `compare`, not) and on tiny-llama."""
    weights = 0
    for path in checkpoint.glob("*.safetensors"):  # the bytes the header lists (no torch in this process:
        with open(path, "rb") as f:                # a fork would count its memory in the child's peak)
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        for key, entry in header.items():
            if key != "__metadata__":
                assert entry["dtype"] == "BF16", (key, entry["dtype"])
                weights += entry["data_offsets"][1] - entry["data_offsets"][0]
    base, _, _ = peak_rss([*MISMATCH, "check", "tiny-llama", *CHECK], ok=(0, 1, 3))
    runs = {}
    for name, flag in [("offload", "--offload"), *([("no offload", "--no-offload")] if compare else [])]:
        rss, seconds, stdout = peak_rss([*MISMATCH, "check", str(checkpoint), *CHECK, flag], ok=(0, 1, 3))
        admission = json.loads(stdout)
        runs[name] = {"peak_rss_gib": rss / GIB, "above_overhead_per_weight_byte": (rss - base) / weights,
                      "seconds": round(seconds, 1), "status": admission["status"],
                      "mismatch_kl": admission["metrics"]["mismatch_kl"]}
    bound = 1.3 * weights + base
    return {"parameters": weights // 2, "weights_gib": weights / GIB, "fixed_overhead_gib": base / GIB,
            "bound_gib": bound / GIB, "runs": runs, "within_bound": runs["offload"]["peak_rss_gib"] * GIB <= bound}


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _rss() -> tuple[int, int]:
    """(current, peak) resident set of this process in bytes (/proc/self/status VmRSS, VmHWM)."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return tuple(int(fields[k].split()[0]) * 1024 for k in ("VmRSS", "VmHWM"))


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # Linux: VmHWM starts again from the current RSS


def long_probe() -> int:
    """The child of the probe part: one 8,192-token response of SmolLM2-135M, its memory measured in here."""
    import torch

    import mismatch
    from mismatch.perturb import perturbed
    from mismatch.defaults import DEFAULT_CHUNK_TOKENS

    lm = mismatch.load("smollm2-135m")
    gen = torch.Generator().manual_seed(0)
    prompt = lm.tokenizer("Write a long story about a lighthouse keeper.", return_tensors="pt").input_ids
    response = torch.randint(0, lm.model.config.vocab_size, (1, LONG_T - prompt.shape[1]), generator=gen)  # the
    # prompt and the response fill the model's context of 8,192 tokens
    ids = torch.cat([prompt, response], dim=1)
    resp = torch.zeros_like(ids, dtype=torch.bool)
    resp[:, prompt.shape[1]:] = True
    with torch.no_grad():  # the bound's own part: the bare blocks over the same tokens, no head
        _reset_peak()
        start, _ = _rss()
        lm.model.model(input_ids=ids, use_cache=False)
        forward_extra = _rss()[1] - start
    _reset_peak()
    start, _ = _rss()
    t0 = time.perf_counter()
    ref = mismatch.reference(lm, ids, response_mask=resp, per_layer=False)
    with perturbed(lm.model, "fp8-e4m3:channel") as cand:
        result = mismatch.probe(ref, cand, per_layer=False)
    seconds = time.perf_counter() - t0
    extra = _rss()[1] - start
    V, D = lm.model.config.vocab_size, lm.model.config.hidden_size
    chunk = 2 * DEFAULT_CHUNK_TOKENS * V * 4
    copy = sum(p.nbytes for n, p in lm.model.named_parameters() if "proj" in n)  # the fp8 copy's new weights
    print(json.dumps({"tokens": int(resp.sum()), "seconds": round(seconds, 1), "peak_extra_gib": extra / GIB,
                      "bare_forward_extra_gib": forward_extra / GIB, "chunk_gib": chunk / GIB,
                      "perturbed_copy_gib": copy / GIB, "head_copy_gib": V * D * 4 / GIB,
                      "bound_gib": (forward_extra + chunk + copy + V * D * 4) / GIB,
                      "full_logits_gib": LONG_T * V * 4 / GIB, "kl_fwd_mean": result.summary["kl_fwd_mean"]}))
    return 0


def probe_part() -> dict:
    _, _, stdout = peak_rss([sys.executable, __file__, "--part", "long-probe"])
    got = json.loads(stdout.strip().splitlines()[-1])
    got["within_bound"] = got["peak_extra_gib"] <= got["bound_gib"]
    got["below_one_full_logits"] = got["peak_extra_gib"] < got["full_logits_gib"]
    return got


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path.home() / ".cache" / "mismatch" / "bench-scale")
    parser.add_argument("--compare", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--part", choices=["long-probe", "build"], help=argparse.SUPPRESS)  # the children
    parser.add_argument("--tokenizer", default="smollm2-135m", help=argparse.SUPPRESS)  # the build child's
    args = parser.parse_args(argv)
    if args.part == "long-probe":
        return long_probe()
    if args.part == "build":
        return build(args.workdir, args.tokenizer)
    checkpoint = build_checkpoint(args.workdir / "smollm2-1.7b-random-bf16")
    check = check_part(checkpoint, args.compare)
    print(f"check on {checkpoint.name}: {check['parameters'] / 1e9:.2f}B parameters, {check['weights_gib']:.2f} GiB "
          f"of bf16 weights; fixed overhead (the same check on tiny-llama) {check['fixed_overhead_gib']:.2f} GiB")
    for name, run in check["runs"].items():
        print(f"  {name:>10}: peak RSS {run['peak_rss_gib']:.2f} GiB = overhead + "
              f"{run['above_overhead_per_weight_byte']:.2f} x weights   ({run['seconds']:.0f} s, {run['status']}, "
              f"mismatch_kl {run['mismatch_kl']:.4g})")
    print(f"  bound 1.3 x weights + overhead = {check['bound_gib']:.2f} GiB: "
          + ("met" if check["within_bound"] else "NOT met"))
    probe = probe_part()
    print(f"probe of one {probe['tokens']:,}-token response (smollm2-135m, fp8-e4m3:channel, {probe['seconds']:.0f} s): "
          f"peak {probe['peak_extra_gib']:.2f} GiB above the loaded model; bound {probe['bound_gib']:.2f} GiB = bare "
          f"forward {probe['bare_forward_extra_gib']:.2f} + 2 chunks of [1024, V] {probe['chunk_gib']:.2f} + fp8 copy "
          f"{probe['perturbed_copy_gib']:.2f} + head copy {probe['head_copy_gib']:.2f}: "
          + ("met" if probe["within_bound"] else "NOT met")
          + f"; one [T, V] fp32 logit tensor would be {probe['full_logits_gib']:.2f} GiB")
    return 0 if check["within_bound"] and probe["within_bound"] else 1


if __name__ == "__main__":
    sys.exit(main())
