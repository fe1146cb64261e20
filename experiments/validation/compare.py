"""The admission check on held-out cases (issue 34 §4): its pre-registered decisions beside the study's verdicts.

    .venv/bin/python experiments/validation/compare.py            # writes experiments/validation/validation.json

The cases are sweeps/validation.toml's: rollout copies the thresholds were never fitted on, each decided by
`mismatch check` before any OPD run of it (experiments/admission_example/, written by its run.sh), then trained
against the study's clean twins (full-rkl, lr 3e-5, 40 steps, 3 seeds). Their runs are compacted apart
(experiments/validation/validation.parquet, `compact.py --only sweeps/validation.toml`) so that `make thresholds`
never fits on them; the verdicts are the study's own analysis (`mismatch.analysis.tolerance.analyse`) of those runs
together with the study's (the pair's A/A runs set the basis of each interval, as in reports/).

The check agrees with the study where it admits a tolerated level or rejects a not-tolerated one; an undecided
level (the study's interval straddles its threshold) neither confirms nor refutes it, and is said so, with
whether its means kept up with clean (`mismatch.analysis.tolerance.kept_up`: a direction, not a verdict).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from mismatch.analysis.tolerance import analyse, kept_up
from mismatch.verdict import DEFAULT_TOLERANCE

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CASES = [  # (the check's JSON, the rollout, the layer scope) as pre-registered in sweeps/validation.toml
    ("concise_int4_block0.json", "int4:group128", "0"),
    ("concise_int2_block5.json", "int2:group32", "5"),
]
# the same copies checked again with the teacher (the window statistic decides), after the first look, before
# the second: `<name>_window.json`
AGREES = {("admit", "tolerated"): True, ("reject", "not tolerated"): True,
          ("admit", "not tolerated"): False, ("reject", "tolerated"): False}


def _window_check(name: str, verdict: str) -> dict:
    """The window decision of the same copy (`<name>_window.json`): its statistic, interval, limit, status and
    whether the study's verdict agrees with it."""
    admission = json.loads((ROOT / "experiments/admission_example" / name.replace(".json", "_window.json")).read_text())
    (window,) = [d for d in admission["decisions"] if d["decides"] and "/window:" in d["metric"]]
    return {"window_check": admission["status"], "window_mismatch_kl": window["value"],
            "window_interval": [window["low"], window["high"]], "window_limit": window["limit"],
            "window_agrees": AGREES.get((admission["status"], verdict))}


def compare() -> dict:
    """The study's verdict on each held-out case beside the check's decisions (what `validation.json` holds)."""
    rows = pd.concat([pd.read_parquet(ROOT / "experiments/study_data/study.parquet"),
                      pd.read_parquet(HERE / "validation.parquet")], ignore_index=True)
    levels = analyse(rows, DEFAULT_TOLERANCE).levels
    levels = levels[levels["pair"] == "smollm2-concise"]
    out = []
    for name, rollout, layers in CASES:
        admission = json.loads((ROOT / "experiments/admission_example" / name).read_text())
        assert (admission["rollout"], admission["layers"]) == (rollout, layers), name
        fitted = admission["decisions"][0]
        level = levels[(levels["level"].astype(str) == rollout)
                       & levels["settings"].str.endswith(f", layers {layers}")]
        if len(level) != 1:
            raise SystemExit(f"{rollout} on block {layers}: {len(level)} levels in the rows (its runs compacted?)")
        lv = level.iloc[0]
        out.append({
            "rollout": rollout, "layers": layers, "check": admission["status"],
            "mismatch_kl": fitted["value"], "mismatch_kl_interval": [fitted["low"], fitted["high"]],
            "limit": fitted["limit"], "study": lv["verdict"], "judged_on": lv["judged_on"], "seeds": int(lv["seeds"]),
            "kl_ratio": float(lv["kl_ratio"]), "kl_ratio_hw": float(lv["kl_ratio_hw"]),
            "acc_delta": float(lv["acc_delta"]), "acc_delta_hw": float(lv["acc_delta_hw"]),
            "first_step_mismatch_kl": float(lv["mismatch_kl"]),
            "agrees": AGREES.get((admission["status"], lv["verdict"])),  # None: the study did not decide
            **_window_check(name, lv["verdict"]),
            "kept_up_by_means": bool(kept_up(level, tolerance=DEFAULT_TOLERANCE).iloc[0]),
        })
    return {"pair": "smollm2-concise", "loss": "full-rkl", "lr": 3e-5, "steps": 40, "cases": out}


def main() -> dict:
    result = compare()
    (HERE / "validation.json").write_text(json.dumps(result, indent=1) + "\n")
    for case in result["cases"]:
        words = {True: "agrees", False: "DISAGREES", None: "not decided by the study"}
        verdict = f"{words[case['agrees']]}; window check {case['window_check']}: {words[case['window_agrees']]}"
        print(f"{case['rollout']} on block {case['layers']}: check {case['check']} (mismatch_kl "
              f"{case['mismatch_kl']:.4f} [{case['mismatch_kl_interval'][0]:.4f}, {case['mismatch_kl_interval'][1]:.4f}]"
              f", limit {case['limit']:.4f}); study {case['study']} at {case['seeds']} seeds (KL ratio "
              f"{case['kl_ratio']:.3f} ± {case['kl_ratio_hw']:.3f}, Δacc {case['acc_delta']:+.3f} ± "
              f"{case['acc_delta_hw']:.3f}): {verdict}; by the means "
              + ("kept up with clean" if case["kept_up_by_means"] else "fell behind clean"))
    return result


if __name__ == "__main__":
    main()
