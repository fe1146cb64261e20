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
one line and exits 2.
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
CUDA_TESTS = ["tests/model/test_device.py", "tests/perturb/test_fp8_gemm.py", "tests/rollout/test_cost.py"]
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
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", *CUDA_TESTS], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    tail = done.stdout.strip().splitlines()[-1:] if done.stdout.strip() else []
    return {"returncode": done.returncode, "summary": tail[0] if tail else done.stderr[-300:]}


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


def check_on_device(model: str, device: str) -> dict:
    import mismatch

    adm = mismatch.check(model, "fp8-e4m3:channel,w8a8,scaled_mm", ref_dtype="bf16", device=device, recipe=False)
    first = adm.decisions[0]
    out = {"status": adm.status, "mismatch_kl": first.value, "interval": [first.low, first.high], "limit": first.limit,
           "tokens": adm.calibration.get("tokens")}
    committed = ROOT / "experiments" / "admission_example" / "fp8_kernel_bf16.json"
    if model == "smollm2-135m" and committed.exists():
        cpu = json.loads(committed.read_text())
        out["cpu_committed"] = {"status": cpu["status"], "mismatch_kl": cpu["decisions"][0]["value"],
                                "tokens": cpu["calibration"]["tokens"]}
    return out


def scale_check(device: str) -> dict:
    """The check on the 1.71B-parameter random-init bf16 checkpoint of benchmarks/bench_scale.py (built once,
    on the CPU), on the device with the real FP8 GEMM: its answer, wall time and the device's peak memory."""
    import torch

    import mismatch

    if not device.startswith("cuda"):
        return {"skipped": "on CUDA only (benchmarks/bench_scale.py measures it on the CPU)"}
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_scale

    checkpoint = bench_scale.build_checkpoint(Path.home() / ".cache" / "mismatch" / "bench-scale" /
                                              "smollm2-1.7b-random-bf16")
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
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--out", type=Path, default=Path("device_check.json"))
    parser.add_argument("--skip-tests", action="store_true", help="leave out the pytest part")
    args = parser.parse_args(argv)
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("device_check: no CUDA device here (run it on a GPU machine, or --device cpu for a dry run)",
              file=sys.stderr)
        return 2
    report: dict = {"device": args.device, "model": args.model, "torch": torch.__version__,
                    "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}
    if not args.skip_tests:
        timed(report, "tests", run_tests)
    timed(report, "probe", lambda: probe_side_by_side(args.model, args.device))
    timed(report, "check", lambda: check_on_device(args.model, args.device))
    timed(report, "rollout_speed", lambda: rollout_speed(args.model))
    timed(report, "scale_check", lambda: scale_check(args.device))
    args.out.write_text(json.dumps(report, indent=1, default=str) + "\n")
    print(f"wrote {args.out}")
    return 0 if not any("error" in v for v in report.values() if isinstance(v, dict)) else 1


if __name__ == "__main__":
    raise SystemExit(main())
