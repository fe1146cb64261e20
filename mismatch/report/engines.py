"""The engine rows of a study: llama.cpp beside the PyTorch-simulated format of the same bits. Reads results only.

`write_engines_report(rows, out_dir, levels=...)` writes, when the dataset holds runs of an engine spec
(`engine:llama.cpp,…`, `sweeps/engines.toml`):
  * `engines.md` — static: each engine probe's summary beside its simulated twins' on the same model and
    prompts; dynamic: each engine rollout level (Δ accuracy and KL ratio against clean, pooled over seeds)
    beside its twin's, and whether the twin's verdict is the engine's;
  * `engines_static.csv`, `engines_dynamic.csv` — those tables.

Twins (`TWINS`): f16 ↔ `dtype:fp16`, q8_0 ↔ `int8:group32` (8 bits, one scale per 32 values), q4_0 ↔
`int4:group32`; f32 and the model's own GGUF file have none (the engine's kernels are the only difference).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from mismatch.rollout.spec import RolloutSpec
from mismatch.report.common import markdown_table, plus_minus
from mismatch.results import summaries
from mismatch.analysis.tolerance import weight_bits

TWINS = {"f16": "dtype:fp16", "q8_0": "int8:group32", "q4_0": "int4:group32"}
STATIC_COLUMNS = ("kl_fwd_mean", "kl_fwd_p99", "top1_agree", "logp_abs_diff_mean", "tokens")


def is_engine(spec: object) -> bool:
    return isinstance(spec, str) and spec.startswith("engine:")


def twin_of(spec: str) -> str | None:
    """The PyTorch-simulated format of the same bits as engine spec `spec`, or None."""
    engine = RolloutSpec.parse(spec).engine
    return TWINS.get(engine.weights) if engine is not None else None


def static_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Per model probed with an engine spec: each engine run and each twin run (every scope), one row each."""
    probes = rows[rows["kind"] == "probe"]
    if probes.empty or not probes["perturb"].map(is_engine).any():
        return pd.DataFrame()
    summ = summaries(probes)
    out = []
    for (reference, prompts), part in summ.groupby(["reference", "prompts_sha256"], sort=True):
        engines = part[part["perturb"].map(is_engine)]
        if engines.empty:
            continue
        twins = {t for t in map(twin_of, engines["perturb"]) if t}
        shown = pd.concat([engines, part[part["perturb"].isin(twins)]])
        for _, r in shown.iterrows():
            out.append({"model": reference, "rollout copy": r["perturb"], "layers": r["layers"],
                        "bits": weight_bits(r["perturb"]), **{c: r.get(c) for c in STATIC_COLUMNS},
                        "twin of": next((e for e in engines["perturb"] if twin_of(e) == r["perturb"]), "")})
    return pd.DataFrame(out)


def dynamic_table(levels: pd.DataFrame) -> pd.DataFrame:
    """Each engine level beside its twin (same pair and settings): means ± the design's intervals and verdicts."""
    if levels.empty or not levels["level"].map(is_engine).any():
        return pd.DataFrame()
    out = []
    for (pair, settings), part in levels.groupby(["pair", "settings"], sort=True):
        by_level = {str(r["level"]): r for _, r in part.iterrows()}
        for level, r in by_level.items():
            if not is_engine(level):
                continue
            twin = by_level.get(twin_of(level) or "")
            row = {"pair": pair, "settings": settings, "engine": level, "seeds": int(r["seeds"]),
                   "mismatch_kl": f"{r['mismatch_kl']:.4g}", "Δ accuracy (pts)": plus_minus(r["acc_delta"], r["acc_delta_hw"], 100),
                   "KL ratio": plus_minus(r["kl_ratio"], r["kl_ratio_hw"], pattern="{:.3f}"), "verdict": r["verdict"],
                   "twin": twin_of(level) or "—"}
            row.update({"twin mismatch_kl": "—", "twin Δ accuracy": "—", "twin KL ratio": "—",
                        "twin verdict": "not run" if twin_of(level) else "—", "same verdict": "—"})
            if twin is not None:
                row.update({"twin mismatch_kl": f"{twin['mismatch_kl']:.4g}",
                            "twin Δ accuracy": plus_minus(twin["acc_delta"], twin["acc_delta_hw"], 100),
                            "twin KL ratio": plus_minus(twin["kl_ratio"], twin["kl_ratio_hw"], pattern="{:.3f}"),
                            "twin verdict": twin["verdict"], "same verdict": "yes" if twin["verdict"] == r["verdict"] else "no"})
            out.append(row)
    return pd.DataFrame(out)


def _markdown(static: pd.DataFrame, dynamic: pd.DataFrame) -> str:
    shown = static.assign(**{c: static[c].map(lambda v: f"{v:.4g}") for c in STATIC_COLUMNS if c in static})
    return "\n".join([
        "# A real engine beside its simulation: llama.cpp", "",
        "The rollout copy runs in llama.cpp (`engine:llama.cpp,WEIGHTS`: the model exported to GGUF, or its own "
        "GGUF file, run by llama.cpp's CPU kernels, KV cache f16 unless `kv-f32`) or in PyTorch under the "
        "simulated format of the same bits (its twin: f16 ↔ dtype:fp16, q8_0 ↔ int8:group32, q4_0 ↔ "
        "int4:group32). Static: full-vocabulary mismatch on the same responses (nats per token). Dynamic: "
        "OPD with those rollouts against the clean twin run, mean over seeds ± the sequential design's interval "
        "(tolerance.md); before its first look a level has none (uncertain).", "",
        "## Static", "", markdown_table(shown) if len(static) else "(no engine probe)", "",
        "## Dynamic", "", markdown_table(dynamic) if len(dynamic) else "(no engine OPD run)", ""])


def write_engines_report(rows: pd.DataFrame, out_dir: str | Path, *, levels: pd.DataFrame) -> list[Path]:
    """Write `engines.md` and its CSVs when the rows hold engine runs (module docstring); else nothing."""
    static, dynamic = static_table(rows), dynamic_table(levels)
    if static.empty and dynamic.empty:
        return []
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [out_dir / "engines.md", out_dir / "engines_static.csv", out_dir / "engines_dynamic.csv"]
    written[0].write_text(_markdown(static, dynamic))
    static.to_csv(written[1], index=False)
    dynamic.to_csv(written[2], index=False)
    return written
