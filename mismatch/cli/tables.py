"""Rich tables the CLI prints: pure functions from library results to `rich.table.Table`s.

Kept apart from the command modules so that each reads as options → one library call → print. Imported
inside the commands (it pulls in the library), never at the CLI's start-up.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from mismatch.model.loader import context_length
from mismatch.pairs.build import parameter_count
from mismatch.probes.runs import CandidateResult, ProbeConfig
from mismatch.sweep import Study, SweepReport, task_label
from mismatch.verdict import Tolerance

if TYPE_CHECKING:
    import pandas as pd

PLAIN_EVERY_S = 30.0  # off a terminal, a progress line at most this often per bar (plus its start and end)
SUMMARY_COLUMNS = ("kl_fwd_mean", "kl_fwd_p99", "kl_fwd_max", "tv_mean", "top1_agree", "logp_abs_diff_mean",
                   "is_ratio_outside_frac", "chi2_token")


def progress_bar(console: Console) -> Progress:
    """A transient bar: description, bar, done/total, elapsed time and a free `info` field."""
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("{task.fields[info]}"), console=console, transient=True)


class Bars:
    """Transient progress bars on `console`, one per description, created on first update. Off a
    terminal (a log, CI, `nohup`) bars draw nothing, so plain lines go there instead: one when a
    bar starts, when it ends, and at most every `every` seconds between."""

    def __init__(self, console: Console, every: float = PLAIN_EVERY_S) -> None:
        self.console, self.every = console, every
        self.plain = not console.is_terminal
        self.progress, self.tasks, self.said = progress_bar(console), {}, {}

    def __enter__(self) -> Bars:
        if not self.plain:
            self.progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if not self.plain:
            self.progress.__exit__(*exc)

    def update(self, description: str, completed: int, total: int, info: str = "") -> None:
        """Set the bar `description` to `completed` of `total`, with a free `info` text."""
        if self.plain:
            now, last = time.monotonic(), self.said.get(description)
            if last is None or completed >= total or now - last >= self.every:
                self.said[description] = now
                stamp = time.strftime("%H:%M:%S")
                self.console.print(f"{stamp} {description}: {completed}/{total} {info}".rstrip(), markup=False,
                                   highlight=False, soft_wrap=True)
            return
        if description not in self.tasks:
            self.tasks[description] = self.progress.add_task(escape(description), total=total, info="")
        self.progress.update(self.tasks[description], completed=completed, total=total, info=escape(info))


def wrote(console: Console, *paths) -> None:
    """`wrote PATH` on `console` for each path that is not None."""
    for path in paths:
        if path is not None:
            console.print(f"wrote {path}", highlight=False)


def probe_table(config: ProbeConfig, results: list[CandidateResult]) -> Table:
    """The isolation map (block × spec KL), one run's full summary, or one line per candidate."""
    specs = list(config.perturb)
    if config.each_layer:
        by = {(c.perturb, c.layers): c.result for c in results}
        table = Table("block", *specs, title=escape(f"{config.reference}: kl_fwd_mean with one block perturbed"))
        for scope in dict.fromkeys(c.layers for c in results):
            table.add_row(scope, *(f"{by[spec, scope].summary['kl_fwd_mean']:.4g}" for spec in specs))
        return table
    if len(results) == 1:
        label = specs[0] if specs else f"{config.candidate} [{config.cand_dtype}]"
        table = Table("metric", "value", title=escape(f"{label} vs {config.reference} [{config.ref_dtype}]"))
        for key, value in results[0].result.summary.items():
            table.add_row(key, f"{value:.6g}")
        return table
    table = Table("perturb", *SUMMARY_COLUMNS, title=escape(f"{config.reference} [{config.layers}]"))
    for c in results:
        table.add_row(escape(c.perturb), *(f"{c.result.summary[k]:.4g}" for k in SUMMARY_COLUMNS))
    return table


def verdict_table(table: pd.DataFrame, *, title: str, tolerance: Tolerance, baseline: bool) -> Table:
    """`mismatch.analysis.tolerance.run_verdicts` as printed by `mismatch opd`: every run, with its verdict (its
    level's over the seeds given: one seed is `uncertain`) when it has a clean baseline."""
    columns = ["rollout", "final held-out rKL (nats)", "final held-out accuracy"]
    if baseline:
        columns += [f"KL ratio (≤ {1 + tolerance.kl_tol:.2f})", f"accuracy Δ (≥ {-100 * tolerance.acc_tol:.0f} pts)", "verdict"]
    out = Table(*columns, title=escape(title))
    for row in table.itertuples():
        cells = [escape(row.rollout), f"{row.heldout_rkl:.4g}", f"{row.heldout_accuracy:.1%}"]
        if baseline and row.clean:
            cells += ["1", "0", escape(row.status)]
        elif baseline:
            cells += [f"{row.kl_ratio:.3f}", f"{100 * row.acc_delta:+.1f}", escape(row.status)]
        out.add_row(*cells)
    return out


def pairs_table(rows: list[dict[str, str]]) -> Table:
    """One line per pair: name, kind, architecture, teacher, student, sizes, task, loads here (the
    rows of `mismatch.pairs.describe_pairs`; their `missing` notes are printed apart)."""
    table = Table(title="student–teacher pairs")
    table.add_column("pair", no_wrap=True)
    for column in ("kind", "architecture", "teacher", "student", "params (T / S)", "task", "here"):
        table.add_column(column)
    for row in rows:
        table.add_row(*(escape(str(v)) for k, v in row.items() if k != "missing"))
    return table


def pair_table(pair) -> Table:
    """Teacher and student of a loaded pair side by side."""
    table = Table("", "teacher", "student", title=escape(f"{pair.name}: {pair.description}"))
    for label, fn in (("model", lambda lm: lm.name),
                      ("architecture", lambda lm: lm.model.config.model_type),
                      ("parameters", lambda lm: f"{parameter_count(lm.model):,}"),
                      ("vocabulary", lambda lm: f"{lm.model.get_output_embeddings().weight.shape[0]:,}"),
                      ("context", lambda lm: str(context_length(lm.model)))):
        table.add_row(label, escape(fn(pair.teacher)), escape(fn(pair.student)))
    table.add_row("context turns", str(len(pair.teacher_context)), str(len(pair.student_context)))
    table.caption = escape(f"task: {getattr(pair.task, 'name', 'none (KL only)')}; chat: {pair.chat}; "
                           f"max new tokens: {pair.max_new_tokens}")
    return table


def plan_table(study: Study, seconds: list[float] | None = None, workers: int | None = None) -> Table:
    """The tasks of a study, in the order they run, with estimated times (`mismatch sweep --dry-run`)."""
    tasks = [*study.plan.probes, *study.plan.opd]
    seconds = seconds if seconds is not None else [math.nan] * len(tasks)
    known = [s for s in seconds if not math.isnan(s)]
    total = sum(known) / (workers or 1)
    caption = (f"estimated {total / 60:.1f} min" + (f" on {workers} workers" if workers else "")
               + (f"; {len(tasks) - len(known)} tasks never measured" if len(known) < len(tasks) else "")
               + " (costs measured on a 2-core machine, 1 thread per task)")
    table = Table("#", "task", "estimate", caption=escape(caption),
                  title=escape(f"{study.name}: {len(study.plan.probes)} probe groups, "
                               f"{len(study.plan.opd)} OPD runs ({study.path})"))
    for i, (task, sec) in enumerate(zip(tasks, seconds)):
        table.add_row(str(i), escape(task_label(task)), "?" if math.isnan(sec) else f"{sec:.0f} s")
    return table


def measured_line(done: int, planned: int, seconds: float, workers: int | None = None) -> str:
    """What the ledger says the study's finished tasks took (`mismatch sweep --resume --dry-run`)."""
    per = f" (≈ {seconds / 3600 / workers:.1f} h on {workers} workers)" if workers else ""
    return f"done: {done} of {planned} planned tasks, measured {seconds / 3600:.2f} task-hours{per}"


def rounds_table(rounds) -> Table:
    """Adaptive rounds (`mismatch.sweep.decide.Round`): per round, each level that got seeds and how many. Rounds
    are taken per judging group (`Round.group`): a round's number is its group's."""
    table = Table("round", "pair", "source", "settings", "level", "seeds", title="adaptive seeds")
    taken: dict = {}
    for found in rounds:
        taken[found.group] = index = taken.get(found.group, 0) + 1
        for (pair, source, settings, level), before, after in found.levels:
            table.add_row(str(index), escape(str(pair)), escape(str(source)), escape(str(settings)), escape(str(level)),
                          f"{before} → {after}")
    return table


def sweep_summary(report: SweepReport, out) -> Table:
    """How many tasks ran, were skipped and failed, with each failure's message."""
    table = Table("tasks", "count", title=escape(f"sweep into {out}"))
    for label, count in (("ran", len(report.ran)), ("skipped (done before)", len(report.skipped)),
                         ("skipped (failed before: --retry-failed runs them)", len(report.skipped_failed)),
                         ("failed", len(report.failed))):
        table.add_row(label, str(count))
    for tid, message in report.failed.items():
        table.add_row(f"failed {tid}", escape(message))
    return table


def admission_table(admission) -> Table:
    """The admission check's gates: statistic, value with its 95% interval, limit, status, source."""
    cal = admission.calibration
    source = (f"from {cal['sampled_by']}" if admission.from_dump
              else f"under {admission.rollout} [{admission.layers}]")
    title = (f"{admission.model} with rollouts {source}: "
             f"{admission.status.upper()} ({cal['sequences']} sampled responses, {cal['tokens']} tokens)")
    table = Table("gate", "value", "95% interval", "limit", "status", "limit from", title=escape(title))
    def num(x: float) -> str:
        return "—" if math.isnan(x) else f"{x:.4g}"

    for d in admission.decisions:
        interval = "—" if math.isnan(d.low) else f"[{d.low:.4g}, {d.high:.4g}]"
        table.add_row(escape(d.metric), num(d.value), interval, num(d.limit),
                      d.status if d.decides else f"({d.status}: shown, not deciding)", escape(d.source))
    lines = list(admission.notes)
    if admission.cost is not None:
        c = admission.cost
        lines.append(f"rollout cost ({c['label']}, × synchronous rollouts at {c['reference_bits']:g} bits): weight bytes "
                     f"×{c['weight_bytes']:.3f}, matmul ×{c['matmul_cost']:.3f}, rollouts generated "
                     f"×{c['rollouts_generated']:.3g} → rollout ×{c['rollout_cost']:.3f}; step wall ×{c['step_wall']:.3f} "
                     f"(staleness {c['staleness']}, rollout share {c['rollout_share']:g})")
        if "measured" in c:
            m = c["measured"]
            lines.append(f"measured on {m['device']}: {m['reference_tokens_per_s']:.0f} → {m['rollout_tokens_per_s']:.0f} "
                         f"tokens/s, rollout ×{m['rollout_cost']:.3f}")
    table.caption = escape("\n".join(lines)) if lines else None
    return table


def thresholds_table(thresholds) -> Table:
    """Fitted limits with the interval the data pin them to and their leave-one-pair-out accuracy."""
    table = Table("statistic", "limit", "pinned to", "held-out pair", "limit without it", "levels", "accuracy",
                  "always admit", title="admission thresholds (admit when statistic ≤ limit)")
    for v in thresholds.validation:
        lo, hi = thresholds.brackets.get(v["statistic"], [math.nan, math.nan])
        table.add_row(v["statistic"], f"{thresholds.limits[v['statistic']]:.3g}", f"[{lo:.3g}, {hi:.3g}]",
                      v["held_out"], f"{v['limit']:.3g}", str(v["levels"]), f"{v['accuracy']:.2f}",
                      f"{v['always_admit_accuracy']:.2f}")
    lines = [f"{thresholds.primary}{where} per loss (`check --loss`): " + "; ".join(
                 f"{loss} ≤ {v['limit']:.3g} [{v['bracket'][0]:.3g}, {v['bracket'][1]:.3g}]"
                 + ("" if thresholds.own_limit(loss, window=bool(where)) else " (the pooled limit is used: it "
                    "predicts the loss's held-out levels better)")
                 for loss, v in sorted(per_loss.items()))
             for where, per_loss in (("", thresholds.loss_limits), (", window", thresholds.loss_window_limits))
             if per_loss]
    if thresholds.length_law:  # beyond the fitted lengths the limit scales as T^b, b the law's cautious end
        from mismatch.analysis.length import exponent_text

        def law(v: dict) -> str:
            return f"b in [{exponent_text(v['b_low'], -1)}, {exponent_text(v['b_high'], 1)}]"

        own = [f"{loss} {law(v)}" for loss, v in sorted(thresholds.loss_length_laws.items())]
        others = "".join(f"{loss} (its {why}) and " for loss, why in sorted(thresholds.loss_open_ladders.items()))
        lines.append("length law (limit ∝ T^b beyond the fitted lengths) per loss: " + "; ".join(
            [*own, f"{others}any other loss every ladder's envelope, {law(thresholds.length_law)}"] if own
            else [f"{others}every loss the envelope of every ladder, {law(thresholds.length_law)}"]))
    if lines:
        table.caption = escape("\n".join(lines))
    return table


def recipe_text(recipe: dict) -> str:
    """A recipe as the lines a user pastes: kept modules, the vLLM and llm-compressor lists, the scope."""
    import json

    return "\n".join([
        f"recipe for {recipe['spec']}: keep {len(recipe['kept'])} modules in high precision "
        f"({100 * recipe['kept_fraction']:.1f}% of the linear weights"
        + ("" if math.isnan(recipe["bits_per_weight"]) else f", {recipe['bits_per_weight']:.2f} bits/weight") + "); "
        f"verified: {recipe['verified_status']} ({recipe['verified_value']:.4g})",
        f"vLLM quantization_config ignored_layers: {json.dumps(recipe['vllm_ignored_layers'])}",
        f"llm-compressor recipe ignore: {json.dumps(recipe['llmcompressor_ignore'])}",
        f"mismatch: --perturb {recipe['spec']} --layers '{recipe['layers']}'",
    ])


def score_table(result) -> Table:
    """The summary of `score_rollouts`: each statistic under the probes' and the frameworks' names, and which
    trainer side it used (logged by the dump, or recomputed by a model)."""
    from mismatch.dumps.score import trainer_side

    table = Table(title=f"{escape(result.candidate)} scored by {escape(result.reference)}",
                  caption=f"trainer side: {trainer_side(result)}")
    table.add_column("statistic")
    table.add_column("value", justify="right")
    for key, value in result.summary.items():
        if not key.startswith("mismatch_"):  # the same numbers as the probe names, under the check's names
            table.add_row(escape(key), f"{value:.6g}")
    return table


def _last_window(stat) -> str:
    """The statistic's last trailing window: mean [interval] over its logged values (— without a window)."""
    w = stat.last_window
    if w is None:
        return "—"
    interval = f" [{w['low']:.3g}, {w['high']:.3g}]" if w["n"] > 1 else " (1 value)"
    return f"{w['mean']:.4g}{interval} over {stat.window} steps"


def monitor_table(report) -> Table:
    """A training log judged: each calibrated statistic (the gating one first) with its last and largest
    value, its last trailing window (mean and interval: what is judged), limit, steps above it (those not
    finite among them: they count as above) and the longest run of them, then the framework's own gates;
    below, the caveats, the non-finite steps, the modes the names were read in, the known names that are not
    comparable, and what the reading left out."""
    alarm = f", alarm at step {report.alarm_step}" if report.alarm_step is not None else ""
    nonfinite = report.gating.nonfinite_steps
    title = (f"{report.path} ({report.format}, {report.steps} logged steps): {report.status.upper()}{alarm} "
             f"— {report.gating.name} gates{' (see its caveat)' if report.gating.caveat else ''}, patience "
             f"{report.patience}" + (f"; {len(nonfinite)} of its steps not finite" if nonfinite else ""))
    table = Table("statistic", "logged as", "last", "max", "last window [95%]", "limit [bracket]", "steps above",
                  "longest run", title=escape(title))
    stats = [report.gating, *report.others]
    for stat in (*stats, *report.framework_gates):
        own = not any(stat is s for s in stats)  # identity: a Statistic holds a Series
        lo, hi = stat.bracket
        label = " (gates)" if stat is report.gating else f" ({stat.framework}'s own gate)" if own else ""
        bad = len(stat.nonfinite_steps)
        table.add_row(escape(stat.name + label), escape(f"{stat.logged_as} ({stat.framework})"),
                      f"{stat.values.iloc[-1]:.4g}", f"{stat.values.max():.4g}", _last_window(stat),
                      f"{stat.limit:.4g}" + ("" if own else f" [{lo:.3g}, {hi:.3g}]"),
                      f"{len(stat.crossed_steps)}/{len(stat.values)}" + (f" ({bad} not finite)" if bad else ""),
                      str(stat.longest_run()))
    lines = [f"caveat: {s.name} ({s.logged_as}, {s.framework}): {s.caveat}" for s in stats if s.caveat]
    lines += [f"not finite: {s.logged_as} at step {', '.join(map(str, s.nonfinite_steps))} (counted as above the "
              "limit)" for s in stats if s.nonfinite_steps]
    lines += [f"read as: {s.name} ← {s.logged_as}: {s.mode}" for s in (*stats, *report.framework_gates)
              if s.mode]
    lines += [f"not comparable: {name} ({framework}): {why}"
              for name, (framework, why, _) in report.not_comparable.items()]
    if report.framework_settings:
        lines.append("framework settings: " + "; ".join(f"{k} = {v} ({where})"
                                                        for k, (v, where) in report.framework_settings.items()))
    lines += [f"note: {note}" for note in report.notes]
    if report.trend is not None:
        tr = report.trend
        meets = (f", its line meets the limit at step {tr.reaches_limit_at:.0f} (horizon {report.horizon})"
                 if tr.reaches_limit_at is not None else "")
        lines.append(f"trend of {report.gating.name} over its last {tr.points} logged steps: {tr.slope:.3g} per step "
                     f"[{tr.low:.3g}, {tr.high:.3g}]{meets}")
    lines.append(f"limits {report.thresholds_source}")
    table.caption = escape("\n".join(lines))
    return table
