"""Tolerance verdict: does OPD under a mismatch end where the clean run ends?"""

from __future__ import annotations

import math


def final_value(rows: list[dict], metric: str) -> float:
    """The metric's value at the last step that recorded it (NaN if none did)."""
    values = [(r["step"], r["value"]) for r in rows if r["metric"] == metric]
    return max(values)[1] if values else math.nan


def verdict(clean_rows: list[dict], run_rows: list[dict], *, kl_tol: float = 0.10,
            acc_tol: float = 0.02) -> dict[str, float | bool]:
    """Compare a run's final held-out metrics with the clean run's (same seed, same prompts).

    Tolerated when the final held-out reverse KL is at most `(1 + kl_tol)` × clean and (pairs
    with a task) the final held-out accuracy (`heldout_accuracy`: exact match of the student's
    temperature-1 samples) at least clean − `acc_tol` (absolute, 0.02 = 2 points).

    Returns:
        clean / run held-out KL (nats) and accuracy, `kl_ratio` = run / clean, `acc_delta` =
        run − clean, and `tolerated`.
    """
    out: dict[str, float | bool] = {
        "clean_heldout_rkl": final_value(clean_rows, "heldout_rkl"),
        "run_heldout_rkl": final_value(run_rows, "heldout_rkl"),
        "clean_heldout_accuracy": final_value(clean_rows, "heldout_accuracy"),
        "run_heldout_accuracy": final_value(run_rows, "heldout_accuracy"),
    }
    out["kl_ratio"] = out["run_heldout_rkl"] / out["clean_heldout_rkl"]
    out["acc_delta"] = out["run_heldout_accuracy"] - out["clean_heldout_accuracy"]
    ok = out["kl_ratio"] <= 1.0 + kl_tol
    if not math.isnan(out["acc_delta"]):
        ok = ok and out["acc_delta"] >= -acc_tol
    out["tolerated"] = bool(ok)
    return out
