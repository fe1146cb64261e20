"""The admission validation report, written from a hand-made study's results alone."""

import re

import pandas as pd

from mismatch.report import write_reports
from tests.admission.test_thresholds import study  # noqa: F401  (the fixture)


def test_the_report_writes_the_limits_the_levels_and_the_held_out_predictions(study, tmp_path):  # noqa: F811
    written = write_reports(study, tmp_path, sources=["hand-made"])
    assert tmp_path / "admission.md" in written
    text = (tmp_path / "admission.md").read_text()
    # the bracket's lower end is 0.15 × 1.05 = 0.1575 (a mean over seeds: either side of it in the last bit)
    assert "Fitted on hand-made" in text
    assert re.search(r"\| mismatch_kl \(default gate\) \| 0\.364 \| \[0\.15[78], 0\.84\] \| ×5\.3 \|", text)
    validation = pd.read_csv(tmp_path / "admission_validation.csv")
    primary = validation[validation["statistic"] == "mismatch_kl"]
    right = int((primary["admit_tolerated"] + primary["reject_not"]).sum())
    assert f"With mismatch_kl: {right} of {int(primary['levels'].sum())} held-out levels predicted right" in text
    points = pd.read_csv(tmp_path / "admission_points.csv")
    # nine levels: five tolerated, three lose ≥ 2 points, one undecided (listed, not fitted)
    assert len(points) == 9 and points["decided"].sum() == 8 and points["tolerated"].sum() == 5
    assert int(primary["levels"].sum()) == 8 and "| not fitted (undecided) |" in text
    # per source and per length: the same held-out predictions, tallied by group, add up to the totals
    for by in ("source", "length"):
        rows = re.findall(rf"^\| {by} \| [^|]+ \| (\d+) \| (\d+) \| (\d+) \| (\d+) \|$", text, flags=re.M)
        assert sum(int(r[0]) for r in rows) == 8 and sum(int(r[1]) for r in rows) == right
        assert all(int(r[2]) + int(r[3]) == int(r[0]) for r in rows)
    assert re.search(r"^\| source \| noise \| 2 \|", text, flags=re.M)  # sort-gpt2's and reverse-qwen3's


def test_the_drift_margin_section_counts_the_decided_levels_it_would_make_uncertain():
    from mismatch.admission.thresholds import Thresholds
    from mismatch.report.admission import admission_markdown

    def point(value, tolerated, decided=True):
        return {"pair": "p", "source": "format", "level": f"l{value}", "seeds": 3, "mismatch_kl": value,
                "acc_delta": 0.0, "acc_delta_hw": 0.01, "kl_ratio": 1.0, "kl_ratio_hw": 0.01,
                "verdict": "tolerated" if tolerated else "not tolerated", "decided": decided, "tolerated": tolerated}

    # limit 0.1, margin 0.5: (0.05, 0.1] holds 0.06 (tolerated), 0.09 (not) and 0.07 (undecided: not counted)
    points = [point(0.04, True), point(0.06, True), point(0.09, False), point(0.07, True, decided=False),
              point(0.2, False)]
    t = Thresholds(primary="mismatch_kl", limits={"mismatch_kl": 0.1}, brackets={"mismatch_kl": [0.06, 0.2]},
                   points=points, validation=[], lagged=[], provenance={"results": ["hand-made"]},
                   drift={"format": {"levels": 6, "median": 0.9, "largest": 1.8, "margin": 0.5}})
    text = admission_markdown(t)
    assert "| format | 6 | 0.9 | 1.8 | 0.5 | 0.05 | 1 | 1 |" in text
    assert "## Drift margin" not in admission_markdown(Thresholds(**{**t.__dict__, "drift": {}}))
    # the window limits, what decides with a teacher, are written beside the first-step ones when fitted
    assert "## Window limits" not in text
    windowed = admission_markdown(Thresholds(**{**t.__dict__, "window_limits": {"mismatch_kl": 0.0731},
                                                "window_brackets": {"mismatch_kl": [0.07, 0.0763]}}))
    assert "| mismatch_kl (deciding gate) | 0.0731 | [0.07, 0.0763] |" in windowed


def test_the_drift_margin_section_lowers_the_limit_each_loss_is_judged_by():
    """Per loss, the first-step limit the check uses — the loss's own where, leaving one pair out, it predicts the
    loss's levels at least as well as the pooled one, else the pooled one — times each source's margin."""
    from mismatch.admission.thresholds import Thresholds
    from mismatch.report.admission import admission_markdown

    def own(limit, right, pooled_right):
        return {"limit": limit, "bracket": [limit / 2, limit * 2], "levels": 8, "not_tolerated": 4,
                "response_tokens": [8.0, 32.0], "held_out_levels": 8, "held_out_right": right,
                "pooled_held_out_levels": 8, "pooled_held_out_right": pooled_right, "always_admit_right": 4}

    t = Thresholds(primary="mismatch_kl", limits={"mismatch_kl": 0.1}, brackets={"mismatch_kl": [0.06, 0.2]},
                   points=[], validation=[], lagged=[], provenance={"results": ["hand-made"]},
                   drift={"format": {"levels": 6, "median": 0.9, "largest": 1.8, "margin": 0.5},
                          "noise": {"levels": 5, "median": 1.0, "largest": 4.0, "margin": 0.25}},
                   loss_limits={"a": own(0.2, 7, 6), "b": own(0.3, 5, 6)})
    text = admission_markdown(t)
    # a keeps its own 0.2 (7 right against the pooled 6): 0.1 and 0.05; b predicts worse: the pooled 0.1 lowered
    assert "| a | 0.2 | its own levels | 0.1 | 0.05 |" in text
    assert "| b | 0.1 | every loss's levels | 0.05 | 0.025 |" in text
    assert "| loss |" not in admission_markdown(Thresholds(**{**t.__dict__, "loss_limits": {}}))


def test_leaving_one_pair_out_on_the_kl_ratio_alone_relabels_levels_an_accuracy_criterion_failed():
    from mismatch.admission.thresholds import Thresholds
    from mismatch.report.admission import admission_markdown

    def point(pair, value, verdict, kl_verdict):
        return {"pair": pair, "source": "noise", "level": f"{value}", "seeds": 3, "mismatch_kl": value,
                "acc_delta": 0.0, "acc_delta_hw": 0.01, "kl_ratio": 1.0, "kl_ratio_hw": 0.01, "verdict": verdict,
                "kl_verdict": kl_verdict, "decided": verdict != "uncertain", "tolerated": verdict == "tolerated",
                "response_tokens": 8.0}

    # pair a has an accuracy: 0.3 fails it (not tolerated) but keeps up on the KL ratio; 0.2's KL verdict is
    # undecided (left out here). Pair b has the KL ratio only.
    points = [point("a", 0.1, "tolerated", "tolerated"), point("a", 0.2, "not tolerated", "uncertain"),
              point("a", 0.3, "not tolerated", "tolerated"), point("a", 2.0, "not tolerated", "not tolerated"),
              point("b", 0.5, "tolerated", "tolerated"), point("b", 3.2, "not tolerated", "not tolerated")]
    t = Thresholds(primary="mismatch_kl", limits={"mismatch_kl": 0.15}, brackets={"mismatch_kl": [0.1, 0.2]},
                   points=points, validation=[], lagged=[], provenance={"results": ["hand-made"]})
    text = admission_markdown(t)
    # held out a: b's split at √(0.5·3.2) = 1.26 admits 0.1 and 0.3 (tolerated on KL) and rejects 2.0;
    # held out b: a's KL labels split at √(0.3·2.0) = 0.775, admitting 0.5 and rejecting 3.2
    assert "| a | 0.775 | 3 | 3 | 2 | 1 |" not in text and "| a | 1.26 | 3 | 3 | 2 | 1 |" in text
    assert "| b | 0.775 | 2 | 2 | 1 | 1 |" in text
    assert "On the KL ratio alone: 5 of 5 held-out levels predicted right; always admitting gets 3, always rejecting 2." in text
    assert "No better than always admitting" not in text.split("labelled by the KL ratio alone")[1]
    # b's tolerated level at 1.5: held out, a's split (0.775) rejects it; held out a, b's split (√(1.5·3.2) = 2.19)
    # admits a's 2.0: 3 of 5, as many as always admitting
    worse = [*points[:4], point("b", 1.5, "tolerated", "tolerated"), points[5]]
    text = admission_markdown(Thresholds(**{**t.__dict__, "points": worse}))
    assert ("On the KL ratio alone: 3 of 5 held-out levels predicted right; always admitting gets 3, always "
            "rejecting 2. No better than always admitting.") in text
    older = [{k: v for k, v in p.items() if k != "kl_verdict"} for p in points]  # a thresholds file before it
    assert "labelled by the KL ratio alone" not in admission_markdown(Thresholds(**{**t.__dict__, "points": older}))


def test_the_window_gate_leaving_one_pair_out_is_broken_down_by_pair_source_and_length():
    """Pair a: a tolerated lag at 0.05 and a failing format at 0.4 (8 tokens); pair b: a tolerated format at 0.15
    and a failing lag at 0.3 (40 tokens). Held out a: b's split √(0.15·0.3) = 0.212 admits 0.05, rejects 0.4 (2
    right); held out b: a's split √(0.05·0.4) = 0.141 rejects both 0.15 (wrong) and 0.3 (1 right)."""
    from mismatch.report.admission import _breakdown

    def point(pair, source, value, tolerated, tokens):
        return {"pair": pair, "source": source, "window:mismatch_kl": value, "tolerated": tolerated,
                "response_tokens": tokens}

    points = pd.DataFrame([point("a", "stale", 0.05, True, 8.0), point("a", "format", 0.4, False, 8.0),
                           point("b", "format", 0.15, True, 40.0), point("b", "stale", 0.3, False, 40.0),
                           point("b", "noise", float("nan"), True, 40.0)])  # no window value: not predicted
    lines = _breakdown(points, "window:mismatch_kl", ("pair", "source", "length"))
    assert lines[2:] == ["| pair | a | 2 | 2 | 1 | 1 |", "| pair | b | 2 | 1 | 1 | 1 |",
                         "| source | format | 2 | 1 | 1 | 1 |", "| source | stale | 2 | 2 | 1 | 1 |",
                         "| length | 0–16 | 2 | 2 | 1 | 1 |", "| length | 16–64 | 2 | 1 | 1 | 1 |"]
