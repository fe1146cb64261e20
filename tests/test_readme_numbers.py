"""The README's study numbers are the reports': its "What OPD tolerated" section quotes the first sentence of
`reports/headline.md` (written by `mismatch report`), the study page includes all of it, and every decimal
number that section or the study page quotes occurs in a file of `reports/` — so a number cannot drift from
the results it came from."""

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
