"""Verdicts the study's pages say of levels, read from their prose and checked against the reports.

A verdict is said of a level with its seeds ("int3 is not tolerated on reverse-qwen3 (6 seeds)", "undecided at 16":
`seed_claims`) or without ("int2 is not tolerated on either pair": `verdict_claims`), in the scope its sentence
gives it (`_scope`: the pair or each pair of a group, the loss, the response length, the TIS setting, the learning
rate and β1) and of the levels it is said of (`_levels_said`). `unsupported` checks claims against every level the
reports judge (`levels_judged`); `verdict_before` gives the verdict a quoted interval is said under, by the same
clauses. The reader is a heuristic over the pages' own phrasing, not a grammar: what it misses is measured by
`tests/test_readme_numbers.py::test_a_false_claim_made_from_a_true_one_fails`.
"""

import re
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
REPORTS = ROOT / "reports"

PLUS_MINUS = re.compile(r"(?<![\w.])([−+-]?\d+(?:\.\d+)?) ± (\d+(?:\.\d+)?)(?![\w.]*\d)")
VERDICT = re.compile(r"not[- ]tolerated|do(?:es)? not tolerate|tolerated|tolerates?|undecided")
# the verb's forms → the verdict (`said_verdict`: a heading's capital aside)
SAID = {"not-tolerated": "not tolerated", "does not tolerate": "not tolerated", "do not tolerate": "not tolerated",
        "tolerates": "tolerated", "tolerate": "tolerated", "is not": "not tolerated", "are not": "not tolerated"}
# a new sentence (one that opens with a level or pair's name too), clause, paragraph or item; a sentence that ends in
# a parenthesis or in bold too ("… digit.) The study …")
SENTENCE_END = re.compile(r"(?:\.\s+(?=[A-Z*`(]|(?:reuse|stale|int\d|fp8|sort-gpt2|reverse-qwen3|smollm2)\b)"
                          r"|(?<=\.\))\s+(?=[A-Z*`])|(?<=\.\*\*)\s+|;\s|\n\s*\n|\n- )")
WORDS = {"uncertain": "undecided"}  # the reports' verdict column → the word the pages use


# --- the scope a verdict is said in --------------------------------------------------------------------------------
# The pair named last before it, the loss of its sentence (or of the item it opens), a response length named since
# that pair, the TIS setting, and the levels it is said of (`_levels_said`); each of those levels (some level, where it
# names none the reader can name) must have that verdict, at that many seeds where it quotes them. A claim told as
# history ("was tolerated at 3 seeds on 2026-12-05", "the one lost") is not one about the reports and is skipped.

PAIR_NAMES = re.compile(r"sort-gpt2|reverse-qwen3|smollm2-concise|smollm2-pruned|synthetic pairs|real pairs"
                        r"|real weights"
                        r"|(?<=on )both(?: synthetic| real)? pairs|(?<=on )either pair|(?<=on )both\b")
GROUPS = {"synthetic pairs": ["sort-gpt2", "reverse-qwen3"], "real pairs": ["smollm2-concise", "smollm2-pruned"]}
GROUPS["real weights"] = GROUPS["real pairs"]
LOSS_NAMES = re.compile(r"pg-rkl-is|pg-rkl|full-rkl|full-fkl")
LENGTHS = re.compile(r"(?<![\w.~])(8|32|128)(?:[- ]tokens?\b|-token\b)|(?<=\] at )(8|32|128)\b")  # "[0, 3.4] at 32"
SEEDS_SAID = re.compile(r"(?:(?<=\()|(?<=at )|(?<=, )|(?<=; ))(\d+) seeds?\b"  # "(6 seeds", "at 10 seeds"
                        r"|(?<!\] )(?<!runs )\bat (\d+)"  # "undecided at 16", not "at 8 and 32 tokens" nor "at 0.1"
                        r"(?![\w:–-]|\.\d|(?:,? (?:and |or )?\d+)*[- ]tokens?| nats| steps?| to | or )")
HISTORY = re.compile(r" was | were | had |earlier|\blost\b|until|design that spent the whole")  # verdicts of the past
SENTENCE = re.compile(r"\.\s+(?=[A-Z*`(])|\n\s*\n|\n- ")
FORMAT_NAMES = re.compile(r"(?<![\w:-])(fp8-e4m3:\w+|fp8-e5m2:\w+|int\d:\w+|int\d|bnb-nf4|fp8|FP8)(?![\w:-])")
LEVEL_NAMES = re.compile(r"\b(stale|reuse):(\d+)")
NOISE_NAMES = re.compile(r"\bnoise (?:from )?(\d\.\d+(?:(?:(?:,| and| or| to) |–)\d\.\d+)*)")  # a range: its ends
LAG_NAMES = re.compile(r"\blags? of (\d+(?:(?:,| and| or) \d+)*)")
CLAIM_VERDICT = re.compile(VERDICT.pattern + r"|\b(?:is|are) not(?=[,;.)]| \()"
                           r"|(?<![\w ])(?:Not tolerated|Tolerated|Undecided)")
# "a lag of 4 is not, and int3 is not (…)", a heading's "**Not tolerated on sort-gpt2:** …"
BOUNDS = re.compile(r", and |, nor |: ")  # where a verdict's subject starts at the latest (a coordinate clause)
TIS_SAID = re.compile(r"with and without TIS|without TIS|with TIS|either way")
TIS_SETTING = {"with TIS": "2", "without TIS": "off", "with and without TIS": "both", "either way": "both"}
# the optimizer a verdict is said at: "at lr 3e-4", AdamW's "β1 0.9" (with the learning rate before it: one setting),
# "without momentum" (a setting of its own: "at lr 3e-4 and without momentum" names two)
OPTIMIZER_SAID = re.compile(r"\blr (?P<lr>\d(?:\.\d+)?e-\d+|0\.\d+)(?![\w-]|\.\d)"
                            r"|\bβ1 (?P<beta1>0(?:\.\d+)?)(?![\w-]|\.\d)|(?P<none>without momentum)")


def _parentheses(item: str) -> list[tuple[int, int]]:
    """Each parenthesis of `item` as (where it opens, where it closes; the item's end for one left open)."""
    spans, stack = [], []
    for i, ch in enumerate(item):
        if ch == "(":
            stack.append(i)
        elif ch == ")" and stack:
            spans.append((stack.pop(), i))
    return spans + [(o, len(item)) for o in stack]


def _aside_blanked(item: str, at: int) -> str:
    """`item` with every parenthesis that does not hold `at` blanked (same length): an aside's words are not the
    claim's ("… at 3 (tolerated until the A/A level reached 10 seeds)" is no history of the claim)."""
    out = list(item)
    for o, c in _parentheses(item):
        if not o < at <= c:
            out[o:c + 1] = " " * (min(c + 1, len(item)) - o)
    return "".join(out)


def _clause_ends(item: str, at: int) -> list[re.Match]:
    """The clause boundaries of `item` (`SENTENCE_END`) that bound a claim at `at`: those inside a parenthesis the
    claim is not in ("(3–10 seeds; four of them marginal)") do not."""
    asides = [(o, c) for o, c in _parentheses(item) if not o < at <= c]
    return [e for e in SENTENCE_END.finditer(item) if not any(o < e.start() < c for o, c in asides)]


def _clause(item: str, anchor: int, after: int) -> tuple[int, int]:
    """Where the clause holding a claim at `anchor` starts and ends (the first boundary from `after`, where the
    claim's words end), by `_clause_ends` as seen from `anchor`."""
    ends = _clause_ends(item, anchor)
    return (max((e.end() for e in ends if e.end() <= anchor), default=0),
            next((e.start() for e in ends if e.start() >= after), len(item)))


def _walk_out(item: str, at: int) -> list[tuple[int, int]]:
    """Where to look for the clause of a claim at `at`, in order, each as (anchor, where that clause ends at the
    latest): at `at` itself, up to the innermost parenthesis's close, then — for a claim in a parenthesis whose own
    clause says no verdict — at each parenthesis holding it, innermost first, up to the next one's close (the
    item's end for the outermost)."""
    asides = sorted(((o, c) for o, c in _parentheses(item) if o < at <= c), reverse=True)  # innermost first
    return list(zip([at] + [o for o, _ in asides], [c for _, c in asides] + [len(item)]))


def section(text: str, heading: str) -> str:
    """A page's section: from its heading line (any level) to the next heading of the same or a higher level (an
    h1 or a "# comment" in a code block does not end it)."""
    m = re.search(rf"^(#+) {re.escape(heading)}\n", text, re.M)
    assert m, f"no section {heading!r}"
    nxt = re.search(rf"^#{{2,{len(m.group(1))}}} ", text[m.end():], re.M)
    return text[m.start():m.end() + nxt.start() if nxt else None]


def said_verdict(word: str) -> str:
    """The verdict a verdict word (`CLAIM_VERDICT`'s) says, in the pages' words: "does not tolerate" → "not
    tolerated", a heading's "Tolerated" → "tolerated"."""
    return SAID.get(word.lower(), word.lower())


def items(text: str) -> list[str]:
    """The page's paragraphs and list items, wrapped lines joined."""
    return re.sub(r"\s*\n\s*", " ", text.replace("\n\n", "\x00").replace("\n- ", "\x00- ")).split("\x00")


def verdict_word_before(text: str, at: int) -> re.Match | None:
    """The words a number quoted at `at` of `text` is said under: the last verdict before it in its clause
    (`_clause`), other asides' words aside; for a number in a parenthesis whose own clause says none ("… is not
    tolerated: int3:group32 (6 seeds; Δ −6.0 ± 1.2 …)"), the clause the parenthesis is in, as `seed_claims` reads a
    count (None: none gives one)."""
    for anchor, _ in _walk_out(text, at):
        start, _ = _clause(text, anchor, anchor)
        words = list(CLAIM_VERDICT.finditer(_aside_blanked(text, at), start, anchor))
        if words:
            return words[-1]
    return None


def verdict_before(text: str, at: int) -> str | None:
    """`verdict_word_before`'s verdict, in the pages' words."""
    word = verdict_word_before(text, at)
    return said_verdict(word[0]) if word else None


def _levels_said(item: str, m: re.Match, start: int, verdict: re.Match,
                 verdicts: list[re.Match]) -> set[tuple[int, str]]:
    """The levels the seed count `m` is said of (where each is named, and its name), in its clause from `start`
    (`verdict`: the claim's; `verdicts`: the clause's verdict words, asides blanked), since the clause's count before
    it (a count in another aside bounds nothing) or a coordinate clause (", and …", ": …"):
    - those named after the last verdict before it ("sort-gpt2 tolerates noise 0.1 and 0.2 (6 seeds)", "int2 is
      not tolerated, nor int3 (6 seeds)"), else that verdict's subject ("noise 0.06, 0.1 and 0.15 are undecided
      at 6", "int3 is not (but on sort-gpt2 undecided at 10)"); with the verdict after it, those named before it
      ("int4:channel (16 seeds) and int4:group128 (10 seeds) are tolerated"), or between the two ("at 6 seeds
      noise 0.4 is not tolerated");
    - a count in a parenthesis that names no level before it is said of the phrase the parenthesis follows, since
      the aside before ("noise 0.06 to 0.6 (…), stale:4 and reuse:2 (3 seeds)"); where the parenthesis lists one
      interval per level of that phrase, in order, of the levels whose intervals it follows ("A and B are not
      tolerated (1.2 ± 0.08 and 1.24 ± 0.13 at 6 seeds, and 1.20 ± 0.08 at 3)"; all of them when it comes first);
    - none where the parser finds no level (then some level in the claim's scope must have its verdict)."""
    at = m.start()
    plain = _aside_blanked(item, at)  # a count in another aside floors nothing

    def floor_of(upto: int) -> int:
        return max([start, *(c.end() for c in SEEDS_SAID.finditer(plain, start, upto))])

    def subject(lo: int, upto: int) -> list[tuple[int, str]]:
        before = [v for v in verdicts if lo <= v.start() and v.end() <= upto]
        if before:
            after = _names(item, before[-1].end(), upto)
            if after:
                return after
            # a verdict with no subject of its own shares the one before ("X is tolerated on P (…) and undecided
            # on Q at 3", "X is not tolerated, where full-rkl's is undecided at 6")
            for k in range(len(before) - 1, -1, -1):
                bounds = [b.end() for b in BOUNDS.finditer(plain, lo, before[k].start()) if b.end() < before[k].start()]
                own = _names(item, max([lo, *(v.end() for v in before[:k]), *bounds]), before[k].start())
                if own or k == 0:
                    return own
        return _names(item, lo, upto)

    between = _names(item, m.end(), verdict.start()) if verdict.start() > at else []
    if between and item[m.end():].lstrip(" )").startswith(":"):  # "(27 runs at 3 seeds: noise 0.06 tolerated"
        return set(between)
    aside = [(o, c) for o, c in _parentheses(item) if o < at <= c]
    said = subject(max(floor_of(at), max(aside)[0] if aside else 0), at)
    if aside and not said:
        o, c = max(aside)  # the innermost parenthesis holding the count
        closed = [e for s_, e in _parentheses(item) if start <= s_ and e < o]
        listed = subject(max([floor_of(o), *closed]), o)
        values = [v.end() for v in PLUS_MINUS.finditer(item, o, c)]
        said = listed
        if len(listed) > 1 and len(values) == len(listed) and "A/A" not in item[o:at]:
            previous = max((x.end() for x in SEEDS_SAID.finditer(item, o, at)), default=o)
            said = [(p, n) for (p, n), v in zip(listed, values) if previous < v <= at] or listed
    return set(said or between)


def seed_claims(text: str) -> list[dict]:
    """Every verdict the page quotes with a seed count, with the scope it is said in (see above)."""
    out = []
    for item in items(text):
        for m in SEEDS_SAID.finditer(item):
            at = m.start()
            plain = _aside_blanked(item, at)
            # its clause; for a count in a parenthesis whose own clause says no verdict ("(mismatch_kl 0.0892; 16
            # seeds)"), the clause the parenthesis is in
            for anchor, close in _walk_out(item, at):  # a clause inside a parenthesis ends where it closes
                start, end = _clause(item, anchor, m.end())
                end = min(close, end)
                verdicts = list(CLAIM_VERDICT.finditer(plain, start, end))
                if verdicts:
                    break
            said = [v for v in verdicts if v.end() <= at]
            # the verdict before the claim; else the one its clause goes on to ("int4:channel (16 seeds) and
            # int4:group128 (10 seeds) are tolerated")
            verdict = said[-1] if said else next((v for v in verdicts if v.start() >= m.end()), None)
            if verdict is None or item[max(0, at - 6):at] == "up to " or HISTORY.search(plain, start, end) \
                    or re.match(r"(?: seeds?)? on 20\d\d-\d\d-\d\d", item[m.end():]):
                continue  # no verdict, a bound ("up to 16 seeds") or history
            scope = _scope(item, at, start, end, verdict.end() if verdict.end() <= at else m.end())
            named = _levels_said(item, m, start, verdict, verdicts)  # (where, level)
            out.append({"claim": item[start:max(m.end(), verdict.end())], "verdict": said_verdict(verdict[0]),
                        "seeds": int(m[1] or m[2]), **scope, "each": {n for _, n in named}, "named": named,
                        "at": (item, verdict.start())})
    return out


def _scope(item: str, at: int, start: int, end: int, after: int, subject: int | None = None) -> dict:
    """The scope a verdict at `at` of `item` is said in (its clause `start`–`end`, the verdict's words ending at
    `after`): the pair named last before it (or, where its clause names none before it, the one it is said "on"
    after it; "on both pairs", "on either pair": each pair of the item's group, `every`), the loss of its sentence
    (or of the item it opens; a "where under full-rkl …" contrast lends its loss only to its own clause), a
    response length named since that pair ("off" where the item says its responses are uncapped), with or without
    TIS or both ("with and without TIS", "either way"; said since `subject`, where the verdict's subject starts, or
    after it), and the optimizer settings (`OPTIMIZER_SAID`) said since its subject or a coordinate clause, else
    after it up to the next verdict or coordinate clause ("tolerated at lr 3e-4 and without momentum": two settings,
    each an lr or β1 the levels must have, the other as any level has it; "at lr 1e-3 with AdamW β1 0.9": one)."""
    plain = _aside_blanked(item, at)
    pairs = list(PAIR_NAMES.finditer(plain, 0, at))
    on = re.match(r"(?:\s+under [\w-]+)?\s+on\s+", plain[after:])  # "… is tolerated (under full-rkl) on P": P
    said_on = PAIR_NAMES.match(plain, after + on.end()) if on else None
    if said_on and not [x for x in pairs if x.start() >= said_on.end()]:  # no other pair named since
        pairs.append(said_on)
    elif not [x for x in pairs if x.start() >= start and x[0] not in GROUPS]:  # none of its own: "… tolerated … on P"
        stop = next((w.start() for w in CLAIM_VERDICT.finditer(plain, after, end)), end)
        pairs += [x for x in PAIR_NAMES.finditer(plain, after, stop) if plain[x.start() - 3:x.start()] == "on "][:1]
    pair = pairs[-1] if pairs else None
    name = pair[0] if pair else None
    every = name in GROUPS  # "on the synthetic pairs …": each of them
    if name and name.startswith(("both", "either")):
        groups = [g for g in re.findall(r"synthetic|real|SmolLM2", item[:pair.start()])]
        every = True
        name = "synthetic pairs" if "synthetic" in name or not groups and "real" not in name \
            else "real pairs" if "real" in name else "synthetic pairs" if groups[-1] == "synthetic" else "real pairs"
    since_pair = pair.end() if pair and pair.start() < at else 0
    s0 = max((e.end() for e in SENTENCE.finditer(item, 0, at)), default=0)
    s1 = next((e.start() for e in SENTENCE.finditer(item, at)), len(item))

    def contrast(m_):  # "where under full-rkl …": another loss's verdict, beside this one
        return bool(re.search(r"where (?:under )?$", item[max(0, m_.start() - 12):m_.start()]))

    losses = list(LOSS_NAMES.finditer(item))
    first_pair = PAIR_NAMES.search(item)
    opening = next((e.start() for e in SENTENCE.finditer(item)), len(item))  # the item's first sentence
    loss = ([x[0] for x in losses if max(s0, since_pair) <= x.start() < at
             and (x.start() >= start or not contrast(x))][-1:]
            or [x[0] for x in losses if at <= x.start() < s1 and not contrast(x)][:1]
            or [x[0] for x in losses if (first_pair is None or x.start() < first_pair.start()
                                         or x.start() < opening) and not contrast(x)][:1])
    lengths = [a or b for a, b in LENGTHS.findall(item, since_pair, at)]
    if not lengths and "uncapped" in item[:at]:
        lengths = ["off"]
    said_tis = list(TIS_SAID.finditer(plain, start if subject is None else subject, at)) \
        or list(TIS_SAID.finditer(plain, at, end))[:1] or _tis_in_aside_after(item, after)
    # the optimizer: said since its subject (or a coordinate clause) before it, else after it up to the next verdict
    # or coordinate clause
    lo = max([start if subject is None else subject, *(b.end() for b in BOUNDS.finditer(plain, start, at))])
    stop = min([end, *(w.start() for w in CLAIM_VERDICT.finditer(plain, after, end)),
                *(b.start() for b in BOUNDS.finditer(plain, after, end))])
    optimizer = list(OPTIMIZER_SAID.finditer(plain, lo, at)) \
        or list(OPTIMIZER_SAID.finditer(plain, max(at, after), stop))
    optimizers: list[dict] = []
    for m in optimizer:
        if m["beta1"] is not None and optimizers and "beta1" not in optimizers[-1]:
            optimizers[-1]["beta1"] = float(m["beta1"])  # "at lr 1e-3 with AdamW β1 0.9": one setting
        else:
            optimizers.append({"lr": float(m["lr"])} if m["lr"] else {"beta1": float(m["beta1"] or 0)})
    return {"pair": name, "every": every, "loss": loss[0] if loss else None,
            "length": lengths[-1] if lengths else None, "tis": TIS_SETTING[said_tis[-1][0]] if said_tis else None,
            "optimizers": optimizers}


def _tis_in_aside_after(item: str, after: int) -> list[re.Match]:
    """The TIS setting an aside right after a verdict's words (or their seed count) opens with, "… is tolerated
    (with TIS)", "… not tolerated at 6 seeds (without TIS, …)"; not one said later in it, "(but on sort-gpt2 without
    TIS, undecided …)", which is another claim's."""
    aside = next((o for o, _ in sorted(_parentheses(item))
                  if o >= after and re.fullmatch(r"\s*(?:at \d+(?: seeds?)?)?\s*", item[after:o])), None)
    said = TIS_SAID.match(item, aside + 1) if aside is not None else None
    return [said] if said else []


HYPOTHETICAL = re.compile(r"\b(?:if|whether|would|could|may|might|can|cannot|unless|where decided|taken as)\b")


def verdict_claims(text: str, seeded: list[dict] | None = None) -> list[dict]:
    """Every verdict the page says of a named level without a seed count ("int2 is not tolerated on either pair",
    "the fp8 formats and int8 are tolerated on both pairs"), with its scope (`_scope`) — a verdict a seed count's
    claim is read from (`seeded`, the page's `seed_claims`, read here where not given) is that claim's; history,
    hypotheticals and verdicts of no level the parser can name ("every decided level is tolerated") are skipped."""
    counted: dict = {}  # the levels, where they are named, a seed count's claim checks already
    for c in seed_claims(text) if seeded is None else seeded:
        counted.setdefault(c["at"], set()).update(c["named"])
    out = []
    for item in items(text):
        for v in CLAIM_VERDICT.finditer(item):
            at = v.start()
            plain = _aside_blanked(item, at)
            start, end = _clause(item, at, v.end())
            for o, c in _parentheses(item):  # a verdict in an aside is said of the aside's levels
                if o < at <= c:
                    start, end = max(start, o + 1), min(end, c)
            # its subject: after the verdict, colon or coordinate clause before it ("…, nor int3 (…), and the other
            # int4 levels are undecided")
            others = [w.end() for w in CLAIM_VERDICT.finditer(plain, 0, at)]
            others += [w.end() for w in BOUNDS.finditer(plain, 0, at) if w.end() < at]  # not "X: tolerated"
            verb = v[0] in ("tolerates", "tolerate") or v[0].startswith("do") or item[v.end():].startswith(":")
            nxt = next((w.start() for w in CLAIM_VERDICT.finditer(plain, v.end(), end)), end)
            subject = max([start, *others])
            # history in its own phrase ("was tolerated at 3 seeds on 2026-12-05", "… tolerated at 3 seeds before"),
            # up to the next comma, dash or verdict; a hypothetical before it ("would be tolerated")
            phrase = re.compile(r"[,;:]| —").search(plain, v.end(), nxt)
            said_until = phrase.start() if phrase else nxt
            if HISTORY.search(plain, subject, said_until) or HYPOTHETICAL.search(plain, subject, v.end()) \
                    or re.search(r" on 20\d\d-\d\d-\d\d", plain[subject:said_until]):
                continue
            each = _names(plain, v.end(), nxt) if verb else _names(plain, subject, at)
            scope = _scope(item, at, start, end, v.end(), subject)
            by_tis: dict = {}  # "does not tolerate A, B or, with TIS, C and D": C and D with TIS, A and B either way
            inside = [o for o, c in _parentheses(item) if o < at <= c]
            if not each and inside and not item[max(inside) + 1:at].strip():  # an aside that opens with its verdict,
                # "reverse-qwen3's int4:group32 under pg-rkl-is (not tolerated, …)", is said of the level before it
                each = _names(_aside_blanked(item, max(inside)), 0, max(inside))[-1:]
            each = [(p, n) for p, n in each if (p, n) not in counted.get((item, at), ())]
            for p, n in each:  # a verb's objects: with the TIS said before each, else either way
                said = list(TIS_SAID.finditer(plain, start, p)) if verb else []
                tis = TIS_SETTING[said[-1][0]] if said else scope["tis"] if not verb else None
                by_tis.setdefault(tis, set()).add(n)
            for tis, names in by_tis.items():
                out.append({"claim": item[start:end], "verdict": said_verdict(v[0]), "seeds": None,
                            **scope, "tis": tis, "each": names})
    return out


def _names(item: str, lo: int, hi: int) -> list[tuple[int, str]]:
    """The levels `item[lo:hi]` names, each with where its name is (a list "noise 0.25 and 0.4": each value's)."""
    found = [(m.start(), m[1].lower()) for m in FORMAT_NAMES.finditer(item, lo, hi)]
    found += [(m.start(), "held-out") for m in re.finditer(r"held-out (?:copies|cases)", item[:hi]) if m.start() >= lo]
    found += [(m.start(), f"held-out block-{m[1]}") for m in re.finditer(r"block-(\d+) copy", item[:hi])
              if m.start() >= lo]  # a held-out case by the block it copies (docs/admission.md)
    found += [(m.start(), f"{m[1]}:{m[2]}") for m in LEVEL_NAMES.finditer(item, lo, hi)]
    for pattern, name in ((NOISE_NAMES, lambda x: f"noise:{float(x):g}"), (LAG_NAMES, lambda x: f"stale:{x}")):
        for m in pattern.finditer(item, lo, hi):
            found += [(m.start(1) + v.start(), name(v[0])) for v in re.finditer(r"\d\.\d+|\d+", m[1])]
    return sorted(found)


def levels_judged():
    """Every level the reports judge (`tolerance_levels.csv`) and the held-out validation cases, with the verdict
    in the pages' words, its seeds, response cap and name as the pages write it (int8:channel, noise:0.1, stale:4;
    a held-out case, a copy of part of the model, answers to "held-out block-N" for the block it copies)."""
    import json

    import pandas as pd

    levels = pd.read_csv(REPORTS / "tolerance_levels.csv")
    levels["said"] = levels.verdict.map(lambda v: WORDS.get(v, v))
    levels["tokens"] = levels.settings.str.extract(r"max_new_tokens (\w+)")[0]
    levels["tis"] = levels.settings.str.extract(r"tis_cap (\w+)")[0]
    levels["lr"] = levels.settings.str.extract(r"\blr ([^,]+)")[0].astype(float)
    levels["beta1"] = levels.settings.str.extract(r"adam_beta1 ([^,]+)")[0].astype(float)
    levels["name"] = [level if source == "format" else f"noise:{float(level):g}" if source == "noise"
                      else f"{source}:{level}" for source, level in zip(levels.source, levels.level)]
    # the other names of a level's runs ("int4:group128", "int8:channel (tis_cap off)"): the same verdict
    same = levels[levels.same_as.notna()].assign(name=lambda f: f.same_as.str.split(", ")).explode("name")
    same["tis"] = same.name.str.extract(r"\(tis_cap (\w+)\)")[0].fillna(same.tis)
    same["name"] = same.name.str.replace(r" \(.*\)$", "", regex=True)
    levels = pd.concat([levels, same], ignore_index=True)
    validation = json.loads((ROOT / "experiments" / "validation" / "validation.json").read_text(encoding="utf-8"))
    cases = pd.DataFrame([{"pair": validation["pair"], "loss": validation["loss"], "said": case["study"],
                           "seeds": case["seeds"], "tokens": "off", "tis": "off",
                           "name": f"held-out block-{case['layers']}"}
                          for case in validation["cases"]])
    return pd.concat([levels[["pair", "loss", "said", "seeds", "tokens", "tis", "lr", "beta1", "name"]], cases],
                     ignore_index=True)


def _named(name: str, token: str) -> bool:
    """A level's name answers to how a page names it: int8 → int8:channel, fp8 → fp8-e4m3:channel."""
    return name == token or name.startswith(token + ":") or (token == "fp8" and name.startswith("fp8-")) \
        or (token == "held-out" and name.startswith("held-out "))


def unsupported(claims: list[dict], levels) -> list[str]:
    """The claims no level of `levels` supports, each as a line: a claim holds where, in its loss and length, each
    level it is said of (some level, where it names none) has its verdict at its seeds — on its pair (on each pair
    of its group said "on both pairs", else on one of them), its TIS setting (each of the two for "with and
    without TIS") and each optimizer setting it is said at."""
    wrong = []
    for claim in claims:
        rows = levels[levels.said == claim["verdict"]]
        if claim["seeds"] is not None:
            rows = rows[rows.seeds == claim["seeds"]]
        said = rows
        if claim["loss"]:
            rows = rows[rows.loss == claim["loss"]]
        if claim["length"]:
            rows = rows[rows.tokens == claim["length"]]
        pairs = GROUPS.get(claim["pair"], [claim["pair"]])

        held = {t for t in claim["each"] if t.startswith("held-out")}  # in their own pair, loss and length: each
        cases = {n for n in levels.name if n.startswith("held-out ")}  # of them ("the study tolerated both")
        if not all({n for n in cases if _named(n, t)} <= set(said.name) for t in held):
            wrong.append(f"“…{claim['claim'][-70:]}”: not every held-out case is {claim['verdict']}")
            continue

        def holds(pair, tis, optimizer):
            if held and not claim["each"] - held:
                return True
            there = rows[(rows.pair == pair) | (pair is None)]
            there = there[(there.tis == tis) | (tis is None)]
            for column, value in optimizer.items():
                there = there[np.isclose(there[column], value, rtol=1e-9)]
            return not there.empty and all(any(_named(name, t) for name in there.name) for t in claim["each"] - held)

        settings = ["2", "off"] if claim["tis"] == "both" else [claim["tis"]]
        optimizers = claim.get("optimizers") or [{}]  # each optimizer setting said: in each
        if not (all if claim.get("every") else any)(all(holds(p, t, o) for t in settings for o in optimizers)
                                                    for p in pairs):
            optimizer = "; ".join(" ".join(f"{k} {v:g}" for k, v in o.items()) for o in optimizers)
            scope = " ".join([*(str(claim[k]) for k in ("pair", "loss", "length", "tis") if claim[k]), optimizer])
            named = ", ".join(sorted(claim["each"])) or "some level"
            seeds = f" at {claim['seeds']} seeds" if claim["seeds"] is not None else ""
            wrong.append(f"“…{claim['claim'][-70:]}”: not every one of {named} ({scope}) is {claim['verdict']}{seeds}")
    return wrong
