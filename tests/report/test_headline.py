"""The headline's study table: each row's settings against the ones its pair shares, said once."""

import pandas as pd

from mismatch.analysis.sequential import DEFAULT_DESIGN
from mismatch.report.headline import headline_markdown
from mismatch.verdict import DEFAULT_TOLERANCE


def _level(pair: str, settings: str, level: float) -> dict:
    return {"pair": pair, "source": "noise", "loss": "full-rkl", "settings": settings, "level": level,
            "verdict": "tolerated", "judged_on": "KL ratio", "acc_delta": float("nan"), "acc_delta_hw": float("nan"),
            "kl_ratio": 1.0, "kl_ratio_hw": 0.05, "seeds": 3, "response_tokens": 32.0}


def test_the_settings_most_levels_share_are_named_not_called_default():
    """Two of a pair's three levels ran at 32 tokens, one at 128: the 32-token rows say `common`, the other names
    its cap, and the footnote spells out what `common` is for each pair (the loss has its own column)."""
    rung = "loss full-rkl, steps 20, lr 0.0003, max_new_tokens {}"
    levels = pd.DataFrame([_level("p", rung.format(32), 0.1), _level("p", rung.format(32), 0.2),
                           _level("p", rung.format(128), 0.1), _level("q", "loss full-rkl, lr 0.001", 0.1)])
    text = headline_markdown(levels, pd.DataFrame({"complete": [True] * 8}), pd.DataFrame(), pd.DataFrame(),
                             tolerance=DEFAULT_TOLERANCE, design=DEFAULT_DESIGN)
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| p |") or line.startswith("| q |")]
    assert [(r[0], r[4]) for r in rows] == [("| p", "common"), ("| p", "max_new_tokens 128"), ("| q", "common")]
    assert "Shared by most of a pair's levels — p: steps 20, lr 0.0003, max_new_tokens 32; q: lr 0.001." in text
    assert "default" not in text


def test_the_realised_error_is_one_line_naming_its_range_and_its_largest_case_with_its_settings():
    """A pair run under two settings has two A/A cases per threshold: listed by pair alone they read as
    repeats; the line gives the range over every case and names the largest with its own settings."""
    rung = "loss full-rkl, steps 20, lr 0.0003, max_new_tokens {}"
    levels = pd.DataFrame([_level("p", rung.format(32), 0.1), _level("p", rung.format(32), 0.2),
                           _level("p", rung.format(128), 0.1)])
    alpha = pd.DataFrame({"pair": ["p"] * 4, "settings": [rung.format(32)] * 2 + [rung.format(128)] * 2,
                          "threshold": ["Δ accuracy", "KL ratio"] * 2, "realised_alpha": [0.036, 0.035, 0.034, 0.041]})
    text = headline_markdown(levels, pd.DataFrame({"complete": [True] * 6}), pd.DataFrame(), alpha,
                             tolerance=DEFAULT_TOLERANCE, design=DEFAULT_DESIGN)
    (line,) = [t for t in text.splitlines() if t.startswith("Realised error")]
    assert "(designed for at most 5% whatever the spread): 3.4–4.1% over its 4 cases" in line
    assert "the largest p (max_new_tokens 128) KL ratio; each in tolerance.md." in line
    # simulated also for a level more variable than its A/A level: the largest case says how much more
    text = headline_markdown(levels, pd.DataFrame({"complete": [True] * 6}), pd.DataFrame(),
                             alpha.assign(spread_ratio=[1.0, 1.0, 2.5, 2.5]), tolerance=DEFAULT_TOLERANCE,
                             design=DEFAULT_DESIGN)
    (line,) = [t for t in text.splitlines() if t.startswith("Realised error")]
    assert "and with a level more variable than its A/A level" in line and "× spread ratio)" in line
    assert "KL ratio, a level 2.5× as variable as its A/A level; each in tolerance.md." in line
