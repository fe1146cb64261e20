"""The length law: how the tolerated per-token mismatch scales with response length (`mismatch.opd.length`).

`write_length_report(levels, out_dir, families)` finds the ladders that differ only in response length — a
*rung* is a pair at one response cap: pairs that train the same models (`families(pair)` names them: pairs
whose `PairSpec.build` is one build, as the sortk rungs were to be: experiments/length_ladder/), or one pair
run at several `max_new_tokens` (the cap the settings name; `sweeps/length.toml` on smollm2-pruned), under
the same loss and other settings — and writes, when there are at least two lengths:
  * `length_law.csv` — per length, the noise ladder's bracket on the tolerated per-token `mismatch_kl`,
    judged on the KL ratio alone (`kl_verdict`: one criterion at every length), with the law's exponent
    interval on each row;
  * `length_law.md` — those brackets, the exponents they allow (and the hypotheses per token, b = −½, per
    sequence, allowed or excluded), and every other level at each length (formats) with its KL verdict.
`length_law.csv` is where the admission check is to read the law from (issue 34).
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from mismatch.opd.length import brackets, length_law
from mismatch.opd.tolerance import NOISE_FLOOR_SOURCE
from mismatch.pairs.registry import PAIRS
from mismatch.report.common import markdown_table


def family(pair: str) -> str:
    """The models a pair's runs train: the build a registered pair shares (`PairSpec.build`), else the
    pair itself."""
    spec = PAIRS.get(pair)
    return (spec.build or pair) if spec is not None else pair


LENGTH_SETTING = "max_new_tokens"  # the settings item that caps the response: a rung's, not the ladder's


def split_length(settings: str) -> tuple[str, str]:
    """A level's settings text (`mismatch.opd.tolerance.run_table`) as (the ladder's settings, the response cap):
    `"lr 0.0003, max_new_tokens 16"` → `("lr 0.0003", "16")`; without a cap item, `(settings, "")`; `off` is the
    pair's own cap."""
    items = settings.split(", ")
    caps = [item.removeprefix(LENGTH_SETTING + " ") for item in items if item.startswith(LENGTH_SETTING + " ")]
    rest = [item for item in items if not item.startswith(LENGTH_SETTING + " ")]
    return ", ".join(rest) or "default", (caps[0] if caps else "")


def _rungs(levels: pd.DataFrame, families) -> pd.DataFrame:
    """`levels` with `family`, the ladder's `base_settings` and each level's response cap `max_new_tokens`."""
    split = [split_length(s) for s in levels["settings"]]
    return levels.assign(family=levels["pair"].map(families), base_settings=[b for b, _ in split],
                         max_new_tokens=[c for _, c in split])


def length_tables(levels: pd.DataFrame, families=family) -> tuple[pd.DataFrame, list[tuple[tuple, object]]]:
    """The brackets of every length ladder in `levels` and each ladder's `LengthLaw`: `(table, [(key, law)])`,
    the key being (family, loss, settings without the response cap); `families(pair)` names the models each
    pair trains. A rung is a (pair, `max_new_tokens`)."""
    if levels.empty or "response_tokens" not in levels:
        return pd.DataFrame(), []
    noise = _rungs(levels[levels["source"] == "noise"], families)
    tables, laws = [], []
    for key, group in noise.groupby(["family", "loss", "base_settings"], sort=True):
        if len(group[["pair", "max_new_tokens"]].drop_duplicates()) < 2:
            continue
        table = brackets(group, by=["pair", "max_new_tokens"], verdict="kl_verdict").sort_values("response_tokens")
        law = length_law(table)
        laws.append((key, law))
        tables.append(table.assign(family=key[0], loss=key[1], settings=key[2], b_low=law.b_low, b_high=law.b_high,
                                   b_mid=law.b_mid, law=law.describe()))
    return (pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()), laws


def write_length_report(levels: pd.DataFrame, out_dir: str | Path, families=family) -> list[Path]:
    """Write `length_law.csv` and `length_law.md` when `levels` hold a length ladder; else nothing."""
    table, laws = length_tables(levels, families)
    if table.empty:
        return []
    out_dir = Path(out_dir)
    csv, md = out_dir / "length_law.csv", out_dir / "length_law.md"
    table.to_csv(csv, index=False)
    lines = ["# Tolerated mismatch against response length", "",
             "Per length, the noise ladder's bracket on the tolerated per-token `mismatch_kl` (nats): `low`, the "
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
        rungs = _rungs(levels, families)
        others = rungs[rungs["pair"].isin(part["pair"]) & ~rungs["source"].isin(["noise", NOISE_FLOOR_SOURCE])
                       & (rungs["loss"] == loss) & (rungs["base_settings"] == settings)]
        if len(others):
            lines += ["Other levels at each length:", "", markdown_table(others[[
                "pair", "max_new_tokens", "source", "level", "response_tokens", "mismatch_kl", "kl_ratio",
                "kl_ratio_hw", "seeds", "kl_verdict", "verdict"]]), ""]
    md.write_text("\n".join(lines))
    return [csv, md]
