"""The engine rows of a report, from a hand-made study: each engine level beside its simulated twin."""

import dataclasses
import statistics

import pandas as pd
import pytest

from mismatch.opd.config import OPDConfig
from mismatch.report.engines import dynamic_table, static_table, twin_of, write_engines_report
from mismatch.results import tidy
from mismatch.analysis.tolerance import level_table, run_table
from tests.admission.test_thresholds import _run
from tests.conftest import STAMP
from tests.analysis.test_tolerance import _first_look_half

ACC = {"none": [0.50, 0.52, 0.48], "engine:llama.cpp,f16": [0.49, 0.52, 0.47], "dtype:fp16": [0.50, 0.51, 0.49],
       "engine:llama.cpp,f32": [0.30, 0.31, 0.30], "engine:llama.cpp,q8_0": [0.50, 0.52, 0.48]}


def _study() -> pd.DataFrame:
    base = OPDConfig(pair="reverse-qwen3", steps=2, batch_size=4)
    return pd.concat([_run(dataclasses.replace(base, rollout=rollout, seed=seed), acc[seed], 0.01)
                      for rollout, acc in ACC.items() for seed in range(3)], ignore_index=True)


def _probe(reference: str, perturb: str, layers: str, kl: float) -> pd.DataFrame:
    summary = pd.DataFrame({"metric": ["kl_fwd_mean", "kl_fwd_p99", "top1_agree", "logp_abs_diff_mean", "tokens"],
                            "value": [kl, 10 * kl, 1 - kl, kl / 2, 100.0]}).assign(level="summary")
    config = {"reference": reference, "candidate": reference, "perturb": perturb, "layers": layers,
              "prompts_sha256": "p", "seed": 0}
    return tidy(summary, kind="probe", config=config, stamp=STAMP)


def test_twins_are_the_formats_of_the_same_bits():
    assert [twin_of(s) for s in ("engine:llama.cpp,f16", "engine:llama.cpp,q8_0,kv-f32", "engine:llama.cpp,q4_0",
                                 "engine:llama.cpp,f32", "engine:llama.cpp,gguf")] == [
        "dtype:fp16", "int8:group32", "int4:group32", None, None]


def test_the_dynamic_rows_pair_each_engine_level_with_its_twin():
    rows = _study()
    table = dynamic_table(level_table(run_table(rows))).set_index("engine")
    assert set(table.index) == {"engine:llama.cpp,f16", "engine:llama.cpp,f32", "engine:llama.cpp,q8_0"}
    assert table.loc["engine:llama.cpp,q8_0", "twin verdict"] == "not run"  # its twin int8:group32 is not in the study
    deltas = [a - c for a, c in zip(ACC["engine:llama.cpp,f16"], ACC["none"])]
    half = _first_look_half(deltas)  # the design's first look, the level's own sd (no A/A level here)
    f16 = table.loc["engine:llama.cpp,f16"]
    assert f16["Δ accuracy (pts)"] == f"{100 * statistics.mean(deltas):+.1f} ± {100 * half:.1f}"
    twin = [a - c for a, c in zip(ACC["dtype:fp16"], ACC["none"])]
    assert f16["twin Δ accuracy"].startswith(f"{100 * statistics.mean(twin):+.1f} ±")
    assert f16["seeds"] == 3 and f16["twin"] == "dtype:fp16"
    assert f16["same verdict"] == ("yes" if f16["verdict"] == f16["twin verdict"] else "no")
    f32 = table.loc["engine:llama.cpp,f32"]
    assert f32["verdict"] == "not tolerated" and f32["twin"] == "—" and f32["twin verdict"] == "—"  # −20 points


def test_the_static_rows_and_the_files(tmp_path):
    probes = pd.concat([_probe("smollm2-135m", "engine:llama.cpp,q8_0", "all", 0.004),
                        _probe("smollm2-135m", "int8:group32", "linear", 0.003),
                        _probe("smollm2-135m", "int8:group32", "all", 0.0035),
                        _probe("smollm2-135m", "int4:group128", "linear", 0.2)], ignore_index=True)
    static = static_table(probes)
    assert list(static["rollout copy"]) == ["engine:llama.cpp,q8_0", "int8:group32", "int8:group32"]  # no unrelated spec
    assert list(static["twin of"]) == ["", "engine:llama.cpp,q8_0", "engine:llama.cpp,q8_0"]
    assert static.loc[0, "bits"] == 8.5 and static.loc[2, "kl_fwd_mean"] == pytest.approx(0.0035)
    rows = pd.concat([probes, _study()], ignore_index=True)
    written = write_engines_report(rows, tmp_path, levels=level_table(run_table(rows[rows["kind"] == "opd"])))
    assert [p.name for p in written] == ["engines.md", "engines_static.csv", "engines_dynamic.csv"]
    text = written[0].read_text()
    assert "engine:llama.cpp,q8_0" in text and "dtype:fp16" in text
    assert write_engines_report(_probe("m", "int8:group32", "linear", 0.1), tmp_path / "none",
                                levels=pd.DataFrame()) == []
