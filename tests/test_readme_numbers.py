"""The README's study numbers are the reports': its "What OPD tolerated" section quotes the first sentence of
`reports/headline.md` (written by `mismatch report`), the study page includes all of it, and every decimal
number that section or the study page quotes occurs in a file of `reports/` — so a number cannot drift from
the results it came from; and every interval quoted ("1.051 ± 0.032") is one level's (its estimate and
half-width from the same row of the reports), with the verdict its sentence gives it that level's."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REPORTS = ROOT / "reports"
BEGIN, END = "<!-- reports/headline.md: begin -->", "<!-- reports/headline.md: end -->"
EXAMPLE = "A worked example on SmolLM2"  # docs/admission.md's section quoting the checks' own outputs
MONITORED = "Two real logs, judged"  # docs/trainers.md's section quoting `mismatch monitor`'s own summaries
NUMBER = re.compile(r"(?<![\w.])[−+-]?\d+\.\d+(?![\w.]*\d)")  # decimals: 0.233, −2.0, 1.041 (not 2026-12-01, not v1.2.3)


def _section(text: str, heading: str) -> str:
    start = text.index(f"## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else None]


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
    assert first in _section((ROOT / "README.md").read_text(encoding="utf-8"), "What OPD tolerated"), (
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
    text = _section(text, heading) if heading else text
    if BEGIN in text:
        text = text[:text.index(BEGIN)] + text[text.index(END) + len(END):]
    quoted = [n for n in NUMBER.findall(text)]
    assert quoted, "the premise: the section quotes numbers"
    known = (_report_numbers() | (_example_numbers() if heading == EXAMPLE else set())
             | (_monitor_numbers() if heading == MONITORED else set()))
    missing = sorted({n for n in quoted if _normal(n) not in known})
    assert not missing, f"{page} quotes numbers no report holds: {missing}"


# --- a quoted interval is one level's, and the verdict the sentence gives it is that level's --------------------

PLUS_MINUS = re.compile(r"(?<![\w.])([−+-]?\d+(?:\.\d+)?) ± (\d+(?:\.\d+)?)(?![\w.]*\d)")
VERDICT = re.compile(r"not[- ]tolerated|do(?:es)? not tolerate|tolerated|tolerates?|undecided")
SAID = {"not-tolerated": "not tolerated", "does not tolerate": "not tolerated", "do not tolerate": "not tolerated",
        "tolerates": "tolerated", "tolerate": "tolerated"}  # the verb's forms → the verdict
SENTENCE_END = re.compile(r"(?:\.\s+(?=[A-Z*`(])|;\s|\n\s*\n|\n- )")  # a new sentence, clause, paragraph or item
WORDS = {"uncertain": "undecided"}  # the reports' verdict column → the word the pages use
INTERVAL_PAGES = [("README.md", "What OPD tolerated"), ("docs/study.md", None), ("docs/admission.md", None)]


def _matches(quoted: str, value: float) -> bool:
    """`value` rounds to `quoted` at the quoted precision (0.0507 is 0.05068…, −41.0 is −40.99…)."""
    decimals = len(quoted.split(".")[1]) if "." in quoted else 0
    return abs(value - float(_normal(quoted))) <= 0.5 * 10 ** -decimals * (1 + 1e-9) + 1e-12


def _intervals() -> list[tuple[float, float, str]]:
    """(estimate, half-width, verdict) of every interval the reports hold: each level's KL ratio, its Δ accuracy in
    points and as a fraction, its learning-speed ratio; each A/A level's (verdict "A/A"); the held-out
    validation cases' (`experiments/validation/validation.json`, the study's verdict on them)."""
    import json

    import pandas as pd

    out: list[tuple[float, float, str]] = []
    levels = pd.read_csv(REPORTS / "tolerance_levels.csv")
    for row in levels.itertuples():
        verdict = "A/A" if row.source == "A/A" else WORDS.get(row.verdict, row.verdict)
        for value, hw in [(row.kl_ratio, row.kl_ratio_hw), (100 * row.acc_delta, 100 * row.acc_delta_hw),
                          (row.acc_delta, row.acc_delta_hw), (row.kl_auc_ratio, row.kl_auc_ratio_hw)]:
            if pd.notna(value) and pd.notna(hw):
                out.append((float(value), float(hw), verdict))
    floor = pd.read_csv(REPORTS / "noise_floor.csv")
    for row in floor.itertuples():
        for value, hw in [(row.aa_kl_ratio, row.aa_kl_ratio_hw), (row.aa_acc_delta, row.aa_acc_delta_hw)]:
            if pd.notna(value) and pd.notna(hw):
                out.append((float(value), float(hw), "A/A"))
    validation = json.loads((ROOT / "experiments" / "validation" / "validation.json").read_text(encoding="utf-8"))
    for case in validation["cases"]:
        verdict = WORDS.get(case["study"], case["study"])
        out += [(case["kl_ratio"], case["kl_ratio_hw"], verdict), (case["acc_delta"], case["acc_delta_hw"], verdict)]
    return out


def _verdict_before(text: str, at: int) -> str | None:
    """The verdict word nearest before position `at` within its sentence (None: the sentence gives none)."""
    start = max((m.end() for m in SENTENCE_END.finditer(text, 0, at)), default=0)
    words = VERDICT.findall(text[start:at])
    return SAID.get(words[-1], words[-1]) if words else None


@pytest.mark.parametrize("page,heading", INTERVAL_PAGES)
def test_every_interval_quoted_is_one_levels_with_its_verdict(page, heading):
    """Each "estimate ± half-width" the page quotes is one interval of the reports (both numbers of the same level,
    not each somewhere), and the verdict its sentence gives it last before the numbers ("tolerated", "not
    tolerated", "undecided") is that level's — so a claim written under an earlier design, or beside the wrong
    level, fails here. An A/A level's interval carries no verdict."""
    text = (ROOT / page).read_text(encoding="utf-8")
    text = _section(text, heading) if heading else text
    text = re.sub(r"\s*\n\s*", " ", text.replace("\n\n", "\x00")).replace("\x00", "\n\n")  # wrapped lines joined
    known = _intervals()
    quoted = list(PLUS_MINUS.finditer(text))
    assert quoted, "the premise: the page quotes intervals"
    wrong = []
    for m in quoted:
        rows = [verdict for value, hw, verdict in known if _matches(m[1], value) and _matches(m[2], hw)]
        said = _verdict_before(text, m.start())
        if not rows:
            wrong.append(f"{m[0]}: no interval of the reports")
        elif said is not None and "A/A" not in rows and said not in rows:
            wrong.append(f"{m[0]}: said {said!r}, the reports' level is {' / '.join(sorted(set(rows)))}")
    assert not wrong, f"{page}: " + "; ".join(wrong)
