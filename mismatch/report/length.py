"""The length law: how the tolerated per-token mismatch scales with response length (`mismatch.analysis.length`).

`write_length_report(levels, out_dir, families)` finds the ladders that differ only in response length — a
*rung* is a pair at one response cap: pairs that train the same models (`families(pair)` names them: pairs
whose `PairSpec.build` is one build, as the sortk rungs were to be: experiments/length_ladder/), or one pair
run at several `max_new_tokens` (the cap the settings name; `sweeps/length.toml` on smollm2-pruned), under
the same loss and other settings — and writes, when there are at least two lengths:
  * `length_law.csv` — per length, the noise ladder's bracket on the tolerated per-token first-step `mismatch_kl`,
    judged on the KL ratio alone (`kl_verdict`: one criterion at every length), with the law's exponent
    interval on each row;
  * `length_law.md` — those brackets, the exponents they allow (and the hypotheses per token, b = −½, per
    sequence, allowed or excluded), the same with the marginal verdicts taken as undecided where that changes
    it (`mismatch.analysis.length.firm_verdicts`: a law resting on intervals that clear 1.1 by less than the
    evaluation's Monte-Carlo error says so; the admission check scales its limits by that one), and every other level at each length (formats) with its KL verdict.
`length_law.csv` is where the admission check is to read the law from (issue 34).
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from mismatch.analysis.length import family, firm_verdicts, length_tables, rungs
from mismatch.analysis.tolerance import NOISE_FLOOR_SOURCE
from mismatch.report.common import markdown_table


def write_length_report(levels: pd.DataFrame, out_dir: str | Path, families=family) -> list[Path]:
    """Write `length_law.csv` and `length_law.md` when `levels` hold a length ladder; else nothing."""
    table, laws = length_tables(levels, families)
    firm = dict(length_tables(firm_verdicts(levels), families)[1])
    if table.empty:
        return []
    out_dir = Path(out_dir)
    csv, md = out_dir / "length_law.csv", out_dir / "length_law.md"
    table.to_csv(csv, index=False)
    lines = ["# Tolerated mismatch against response length", "",
             "Per length, the noise ladder's bracket on the tolerated per-token `mismatch_kl` at the first step "
             "(nats; `first_mismatch_kl`, a level's mean over its seeds of the value before any update: what the "
             "check measures and scales by the law; tolerance_levels.csv's `mismatch_kl` is the mean over the runs' "
             "steps, which falls more during training at longer responses): `low`, the "
             "largest level tolerated with every smaller one tolerated; `high`, the smallest not tolerated; judged "
             "on the held-out KL ratio alone at every length (an exact-match accuracy falls towards 0 as responses "
             "grow). The exponents b of the power laws limit(T) = c·T^b passing through every bracket form the "
             "interval given; it is the set the decided verdicts allow, not a fitted confidence interval.", ""]
    for (fam, loss, settings), law in laws:
        part = table[(table["family"] == fam) & (table["loss"] == loss) & (table["settings"] == settings)]
        shown = part[["pair", "max_new_tokens", "response_tokens", "low", "high", "levels", "undecided"]].assign(
            response_tokens=part["response_tokens"].map(lambda v: f"{v:.1f}"),
            high=part["high"].map(lambda v: "∞" if math.isinf(v) else f"{v:.4g}"),
            low=part["low"].map(lambda v: f"{v:.4g}"))
        lines += [f"## {fam} · {loss} · {settings}", "", markdown_table(shown), "", f"**{law.describe()}**", ""]
        without = firm.get((fam, loss, settings))
        if without is not None and (without.b_low, without.b_high) != (law.b_low, law.b_high):
            lines += ["With the marginal verdicts taken as undecided (an interval that clears 1.1 by less than the "
                      f"evaluation's Monte-Carlo error: `marginal` in tolerance_levels.csv): {without.describe()}", ""]
        every = rungs(levels, families)
        others = every[every["pair"].isin(part["pair"]) & ~every["source"].isin(["noise", NOISE_FLOOR_SOURCE])
                       & (every["loss"] == loss) & (every["base_settings"] == settings)]
        if len(others):
            lines += ["Other levels at each length:", "", markdown_table(others[[
                "pair", "max_new_tokens", "source", "level", "response_tokens", "first_mismatch_kl", "kl_ratio",
                "kl_ratio_hw", "seeds", "kl_verdict", "verdict"]]), ""]
    md.write_text("\n".join(lines))
    return [csv, md]
