"""The length report: ladders that differ only in response length (the sortk rungs) are found, bracketed on
the KL ratio alone and given their exponent interval; the brackets agree with the level table read by hand.
Two pairs stand in for two rungs (the sortk build is not committed yet: experiments/length_ladder/)."""

import dataclasses
import math

import pandas as pd
import pytest

from mismatch.opd.config import OPDConfig
from mismatch.analysis.tolerance import analyse
from mismatch.report.length import family, write_length_report
from tests.conftest import opd_rows



def _run(config: OPDConfig, kl: float, mismatch: float, tokens: float) -> pd.DataFrame:
    return opd_rows(config, {"heldout_rkl": {0: 2.0, 2: kl}, "heldout_expected_accuracy": {0: 0.3, 2: 0.3},
                             "mismatch_kl": {1: mismatch, 2: mismatch / 2},  # it drifts down during training
                             "tokens": {1: tokens * config.batch_size, 2: tokens * config.batch_size}})


# per rung: its response length and, per noise σ, (mismatch_kl, KL ratio on three seeds)
RUNGS = {"sort-gpt2": (8.0, {0.1: (0.02, 1.0), 0.3: (0.2, 1.02), 0.5: (0.5, 1.5)}),
         "reverse-qwen3": (130.0, {0.1: (0.02, 1.01), 0.3: (0.2, 1.4), 0.5: (0.5, 2.0)})}


def _rung_rows() -> pd.DataFrame:
    """The RUNGS ladders, each pair at its own cap: a clean twin and the noise levels, three seeds."""
    frames = []
    for pair, (tokens, ladder) in RUNGS.items():
        base = OPDConfig(pair=pair, steps=2, batch_size=4)
        for seed in range(3):
            frames.append(_run(dataclasses.replace(base, seed=seed), 1.0, 0.0, tokens))
            for sigma, (mismatch, ratio) in ladder.items():
                frames.append(_run(dataclasses.replace(base, seed=seed, rollout=f"noise:{sigma}"),
                                   ratio * (1 + 0.001 * seed), mismatch, tokens))
    return pd.concat(frames, ignore_index=True)


LADDER = {"sort-gpt2": "ladder", "reverse-qwen3": "ladder"}.get  # stand-ins for two rungs of one build


def test_the_length_report_brackets_each_rung(tmp_path):
    levels = analyse(_rung_rows()).levels
    assert family("sort-gpt2") == "sort-gpt2"  # a pair of its own: no ladder with another
    assert write_length_report(levels, tmp_path / "none") == []
    written = write_length_report(levels, tmp_path, LADDER)
    assert [p.name for p in written] == ["length_law.csv", "length_law.md"]
    table = pd.read_csv(written[0]).set_index("pair")
    # the brackets are on the first step's mismatch_kl (the check's statistic), not its mean over the steps (¾ of it)
    assert table.loc["sort-gpt2", ["low", "high"]].tolist() == pytest.approx([0.2, 0.5])
    assert table.loc["reverse-qwen3", ["low", "high"]].tolist() == pytest.approx([0.02, 0.2])
    assert table.loc["reverse-qwen3", "response_tokens"] == pytest.approx(130.0)
    # the brackets [0.2, 0.5) at T = 8 and [0.02, 0.2) at T = 130 allow b in [log(0.02/0.5), log(0.2/0.2)] / log(130/8)
    span = math.log(130 / 8)
    assert table["b_low"].iloc[0] == pytest.approx(math.log(0.02 / 0.5) / span)
    assert table["b_high"].iloc[0] == pytest.approx(0.0, abs=1e-9)
    assert "per sequence (b = −1)" in written[1].read_text()
    assert write_length_report(levels[levels["pair"] == "sort-gpt2"], tmp_path / "one", LADDER) == []  # one length


def _capped_ladder() -> pd.DataFrame:
    """sort-gpt2's rows at two response caps: the RUNGS ladders, the first at max_new_tokens 8, the second at the
    pair's own cap."""
    frames = []
    for cap, (tokens, ladder) in {8: RUNGS["sort-gpt2"], None: RUNGS["reverse-qwen3"]}.items():
        base = OPDConfig(pair="sort-gpt2", steps=2, batch_size=4, max_new_tokens=cap)
        for seed in range(3):
            frames.append(_run(dataclasses.replace(base, seed=seed), 1.0, 0.0, tokens))
            for sigma, (mismatch, ratio) in ladder.items():
                frames.append(_run(dataclasses.replace(base, seed=seed, rollout=f"noise:{sigma}"),
                                   ratio * (1 + 0.001 * seed), mismatch, tokens))
    return pd.concat(frames, ignore_index=True)


def test_one_pair_at_two_response_caps_is_a_ladder(tmp_path):
    """A rung is a (pair, max_new_tokens): one pair run at two caps, other settings equal, is a ladder whose
    rungs are told apart by the cap; a run at the pair's own cap (`off`) is a rung of its own."""
    levels = analyse(_capped_ladder()).levels
    assert set(levels["settings"]) == {"max_new_tokens 8", "max_new_tokens off"}
    written = write_length_report(levels, tmp_path)
    table = pd.read_csv(written[0], dtype={"max_new_tokens": str}).set_index("max_new_tokens")
    assert table.loc["8", ["low", "high"]].tolist() == pytest.approx([0.2, 0.5])
    assert table.loc["off", ["low", "high"]].tolist() == pytest.approx([0.02, 0.2])
    assert set(table["settings"]) == {"default"} and set(table["pair"]) == {"sort-gpt2"}
    assert table["b_low"].iloc[0] == pytest.approx(math.log(0.02 / 0.5) / math.log(130 / 8))


def test_the_admission_thresholds_carry_the_law_and_fit_their_limits_off_the_rungs():
    """`make thresholds` on a dataset with a ladder: `length_law` holds the exponents the brackets allow (as the
    report gives them), and the limits and their fitted lengths come from the levels at their pair's own cap
    only — a rung at a cap of its own gives the law, not the limit."""
    from mismatch.admission.thresholds import thresholds_from_rows

    rows = _capped_ladder()
    table = thresholds_from_rows(rows, sources=["ladder"])
    assert table.length_law["b_low"] == pytest.approx(math.log(0.02 / 0.5) / math.log(130 / 8))
    assert table.length_law["b_high"] == pytest.approx(0.0, abs=1e-9)
    assert table.length_law["lengths"] == pytest.approx([8.0, 130.0]) and len(table.length_law["ladders"]) == 1
    assert table.response_tokens == pytest.approx([130.0, 130.0])  # the cap-8 rung is not in the fit
    assert {p["settings"] for p in table.points} == {"max_new_tokens off"}
    # the limit sits between the uncapped pair's largest tolerated (0.02) and smallest not tolerated (0.2)
    assert 0.02 <= table.limits["mismatch_kl"] <= 0.2


def test_a_law_resting_on_marginal_verdicts_says_what_it_is_without_them(tmp_path):
    """The report gives the law again with the marginal verdicts taken as undecided where that changes it: here
    sort-gpt2's noise 0.3 (tolerated, the low end of its bracket) marked marginal leaves 0.1 as the low end."""
    levels = analyse(_rung_rows()).levels
    plain = write_length_report(levels, tmp_path, LADDER)[1].read_text()
    assert "marginal verdicts taken as undecided" not in plain  # none is marginal: nothing to add
    marked = levels.assign(marginal=(levels["pair"] == "sort-gpt2") & (levels["level"] == 0.3))
    (tmp_path / "marked").mkdir()
    written = write_length_report(marked, tmp_path / "marked", LADDER)
    table = pd.read_csv(written[0])
    span = math.log(130 / 8)
    assert table["b_high"].iloc[0] == pytest.approx(0.0, abs=1e-9)  # the law itself: the verdicts as decided
    line = next(l for l in written[1].read_text().splitlines() if "marginal verdicts taken as undecided" in l)
    # sort-gpt2's bracket [0.02, 0.5) at T = 8 and [0.02, 0.2) at T = 130: b in [log(0.02/0.5), log(0.2/0.02)] / span
    assert f"[{math.log(0.02 / 0.5) / span:+.2f}, {math.log(0.2 / 0.02) / span:+.2f}]" in line
    assert "per token (b = 0)" in line.split("excluded")[0]  # allowed without the marginal verdict
