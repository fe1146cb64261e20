"""docs/admission.md's counts and tables are the reports': the page is written by hand around
`reports/admission.md` and `reports/admission_transfer.md` (both written by `mismatch report`), and its integers
— how many levels were fitted and decided, how many each limit gets right, the transfer table — are what a
decimal-number check (tests/test_readme_numbers.py) does not see. Each is read here from the page by the sentence
or table that says it and compared with the report's own table, so a rebuilt report the page was not updated to
fails, naming what moved."""

import re
from pathlib import Path

import pytest

from tests.claims import section

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "admission.md"
ADMISSION = ROOT / "reports" / "admission.md"
TRANSFER = ROOT / "reports" / "admission_transfer.md"


def _table(text: str, first_header: str) -> list[dict[str, str]]:
    """The markdown table of `text` whose header starts with `first_header`, as rows of {header: cell}."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(f"| {first_header} |"):
            header = [c.strip() for c in line.strip("|").split("|")]
            rows = []
            for row in lines[i + 2:]:
                if not row.startswith("|"):
                    break
                rows.append(dict(zip(header, (c.strip() for c in row.strip("|").split("|")))))
            return rows
    raise AssertionError(f"no table starting '| {first_header} |'")


def _said(text: str, pattern: str) -> re.Match:
    """The one place `text` says `pattern` (whitespace-insensitive: the page wraps its lines)."""
    flat = re.sub(r"\s+", " ", text)
    found = list(re.finditer(pattern, flat))
    assert len(found) == 1, f"docs/admission.md: expected one sentence matching {pattern!r}, found {len(found)}"
    return found[0]


def _ints(match: re.Match) -> list[int]:
    return [int(g) for g in match.groups()]


@pytest.fixture(scope="module")
def page() -> str:
    return PAGE.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def admission() -> str:
    return ADMISSION.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def transfer() -> str:
    return TRANSFER.read_text(encoding="utf-8")


def _lopo(admission: str) -> dict[str, dict[str, str]]:
    """The first-step gate's leave-one-pair-out rows, by held-out pair."""
    rows = _table(section(admission, "Leave one pair out"), "statistic")
    return {r["held-out pair"]: r for r in rows if r["statistic"] == "mismatch_kl"}


def test_the_fit_counts_are_the_reports(page, admission):
    """'84 levels, 54 decided (30 tolerated, 24 not)' against the report's 'N levels, M decided (K not tolerated'."""
    levels, decided, not_tolerated = _ints(_said(admission, r"(\d+) levels, (\d+) decided \((\d+) not tolerated"))
    said = _ints(_said(page, r"(\d+) levels, (\d+) decided \((\d+) tolerated, (\d+) not\)"))
    assert said == [levels, decided, decided - not_tolerated, not_tolerated]


def test_the_leave_one_pair_out_table_is_the_reports(page, admission):
    """Per held-out pair: the limit without it, its decided levels, how many the limit gets right and how many
    always admitting does (the report gives those two as fractions of the levels)."""
    report = _lopo(admission)
    rows = _table(page, "held-out pair (limit fitted on the others)")
    assert len(rows) == len(report), "the page's table lists another set of pairs than the report's"
    for row in rows:
        pair, limit = re.fullmatch(r"(\S+) \((\S+)\)", row["held-out pair (limit fitted on the others)"]).groups()
        want = report[pair]
        levels = int(want["levels"])
        assert limit == want["limit without it"], pair
        assert int(row["decided levels"]) == levels, pair
        assert int(row["right"]) == round(float(want["accuracy"]) * levels), pair
        assert int(row['"always admit" right']) == round(float(want["always admit"]) * levels), pair


def test_the_leave_one_pair_out_totals_are_the_reports(page, admission):
    """'gets 49 of the 54 held-out levels right, against 30 for always admitting (formats 28 of 32, noise 21 of
    22)' and the per-length split, against the report's sentence and its per-source and per-length table."""
    right, levels, admit = _ints(_said(admission, r"With mismatch_kl: (\d+) of (\d+) held-out levels predicted "
                                                  r"right; always admitting gets (\d+) of"))
    said = _ints(_said(page, r"gets (\d+) of the (\d+) held-out levels right, against (\d+) for always admitting "
                             r"\(formats (\d+) of (\d+), noise (\d+) of (\d+)\)"))
    groups = {r["group"]: r for r in _table(section(admission, "mismatch_kl leaving one pair out, per source and "
                                                                 "per response length"), "by")}
    assert said == [right, levels, admit,
                    int(groups["format"]["right"]), int(groups["format"]["levels"]),
                    int(groups["noise"]["right"]), int(groups["noise"]["levels"])]
    short, long_ = groups["0–16"], groups["16–64"]
    said = _ints(_said(page, r"(\d+) of (\d+) right at 0–16 tokens \(the synthetic pairs\), (\d+) of (\d+) at "
                             r"16–64 \(the real pairs, where always admitting gets (\d+)"))
    assert said == [int(short["right"]), int(short["levels"]), int(long_["right"]), int(long_["levels"]),
                    int(long_["always admit"])]


def _per_loss(admission: str, heading: str) -> tuple[dict[str, str], dict[str, str]]:
    """full-rkl's and pg-rkl-is's rows of a limit-per-loss table of the report."""
    table = {r["loss"]: r for r in _table(section(admission, f"{heading} (`mismatch check --loss`)"), "loss")}
    return table["full-rkl"], table["pg-rkl-is"]


def _of(cell: str) -> list[int]:
    """'27 of 28' → [27, 28]."""
    return [int(x) for x in re.fullmatch(r"(\d+) of (\d+)", cell).groups()]


def test_the_first_step_limits_per_loss_are_the_reports(page, admission):
    """Each loss's decided levels, limit, interval, held-out record, the pooled limit's and always admitting's."""
    full, pg = _per_loss(admission, "`mismatch_kl`, first step: limit per loss")
    said = _said(page, r"full-rkl's (\d+) decided levels put it at (\S+), pinned to (\[\S+, \S+\]) — .*? and "
                       r"pg-rkl-is's (\d+) at (\S+), pinned to (\[\S+, \S+\])\.")
    assert said.groups() == (full["levels"], full["limit"], full["pinned to"],
                             pg["levels"], pg["limit"], pg["pinned to"])
    said = _ints(_said(page, r"full-rkl's limit gets (\d+) of its (\d+) levels right \(the pooled limit (\d+), "
                             r"always admitting (\d+)\) and pg-rkl-is's (\d+) of (\d+) \(pooled (\d+), always "
                             r"admitting (\d+)\)"))
    assert said == [*_of(full["held out: right"]), _of(full["pooled, held out: right"])[0], int(full["always admit"]),
                    *_of(pg["held out: right"]), _of(pg["pooled, held out: right"])[0], int(pg["always admit"])]


def test_the_window_limits_per_loss_are_the_reports(page, admission):
    """Each loss's window limit, interval and decided levels, its held-out record and the pooled window limit's."""
    full, pg = _per_loss(admission, "`window:mismatch_kl`: limit per loss")
    said = _said(page, r"full-rkl (\S+) \(pinned to (\[\S+, \S+\]), (\d+) levels\) and pg-rkl-is (\S+) "
                       r"\((\[\S+, \S+\]), (\d+)\)")
    assert said.groups() == (full["limit"], full["pinned to"], full["levels"],
                             pg["limit"], pg["pinned to"], pg["levels"])
    said = _ints(_said(page, r"pg-rkl-is's own window limit gets (\d+) of its (\d+) levels right against the "
                             r"pooled window limit's (\d+), but full-rkl's own gets (\d+) of (\d+) against the "
                             r"pooled one's (\d+)"))
    assert said == [*_of(pg["held out: right"]), _of(pg["pooled, held out: right"])[0],
                    *_of(full["held out: right"]), _of(full["pooled, held out: right"])[0]]


def _transfer_rows(transfer: str) -> dict[str, dict[str, str]]:
    return {r["statistic"].strip("`"): r for r in _table(transfer, "statistic")}


def _right(cell: str) -> str:
    """'19/26 at ≤ 0.106 (5 / 21)' → '19/26'."""
    return cell.split()[0]


def _always_admit(cell: str) -> str:
    """'19/26 at ≤ 0.106 (5 / 21)' → '5/26': always admitting's count on the same levels."""
    levels = cell.split()[0].split("/")[1]
    admitted = re.search(r"\((\d+) / \d+\)", cell).group(1)
    return f"{admitted}/{levels}"


def test_the_transfer_table_is_the_reports(page, transfer):
    """Every row of the page's "One statistic across sources" table is the report's row of that statistic (its
    levels right / levels per column); "always admit" is the report's always-admitting count on those levels;
    the in-sample limit where the page gives one."""
    report = _transfer_rows(transfer)
    rows = _table(section(page, "One statistic across sources"), "statistic")
    assert len(rows) >= 3
    columns = ["static → lagged", "lagged → static", "leave one pair out", "in sample"]
    for row in rows:
        name = row["statistic"].split("`")[1] if "`" in row["statistic"] else row["statistic"]
        if name == "always admit":
            want = report["first:mismatch_kl"]  # every statistic is judged on the same decided levels
            for column in columns:
                assert row[column] == _always_admit(want[column]), (name, column)
            continue
        want = report[name]
        for column in columns:
            quoted = row[column]
            assert quoted.split()[0] == _right(want[column]), (name, column, quoted, want[column])
            if " at ≤ " in quoted:
                assert quoted.split(" at ≤ ")[1] == want[column].split(" at ≤ ")[1].split()[0], (name, column)


def test_the_transfer_counts_are_the_reports(page, transfer):
    """'on the 103 decided levels … (static: …, 45 tolerated and 32 not; lagged: …, 5 and 21)', against the
    report's first line."""
    static_t, static_n, lag_t, lag_n = _ints(_said(
        transfer, r"static sources \(formats, noise, engines\) (\d+) tolerated, (\d+) not; lagged sources "
                  r"\(staleness, reuse\) (\d+) tolerated, (\d+) not"))
    across = section(page, "One statistic across sources")
    said = _ints(_said(across, r"on the (\d+) decided levels of every source.*?\(static: formats, noise, engines, "
                                r"(\d+) tolerated and (\d+) not; lagged: staleness and reuse, (\d+) and (\d+)\)"))
    assert said == [static_t + static_n + lag_t + lag_n, static_t, static_n, lag_t, lag_n]


def test_the_window_gate_per_pair_is_the_reports(page, transfer):
    """'right on 31 of reverse-qwen3's 32 and 23 of sort-gpt2's 41, but on 13 of smollm2-pruned's 27, where always
    admitting gets 19', against the report's per-pair table of the gate with a teacher."""
    rows = _table(section(transfer, "The check's gate with a teacher: `window:mismatch_kl` leaving one pair out"),
                  "by")
    pairs = {r["group"]: r for r in rows if r["by"] == "pair"}
    said = _said(section(page, "One statistic across sources"),
                 r"right on (\d+) of (\S+)'s (\d+) and (\d+) of (\S+)'s (\d+), but on (\d+) of (\S+)'s (\d+), where "
                 r"always admitting gets (\d+)")
    g = said.groups()
    for right, pair, levels in (g[0:3], g[3:6], g[6:9]):
        assert (right, levels) == (pairs[pair]["right"], pairs[pair]["levels"]), pair
    assert g[9] == pairs[g[7]]["always admit"]


def test_the_drift_margins_are_the_reports(page, admission):
    """'median 0.898 and largest 1.29 over 34 levels, weight noise 1.1 and 1.71 over 34 … ×0.694 for formats and
    ×0.641 for noise (the pooled limit to 0.0948 and 0.0877', against the report's drift-margin table."""
    table = {r["source"]: r for r in _table(section(admission, "Drift margin"), "source")}
    fmt, noise = table["format"], table["noise"]
    said = _said(section(page, "Drift"),
                 r"median (\S+) and largest (\S+) over (\d+) levels, weight noise (\S+) and (\S+) over (\d+);")
    assert said.groups() == (fmt["median"], fmt["largest"], fmt["levels"],
                             noise["median"], noise["largest"], noise["levels"])
    said = _said(section(page, "Drift"), r"×(\S+) for formats and ×(\S+) for noise \(the pooled limit to (\S+) "
                                          r"and (\S+)[,;]")
    assert said.groups() == (fmt["margin"], noise["margin"], fmt["lowered limit"], noise["lowered limit"])


def test_each_loss_s_lowered_limit_is_the_reports(page, admission):
    """'full-rkl's own, 0.2226, to 0.1545 and 0.1473; pg-rkl-is's own, 0.1473, to …', 'by its own first-step limit
    0.223 (lowered by the format drift margin to 0.1545)' and '… 0.1545 with the thresholds shipped now', against the
    report's per-loss table (the limit the check judges each loss by, lowered by each source's margin)."""
    table = {r["loss"]: r for r in _table(section(admission, "Drift margin"), "loss")}
    drift = section(page, "Drift")
    for loss in ("full-rkl", "pg-rkl-is"):
        row = table[loss]
        assert row["fitted on"] == "its own levels", loss  # the page says "own"
        said = _said(drift, rf"{loss}'s own, (\S+), to (\S+) and (\S+)[;)]")
        assert said.groups() == (row["limit"], row["lowered: format"], row["lowered: noise"]), loss
    full = table["full-rkl"]
    said = _said(page, r"full-rkl, by its own first-step limit (\S+) \(lowered by the format drift margin to (\S+)\)")
    assert said.groups() == (f"{float(full['limit']):.3g}", full["lowered: format"])
    assert _said(page, r"(\S+) with the thresholds shipped now").group(1) == full["lowered: format"]


def test_each_statistic_counted_leaving_one_pair_out_is_the_reports(page, transfer):
    """'behind `window:mismatch_is_ratio_outside_frac` and `window:seq_kl` (81 each), `window:…` (79), …': every
    statistic the section names with a count in brackets gets that many levels right leaving one pair out."""
    report = _transfer_rows(transfer)
    flat = re.sub(r"\s+", " ", section(page, "One statistic across sources"))
    said = re.findall(r"((?:`[\w:]+`(?:,? and |, )?)+) \((\d+)(?: each)?\)", flat)
    assert len(said) >= 3, "the premise: the section names statistics with their counts"
    for names, count in said:
        for name in re.findall(r"`([\w:]+)`", names):
            assert _right(report[name]["leave one pair out"]).split("/")[0] == count, (name, count)
