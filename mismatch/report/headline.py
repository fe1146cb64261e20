"""The study in a page: `headline.md`, which the study page includes and whose first sentence the README quotes.

Written by `write_tolerance_report` beside `tolerance.md`, from the same analysis: how many levels were judged and
decided (and on how many runs), the design and its simulated error, each pair's noise floor, and one row per
pair × source × settings naming what was tolerated, what was not (with the statistic that decided it) and
what is undecided at how many seeds. `tests/test_readme_numbers.py` checks that the README quotes its first
sentence and that every number the README's result and the study page quote is the reports', so they cannot drift.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import pandas as pd

from mismatch.analysis.tolerance import NOISE_FLOOR_SOURCE, SETTINGS_SEP, settings_parts, short_text
from mismatch.report.common import markdown_table
from mismatch.analysis.sequential import Design
from mismatch.verdict import Tolerance, Verdict, mean_interval_verdict

BEGIN, END = "<!-- reports/headline.md: begin -->", "<!-- reports/headline.md: end -->"


def _pts(mean: float, half: float) -> str:
    """Δ accuracy (a fraction) in points, `−2.0 ± 0.5`."""
    if mean != mean:
        return "—"
    points = round(100 * mean, 1) + 0.0  # + 0.0: no "−0.0"
    return f"{points:+.1f}".replace("-", "−") + ("" if half != half else f" ± {100 * half:.1f}")


def _ratio(mean: float, half: float) -> str:
    return "—" if mean != mean else f"{mean:.3f}" + ("" if half != half else f" ± {half:.3f}")


def _span(low: str, high: str) -> str:
    return low if low == high else f"{low} … {high}"


def _evidence(row, tolerance: Tolerance) -> str:
    """The statistics of a level, the deciding one first: `Δ −5.0 ± 1.1, KL 1.23 ± 0.05`, or the KL
    alone when the verdict rests on it."""
    kl = f"KL {_ratio(row.kl_ratio, row.kl_ratio_hw)}"
    if row.judged_on == "KL ratio" or row.acc_delta != row.acc_delta:
        return kl
    acc = f"Δ {_pts(row.acc_delta, row.acc_delta_hw)}"
    kl_fails = mean_interval_verdict(row.kl_ratio, row.kl_ratio_hw, 1 + tolerance.kl_tol, upper=True) is Verdict.FAIL
    acc_fails = mean_interval_verdict(row.acc_delta, row.acc_delta_hw, -tolerance.acc_tol, upper=False) is Verdict.FAIL
    return f"{kl}, {acc}" if kl_fails and not acc_fails else f"{acc}, {kl}"


COMMON = "common"  # a level's settings label where they are the ones most of its pair's levels share


def _shared_text(shared: dict[str, set[str]], levels: pd.DataFrame) -> str:
    """Per pair, its shared settings parts (less the loss), in the order its settings texts first write them."""
    out = []
    for pair, parts in shared.items():
        seen = dict.fromkeys(p for s in levels.loc[levels["pair"] == pair, "settings"] for p in settings_parts(s))
        out.append(f"{pair}: " + (", ".join(p for p in seen if p in parts and not p.startswith("loss ")) or "none"))
    return "; ".join(out)


def _shared_settings(levels: pd.DataFrame) -> dict[str, set[str]]:
    """Per pair, the settings parts most of its levels share."""
    out = {}
    for pair, group in levels.groupby("pair", sort=False):
        common = Counter(p for s in group["settings"] for p in set(settings_parts(s)))
        out[pair] = {p for p, n in common.items() if n > len(group) / 2}
    return out


def _own(settings: str, shared: set[str]) -> str:
    """`settings` less the `shared` parts and the loss (it has its own column); `common` when none is left."""
    return SETTINGS_SEP.join(p for p in settings_parts(settings) if p not in shared and not p.startswith("loss ")) or COMMON


def _level_name(source: str, level) -> str:
    return short_text(level) if source in ("format", "engine") else f"{source} {short_text(level)}"


def headline_markdown(levels: pd.DataFrame, runs: pd.DataFrame, floor: pd.DataFrame, alpha: pd.DataFrame, *,
                      tolerance: Tolerance, design: Design) -> str:
    """The text of `headline.md` (module docstring)."""
    judged = levels[levels["source"] != NOISE_FLOOR_SOURCE].copy()
    counts = judged["verdict"].value_counts()
    tolerated, refused = int(counts.get("tolerated", 0)), int(counts.get("not tolerated", 0))
    opd_runs = int(runs["complete"].sum())
    lines = [BEGIN, "",
             f"**{tolerated + refused} of the {len(judged)} levels are decided** ({tolerated} tolerated, {refused} not); "
             f"{len(judged) - tolerated - refused} are undecided at their last look; {opd_runs} finished OPD runs. "
             f"Design: {design.describe()}."]
    shared = _shared_settings(judged)
    if len(alpha):  # one line: the range and the largest case, with its settings; every case in tolerance.md
        worst = alpha.loc[alpha["realised_alpha"].idxmax()]
        spread = (f", a level {worst.spread_ratio:g}× as variable as its A/A level"
                  if worst.get("spread_ratio", 1.0) != 1.0 else "")
        cases = f"{100 * worst.realised_alpha:.1f}% ({worst.pair} {worst.threshold}{spread})"
        if len(alpha) > 1:
            cases = (f"{100 * alpha['realised_alpha'].min():.1f}–{100 * worst.realised_alpha:.1f}% over its "
                     f"{len(alpha)} cases (pair × settings × threshold with an A/A level"
                     f"{' × spread ratio' if 'spread_ratio' in alpha else ''}), the largest "
                     f"{worst.pair} ({_own(worst.settings, shared.get(worst.pair, set()))}) {worst.threshold}{spread}; "
                     "each in tolerance.md")
        lines += ["", f"Realised error at a threshold, simulated at each pair's A/A spreads"
                      f"{' and with a level more variable than its A/A level' if 'spread_ratio' in alpha else ''} "
                      f"(designed for at most {100 * design.alpha:g}% whatever the spread): {cases}."]
    floor_lines = []
    for r in floor.itertuples() if "aa_seeds" in floor else []:
        if r.aa_seeds != r.aa_seeds:  # no A/A level for these settings
            continue
        acc = "" if r.aa_acc_delta != r.aa_acc_delta else (
            f"Δ {_pts(r.aa_acc_delta / 100, r.aa_acc_delta_hw / 100)} points (twin Δ sd {r.aa_acc_delta_sd:.2f}; "
            f"clean finals sd {r.clean_accuracy_sd:.2f}), ")
        floor_lines.append(f"- {r.pair} ({_own(r.settings, shared.get(r.pair, set()))}): {acc}KL ratio "
                           f"{_ratio(r.aa_kl_ratio, r.aa_kl_ratio_hw)}, {int(r.aa_seeds)} seeds "
                           f"(clean held-out KL {r.clean_heldout_rkl:.3f} sd {r.clean_heldout_rkl_sd:.3f}).")
    if floor_lines:
        lines += ["", "The noise floor (A/A: clean against clean, only the rollout samples changed):", "", *floor_lines]
    judged["own"] = [_own(s, shared[p]) for p, s in zip(judged["pair"], judged["settings"])]
    rows = []
    for (pair, source, loss, own), group in judged.groupby(["pair", "source", "loss", "own"], sort=False):
        ok = group[group["verdict"] == "tolerated"]
        bad = group[group["verdict"] == "not tolerated"]
        open_ = group[group["verdict"] == "uncertain"]
        ok_text = ", ".join(_level_name(source, lv) for lv in ok["level"]) or "—"
        if len(ok) and ok["acc_delta"].notna().any() and (ok["judged_on"] != "KL ratio").all():
            ok_text += f" (Δ {_span(_pts(ok['acc_delta'].min(), math.nan), _pts(ok['acc_delta'].max(), math.nan))})"
        elif len(ok):
            ok_text += f" (KL {_span(f'{ok.kl_ratio.min():.3f}', f'{ok.kl_ratio.max():.3f}')})"
        rows.append({"pair": pair, "source": source, "loss": loss,
                     "length": "—" if group["response_tokens"].isna().all() else f"{group['response_tokens'].mean():.0f}",
                     "settings": own, "tolerated": ok_text,
                     "not tolerated": "; ".join(f"{_level_name(source, r.level)} ({_evidence(r, tolerance)})"
                                                for r in bad.itertuples()) or "—",
                     "undecided": "; ".join(f"{_level_name(source, r.level)} at {r.seeds} seed{'s' if r.seeds != 1 else ''} "
                                            f"({_evidence(r, tolerance)})"
                                            for r in open_.itertuples()) or "—"})
    lines += ["", markdown_table(pd.DataFrame(rows)), "",
              "Δ: final held-out accuracy against the clean twin (points; judged only where computed exactly), KL: the "
              "final held-out reverse-KL ratio to the clean twin; mean ± the design's interval at the look reached; "
              "length: mean response tokens; settings: those that differ from the ones most of the pair's levels "
              f"share (`{COMMON}`: none differs; `tolerance.md` lists them all). Shared by most of a pair's levels — "
              f"{_shared_text(shared, judged)}.", "", END]
    return "\n".join(lines) + "\n"


def write_headline(levels: pd.DataFrame, runs: pd.DataFrame, floor: pd.DataFrame, alpha: pd.DataFrame, out_dir: Path, *,
                   tolerance: Tolerance, design: Design) -> Path:
    """Write `headline.md` into `out_dir`; returns its path."""
    path = Path(out_dir) / "headline.md"
    path.write_text(headline_markdown(levels, runs, floor, alpha, tolerance=tolerance, design=design))
    return path
