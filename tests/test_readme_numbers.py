"""The README's study numbers are the reports': its "What OPD tolerated" section quotes the first sentence of
`reports/headline.md` (written by `mismatch report`), the study page includes all of it, and every decimal
number that section or the study page quotes occurs in a file of `reports/` — so a number cannot drift from
the results it came from; and every interval quoted ("1.051 ± 0.032") is one level's (its estimate and
half-width from the same row of the reports), with the verdict its sentence gives it that level's; and every
verdict said of a level, with its seeds ("undecided at 16", "not tolerated (6 seeds)") or without ("int2 is not
tolerated on either pair"), is the level's in the scope its sentence gives it (pair or each pair of a group, loss,
length, TIS setting, the levels it is said of) — read from the prose by a parser, whose reach
`test_a_false_claim_made_from_a_true_one_fails` measures."""

import re
from pathlib import Path

import pytest

from tests.claims import (PLUS_MINUS, SENTENCE, WORDS, items, levels_judged, section, seed_claims, unsupported,
                          verdict_before, verdict_claims, verdict_word_before)

ROOT = Path(__file__).resolve().parents[1]
REPORTS = ROOT / "reports"
BEGIN, END = "<!-- reports/headline.md: begin -->", "<!-- reports/headline.md: end -->"
EXAMPLE = "A worked example on SmolLM2"  # docs/admission.md's section quoting the checks' own outputs
MONITORED = "Two real logs, judged"  # docs/trainers.md's section quoting `mismatch monitor`'s own summaries
NUMBER = re.compile(r"(?<![\w.])[−+-]?\d+\.\d+(?![\w.]*\d)")  # 0.233, −2.0, 1.041; not 2026-12-01, v1.2.3


def _normal(number: str) -> str:
    return number.replace("−", "-").lstrip("+")


def _report_numbers() -> set[str]:
    text = "\n".join(p.read_text(encoding="utf-8") for p in sorted(REPORTS.glob("*")) if p.suffix in (".md", ".csv"))
    found = {_normal(n) for n in NUMBER.findall(text)}
    # a CSV holds full precision: its rounded forms count too (0.23291 is quoted 0.233, 1.153 as 1.15)
    for raw in re.findall(r"(?<![\w.])-?\d+\.\d{3,}", text):
        value = float(raw)
        found |= {f"{value:.{d}f}" for d in range(1, 4)} | {f"{100 * value:.1f}"}
    return found


def _json_numbers(paths: list[Path]) -> set[str]:
    """Every number of the JSON files `paths`, in the forms a page rounds them to (3 and 4 significant digits,
    1–4 decimals)."""
    import json

    found: set[str] = set()

    def walk(value):
        if isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            found.update({f"{value:.3g}", f"{value:.4g}", *(f"{value:.{d}f}" for d in range(1, 5))})
        elif isinstance(value, str):
            found.update(_normal(n) for n in NUMBER.findall(value))

    for path in paths:
        walk(json.loads(path.read_text(encoding="utf-8")))
    return found


def _example_numbers() -> set[str]:
    """The worked example's check outputs (`experiments/admission_example/*.json`) and the held-out cases'
    comparison (`experiments/validation/validation.json`, written by its compare.py)."""
    return _json_numbers([*sorted((ROOT / "experiments" / "admission_example").glob("*.json")),
                          ROOT / "experiments" / "validation" / "validation.json"])


def _monitor_numbers() -> set[str]:
    """`mismatch monitor`'s summaries of the two logs docs/trainers.md shows (`monitor_figures.sh` writes them)."""
    return _json_numbers(sorted((ROOT / "experiments" / "trl_crosscheck").glob("monitor_*.json")))


def test_the_readme_quotes_the_headline_the_reports_wrote():
    """The README's result opens with the headline's first sentence as `mismatch report` wrote it (the count of
    decided levels: integers, which the decimal check below does not see); the study page shows all of it."""
    headline = (REPORTS / "headline.md").read_text(encoding="utf-8")
    assert headline.startswith(BEGIN) and headline.rstrip().endswith(END)
    first = headline[len(BEGIN):].strip().split(";")[0]  # **N of the M levels are decided** (T tolerated, R not)
    assert first.startswith("**") and " levels are decided** (" in first
    assert first in section((ROOT / "README.md").read_text(encoding="utf-8"), "What OPD tolerated"), (
        "README drifted from reports/headline.md: quote its first sentence")


def test_the_study_page_includes_the_headline_the_reports_wrote():
    """docs/study.md shows `reports/headline.md` through the snippets extension, not a copy."""
    assert '--8<-- "reports/headline.md"' in (ROOT / "docs" / "study.md").read_text(encoding="utf-8")
    assert "pymdownx.snippets" in (ROOT / "mkdocs.yml").read_text(encoding="utf-8")


@pytest.mark.parametrize("page,heading", [("README.md", "What OPD tolerated"), ("docs/study.md", None),
                                          ("docs/admission.md", "Where the limit comes from"),
                                          ("docs/admission.md", "One statistic across sources"),
                                          ("docs/admission.md", "Drift"),
                                          ("docs/admission.md", EXAMPLE), ("docs/trainers.md", MONITORED)])
def test_every_number_quoted_is_in_the_reports(page, heading):
    """... or, for the admission page's worked example, in the checks' own JSON output that the example's
    script wrote (`experiments/admission_example/`); for the trainers page's monitored logs, in the
    monitor's own summaries (`experiments/trl_crosscheck/monitor_*.json`)."""
    text = (ROOT / page).read_text(encoding="utf-8")
    text = section(text, heading) if heading else text
    if BEGIN in text:
        text = text[:text.index(BEGIN)] + text[text.index(END) + len(END):]
    quoted = [n for n in NUMBER.findall(text)]
    assert quoted, "the premise: the section quotes numbers"
    known = (_report_numbers() | (_example_numbers() if heading == EXAMPLE else set())
             | (_monitor_numbers() if heading == MONITORED else set()))
    missing = sorted({n for n in quoted if _normal(n) not in known})
    assert not missing, f"{page} quotes numbers no report holds: {missing}"


# --- a quoted interval is one level's, and the verdict the sentence gives it is that level's --------------------

INTERVAL_PAGES = [("README.md", "What OPD tolerated"), ("docs/study.md", None), ("docs/admission.md", None)]
CLAIM_PAGES = INTERVAL_PAGES


def _matches(quoted: str, value: float) -> bool:
    """`value` rounds to `quoted` at the quoted precision (0.0507 is 0.05068…, −41.0 is −40.99…)."""
    decimals = len(quoted.split(".")[1]) if "." in quoted else 0
    return abs(value - float(_normal(quoted))) <= 0.5 * 10 ** -decimals * (1 + 1e-9) + 1e-12


def _intervals() -> list[tuple[float, float, str, bool]]:
    """(estimate, half-width, verdict, marginal) of every interval the reports hold: each level's KL ratio, its Δ
    accuracy in points and as a fraction (the verdict's intervals: `marginal` as the report marks the level), its
    learning-speed ratio; each A/A level's (verdict "A/A"); the held-out validation cases'
    (`experiments/validation/validation.json`, the study's verdict on them)."""
    import json

    import pandas as pd

    out: list[tuple[float, float, str, bool]] = []
    levels = pd.read_csv(REPORTS / "tolerance_levels.csv")
    for row in levels.itertuples():
        verdict = "A/A" if row.source == "A/A" else WORDS.get(row.verdict, row.verdict)
        marginal = bool(row.marginal) and verdict in ("tolerated", "not tolerated")
        for value, hw, judged in [(row.kl_ratio, row.kl_ratio_hw, True), (row.acc_delta, row.acc_delta_hw, True),
                                  (100 * row.acc_delta, 100 * row.acc_delta_hw, True),
                                  (row.kl_auc_ratio, row.kl_auc_ratio_hw, False)]:
            if pd.notna(value) and pd.notna(hw):
                out.append((float(value), float(hw), verdict, marginal and judged))
    floor = pd.read_csv(REPORTS / "noise_floor.csv")
    for row in floor.itertuples():
        for value, hw in [(row.aa_kl_ratio, row.aa_kl_ratio_hw), (row.aa_acc_delta, row.aa_acc_delta_hw)]:
            if pd.notna(value) and pd.notna(hw):
                out.append((float(value), float(hw), "A/A", False))
    validation = json.loads((ROOT / "experiments" / "validation" / "validation.json").read_text(encoding="utf-8"))
    for case in validation["cases"]:
        verdict = WORDS.get(case["study"], case["study"])
        out += [(case["kl_ratio"], case["kl_ratio_hw"], verdict, False),
                (case["acc_delta"], case["acc_delta_hw"], verdict, False)]
    return out


def _intervals_wrong(text: str, known: list) -> list[str]:
    """What is wrong with the intervals `text` (items joined, `items`) quotes: see the test below."""
    wrong = []
    for m in PLUS_MINUS.finditer(text):
        found = [(verdict, marginal) for value, hw, verdict, marginal in known
                 if _matches(m[1], value) and _matches(m[2], hw)]
        rows = [verdict for verdict, _ in found]
        said = verdict_before(text, m.start())
        s0 = max((e.end() for e in SENTENCE.finditer(text, 0, m.start())), default=0)
        s1 = next((e.start() for e in SENTENCE.finditer(text, m.end())), len(text))
        if not rows:
            wrong.append(f"{m[0]}: no interval of the reports")
        elif said is not None and "A/A" not in rows and said not in rows:
            wrong.append(f"{m[0]}: said {said!r}, the reports' level is {' / '.join(sorted(set(rows)))}")
        elif all(marginal for _, marginal in found) and "marginal" not in text[s0:s1]:
            wrong.append(f"{m[0]}: a marginal verdict, not said to be")
    return wrong


def _page_items(page: str, heading: str | None) -> str:
    text = (ROOT / page).read_text(encoding="utf-8")
    text = section(text, heading) if heading else text
    return "\n\n".join(items(text))  # wrapped lines joined, paragraphs and items kept apart


@pytest.mark.parametrize("page,heading", INTERVAL_PAGES)
def test_every_interval_quoted_is_one_levels_with_its_verdict(page, heading):
    """Each "estimate ± half-width" the page quotes is one interval of the reports (both numbers of the same level,
    not each somewhere), and the verdict its clause gives it last before the numbers ("tolerated", "not
    tolerated", "undecided") is that level's — so a claim written under an earlier design, or beside the wrong
    level, fails here. An A/A level's interval carries no verdict. A level the reports mark `marginal` (its interval
    clears a threshold by less than the evaluation's Monte-Carlo error) is said to be so in the same sentence."""
    text = _page_items(page, heading)
    assert PLUS_MINUS.search(text), "the premise: the page quotes intervals"
    wrong = _intervals_wrong(text, _intervals())
    assert not wrong, f"{page}: " + "; ".join(wrong)


FLIPPED = {"not tolerated": "tolerated", "not-tolerated": "tolerated", "tolerated": "not tolerated",
           "undecided": "tolerated", "tolerates": "does not tolerate", "tolerate": "do not tolerate",
           "does not tolerate": "tolerates", "do not tolerate": "tolerate", "is not": "is tolerated",
           "are not": "are tolerated"}  # every verdict form the readers take, in lower case


def _flipped(word: str) -> str:
    """`word`'s verdict flipped (FLIPPED), its capital kept ("Not tolerated", a heading's, → "Tolerated")."""
    flip = FLIPPED[word.lower()]
    return flip[0].upper() + flip[1:] if word[0].isupper() else flip


def test_a_headings_verdict_flipped_fails():
    """A verdict said as a heading's ("**Not tolerated:** …", no page says one yet) is read, and flipped it fails."""
    known = _intervals()
    for said in ("not tolerated", "tolerated"):
        value, hw = next((v, hw) for v, hw, verdict, marginal in known if verdict == said and not marginal)
        text = f"**{said.capitalize()}:** a level (KL ratio {value:.3f} ± {hw:.3f} at 6 seeds)."
        assert not _intervals_wrong(text, known), text
        flipped = "**" + _flipped(said.capitalize()) + text[2 + len(said):]
        assert _intervals_wrong(flipped, known), flipped


@pytest.mark.parametrize("page,heading", INTERVAL_PAGES)
def test_every_verdict_said_before_an_interval_flipped_fails(page, heading):
    """The check above reads the verdict each interval is said under: flipping that word (tolerated ↔ not
    tolerated, undecided → tolerated), one interval at a time, fails the page every time."""
    text = _page_items(page, heading)
    known = _intervals()
    assert not _intervals_wrong(text, known), "the premise: the page passes as it is"
    said = [w for w in (verdict_word_before(text, m.start()) for m in PLUS_MINUS.finditer(text))
            if w is not None and w[0].lower() in FLIPPED]
    assert len(said) >= 5, "the premise: the page says verdicts before its intervals"
    passed = [w for w in said if not _intervals_wrong(text[:w.start()] + _flipped(w[0]) + text[w.end():], known)]
    assert not passed, f"{page}: flipped and still passing: " + "; ".join(text[w.start():w.end() + 60] for w in passed)


@pytest.mark.parametrize("reader,least", [(seed_claims, 10), (verdict_claims, 3)], ids=["seeds", "no-seeds"])
@pytest.mark.parametrize("page,heading", CLAIM_PAGES)
def test_every_verdict_said_of_a_level_is_its(page, heading, reader, least):
    """"int3 is not tolerated on reverse-qwen3 (6 seeds)", "undecided at 16": the levels in the claim's scope it is
    said of (some level there, where it names none) have that verdict at that many seeds — so a claim left from an
    earlier look fails here; "int2 is not tolerated on either pair", "reverse-qwen3 does not tolerate
    int4:group32": said of a named level without a seed count, the level has it at whatever seeds it reached."""
    text = (ROOT / page).read_text(encoding="utf-8")
    claims = reader(section(text, heading) if heading else text)
    assert len(claims) >= least, "the premise: the page says verdicts of levels"
    wrong = unsupported(claims, levels_judged())
    assert not wrong, f"{page}: " + "; ".join(wrong)


def _claims_unsupported(page: str, text: str) -> list[str]:
    heading = dict(CLAIM_PAGES)[page]
    said = section(text, heading) if heading else text
    seeded = seed_claims(said)
    return unsupported(seeded + verdict_claims(said, seeded), levels_judged())


@pytest.mark.parametrize("page,right,wrong", [
    # a seed count moved to another look, pair, rung or level (session 24's hand check found the first: pg-rkl-is's
    # noise 0.06 at 32 tokens is undecided at 6, tolerated at 3 seeds only at 128 tokens)
    ("README.md", "noise 0.06, 0.1, 0.15 and 0.6 and the lags are undecided at 6", "noise 0.06 is tolerated (3 seeds)"),
    ("README.md", "nor int3 on reverse-qwen3 (6 seeds", "nor int3 on reverse-qwen3 (10 seeds"),
    ("README.md", "is tolerated on smollm2-pruned at 6", "is tolerated on smollm2-concise at 6"),
    ("README.md", "At 128 tokens noise 0.1 and 0.15 are tolerated", "At 8 tokens noise 0.1 and 0.15 are tolerated"),
    ("README.md", "int4:channel (16 seeds) and int4:group128 on every linear (the head too, 10 seeds)",
     "int4:channel (10 seeds) and int4:group128 on every linear (the head too, 16 seeds)"),  # two counts swapped
    ("README.md", "noise 0.06, 0.1, 0.15 and 0.6 and the lags", "noise 0.25, 0.1, 0.15 and 0.6 and the lags"),  # one of a list
    ("README.md", "is tolerated on smollm2-pruned at 6 seeds (KL", "is tolerated on smollm2-pruned at 10 seeds (KL"),
    ("README.md", "the study tolerated both (6 seeds each)", "the study tolerated both (10 seeds each)"),  # held-out
    ("docs/admission.md", "stale:4 and reuse:2 at 3 seeds, tolerated", "stale:4 and reuse:2 at 6 seeds, tolerated"),
    # a level said without seeds swapped for one with another verdict there
    ("README.md", "a lag of 4 is not, and int3 is not", "a lag of 4 is not, and int8 is not"),
    ("README.md", "int2 is not tolerated on either pair", "reuse:4 is not tolerated on either pair"),  # each pair
    ("README.md", "nor, with TIS, noise from 0.3, int4:group128", "nor, with TIS, noise from 0.3, int8"),
    ("README.md", "nor, with TIS, noise from 0.3,", "nor, with TIS, noise from 0.2,"),  # with TIS, not without
    ("README.md", "fp8 and int8 are tolerated with and without TIS", "fp8 and noise 0.1 are tolerated with and "
     "without TIS"),  # each pair, each TIS setting
    ("README.md", "reuse:4 and reuse:8 (a batch", "reuse:2 and reuse:8 (a batch"),
    ("README.md", "bnb-nf4 is tolerated on reverse-qwen3", "int4:group32 is tolerated on reverse-qwen3"),
    ("README.md", "Weight noise 0.1 is tolerated on both pairs", "Weight noise 0.2 is tolerated on both pairs"),
    ("docs/admission.md", "and undecided on smollm2-concise at 3 seeds (0.933",  # a second verdict of one subject
     "and tolerated on smollm2-concise at 3 seeds (0.933"),
    ("docs/admission.md", "the block-5 copy **tolerated** too", "the block-5 copy **not tolerated** too"),
    ("README.md", "at 32 tokens every level up to noise 0.6 (7.896) is tolerated",  # a hypothetical later in its
     "at 8 tokens every level up to noise 0.6 (7.896) is tolerated"),  # clause ("taken as undecided") is not its
    ("docs/study.md", "**The fp8 formats and int8 are tolerated on both synthetic pairs",
     "**The fp8 formats and noise 0.6 are tolerated on both synthetic pairs"),
    ("docs/study.md", "On real weights int4 is tolerated under full-rkl on smollm2-pruned.",
     "On real weights int4 is tolerated under full-rkl on smollm2-concise."),  # a pair said after the verdict
    ("docs/admission.md", "(not tolerated, with and without TIS)", "(tolerated, with and without TIS)"),
    ("docs/admission.md", "the FP8 formats on both synthetic pairs: tolerated",
     "the FP8 formats on both synthetic pairs: not tolerated"),
    # the learning rate and momentum a verdict is said at: a lag of 1 is not tolerated at lr 3e-3, at lr 3e-4 it is
    ("README.md", "a lag of 1 is tolerated at lr 3e-4", "a lag of 1 is not tolerated at lr 3e-4"),
    ("docs/study.md", "at lr 3e-3 lags of 1, 2 and 4 are not", "at lr 1e-3 lags of 1, 2 and 4 are not"),
])
def test_a_false_claim_made_from_a_true_one_fails(page, right, wrong):
    """The checks above fail the page with one true claim made false — its seeds, pair, rung, level, TIS setting,
    learning rate or verdict changed (so the premise: the page passes as it is). Of 34 such edits tried on
    2026-12-06, 33 fail it (29 before the pages said their elided verdicts in full; the one that passes drops a
    TIS setting said only in an aside, read since 2026-12-07); of 30 more, written by a reviewer who had not read
    the reader, 27 failed it, 29 after the fixes they prompted (the one left edits a hedged clause, "… are not
    where decided"); of 30 more by a third reviewer (2026-12-07), 29 failed it, all 30 once a verdict's learning
    rate and β1 were read as part of its scope."""
    text = (ROOT / page).read_text(encoding="utf-8")
    pattern = r"\s+".join(re.escape(word) for word in right.split(" "))  # the page's text, wrapped anywhere
    assert re.search(pattern, text), "the premise: the page says it"
    assert not _claims_unsupported(page, text)
    assert _claims_unsupported(page, re.sub(pattern, wrong, text, count=1))


def test_a_verdict_told_as_history_or_as_a_bound_is_not_a_claim():
    """"was tolerated at 3 seeds on 2026-12-05", "up to 16 seeds", "27 runs at 3 seeds": no claim; a contrast
    ("where under full-rkl …") lends its loss only to its own clause."""
    assert not seed_claims("smollm2-concise's reuse:2, tolerated at 3 seeds on 2026-12-05, is undecided now.")
    assert not seed_claims("The one lost is int4:group32, tolerated at 3 seeds before.")
    assert not seed_claims("The study tolerated everything it ran (its own looks up to 16 seeds).")
    [claim] = seed_claims("Under pg-rkl-is: on smollm2-pruned at 32 tokens noise 0.25 is not tolerated, where under "
                           "full-rkl the same rung tolerates it; noise 0.06 is undecided at 6.")
    assert (claim["pair"], claim["loss"], claim["length"], claim["each"], claim["verdict"], claim["seeds"]) == (
        "smollm2-pruned", "pg-rkl-is", "32", {"noise:0.06"}, "undecided", 6)
    first, second = seed_claims("On smollm2-pruned int4:group128 and noise 0.25 and 0.4 are not tolerated (KL ratio "
                                 "1.200 ± 0.0807 and 1.238 ± 0.132 at 6 seeds, the second marginally, and 1.199 ± "
                                 "0.0773 at 3).")  # a list of levels with their intervals in order
    assert (first["each"], first["seeds"]) == ({"int4:group128", "noise:0.25"}, 6)
    assert (second["each"], second["seeds"]) == ({"noise:0.4"}, 3)
    [claim] = seed_claims("On sort-gpt2 int4:channel (16 seeds) and int4:group128 are tolerated.")
    assert claim["each"] == {"int4:channel"}
    [claim] = seed_claims("On sort-gpt2 int2 and int3 are tolerated (16 seeds; 1.01 ± 0.02 and 1.02 ± 0.03).")
    assert claim["each"] == {"int2", "int3"}  # a count before the intervals: all of the list
    first, second = seed_claims("On sort-gpt2 int4:channel and int4:group128 are tolerated (KL ratio 1.01 ± 0.02 at "
                                 "16 seeds (pooled), and 1.02 ± 0.03 at 10).")  # a parenthesis inside
    assert (first["each"], second["each"]) == ({"int4:channel"}, {"int4:group128"})
    [claim] = seed_claims("Under pg-rkl-is a lag of 4 is not, and int3 is not (but on sort-gpt2 undecided at 10).")
    assert (claim["each"], claim["verdict"]) == ({"int3"}, "undecided")
    [claim] = seed_claims("sort-gpt2 tolerates noise 0.1 and 0.2 (mismatch_kl 0.0892 nats per token; 16 seeds).")
    assert (claim["each"], claim["verdict"]) == ({"noise:0.1", "noise:0.2"}, "tolerated")
    [claim] = seed_claims("TIS does not rescue it: at 6 seeds under pg-rkl-is noise 0.4 is not tolerated.")
    assert (claim["each"], claim["verdict"]) == ({"noise:0.4"}, "not tolerated")
    [claim] = seed_claims("Every level is tolerated: noise 0.06 to 0.6 (at the first step; 3–10 seeds, four of them "
                           "marginal), stale:4 and reuse:2 (3 seeds).")  # an aside before closes the list
    assert claim["each"] == {"stale:4", "reuse:2"}
    [claim] = seed_claims("On sort-gpt2 under pg-rkl-is int4:group128 is not tolerated, where full-rkl tolerates "
                           "int8 (16 seeds).")
    assert (claim["loss"], claim["each"], claim["verdict"]) == ("full-rkl", {"int8"}, "tolerated")


def test_a_tis_setting_said_in_the_aside_after_a_verdict_is_read():
    """"… is tolerated (with TIS)": the aside right after a verdict (or its seed count) gives its TIS setting. Built
    from every level the reports judge differently with TIS and without (each pg-rkl-is level of a pair, length):
    said with its TIS verdict and "(with TIS)" it holds; with "(without TIS)" it fails — which it did not before the
    aside was read (the claim then held for either setting)."""
    levels = levels_judged()
    pg = levels[levels.loss == "pg-rkl-is"]
    both = pg[pg.tis == "2"].merge(pg[pg.tis == "off"], on=["pair", "name", "tokens"], suffixes=("", "_off"))
    differ = both[(both.said != both.said_off) & ~both.name.str.startswith("A/A")]
    assert len(differ) >= 3, "the premise: levels whose verdict TIS changes"
    for row in differ.itertuples():
        level = row.name.replace("noise:", "noise ")
        rung = f" at {row.tokens} tokens" if row.tokens != "off" else ""
        for said in (f"is {row.said} (with TIS", f"is {row.said} at {row.seeds} seeds (with TIS"):
            text = f"On {row.pair}{rung} under pg-rkl-is {level} {said} at cap 2)."
            assert not unsupported(seed_claims(text) + verdict_claims(text), levels), text
            wrong = text.replace("(with TIS at cap 2", "(without TIS")
            assert unsupported(seed_claims(wrong) + verdict_claims(wrong), levels), wrong


@pytest.mark.parametrize("page", ["README.md", "docs/study.md", "docs/admission.md"])
def test_the_count_of_decided_levels_quoted_is_the_headlines(page):
    """"97 of the 168 levels are decided", "71 of the 168 levels are undecided": an integer count of the study's
    levels (the headline's total) is the headline's count (`reports/headline.md`), not an earlier look's."""
    headline = (REPORTS / "headline.md").read_text(encoding="utf-8")
    decided, total = map(int, re.search(r"\*\*(\d+) of the (\d+) levels are decided\*\*", headline).groups())
    counts = {"decided": decided, "undecided": total - decided}
    text = re.sub(r"\s+", " ", (ROOT / page).read_text(encoding="utf-8"))
    quoted = [(int(n), word) for n, m, word in re.findall(r"(\d+) of the (\d+) levels are (decided|undecided)", text)
              if int(m) == total]
    assert quoted or page != "README.md", "the premise: the README quotes the count"
    wrong = [f"{n} {word} (the headline: {counts[word]})" for n, word in quoted if n != counts[word]]
    assert not wrong, f"{page}: " + "; ".join(wrong)
