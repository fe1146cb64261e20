"""The admission check: is a rollout configuration safe for OPD on this model?

`check(model, rollout=SPEC)` samples a small calibration set of responses the way the rollout engine
would (the model under `SPEC`, temperature 1), scores them teacher-forced by the model itself (one
reference pass) and by the rollout copy (one candidate pass, `mismatch.probe`), and compares the
mismatch statistics of those sampled tokens with limits:

* the fitted limits (`mismatch.admission.thresholds`, shipped in `mismatch/data/admission_thresholds.json`,
  fitted on the committed study, `experiments/study_data`, by `make thresholds`): the statistic the
  study's OPD runs measured on their first rollouts, where tolerated and not-tolerated configurations
  separated — the limit fitted on the levels of the trainer's loss (`Pipeline.trainer.loss`) where the study
  fitted one, else the one pooled over losses (`Thresholds.for_loss`);
* optionally the gates practitioners use (`mismatch.admission.gates.PRESETS`: verl, slime, NeMo RL).

Each gated statistic carries a 95% interval from a bootstrap over the calibration sequences: a gate
passes when the whole interval lies at or below its limit, fails when the whole interval lies above,
and is uncertain otherwise. Staleness and reuse cannot be seen in the checkpoint alone (no update to lag
behind yet). Given a teacher, the check measures the pipeline on the checkpoint — its format, its lag and
reuse, or a format that also lags (`mismatch.admission.lagged`: the pipeline's first OPD steps under the
user's trainer settings, the study's own step) — and judges that window statistic against the limit fitted on
every source, the trainer's loss's own where the check uses one (`Thresholds.for_loss(loss, window=True)`):
the statistic that transfers across sources decides, the first-step gate is shown beside it. Without one it
carries over the study's verdict of a lag only where the study ran the user's settings (`Pipeline.trainer`:
lr, β1, loss, TIS) near the pipeline's response length, and is uncertain otherwise.

The fitted limit rests on first-step values, and the statistic moves during training (`Thresholds.drift`:
the study's in-training peak over the first step, per source). Without a teacher the check judges the
first-step value a second time against the limit lowered by the source's drift margin (the peak ratio's median over its
largest): above it, and not rejected, the answer is uncertain.

`check(model, rollout=None, dump=FILE)` judges a real engine instead: its rollout dump (sampled
tokens with the engine's own log-probs, `mismatch.dumps`) is the calibration set, scored by the
model teacher-forced (`mismatch.dumps.score_rollouts`); no recipe and no cost (there is no spec).
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from mismatch.admission.calibration import (CalibrationSettings, calibration_prompts, response_budget,
                                            small_calibration_notes, wanted_tokens)
from mismatch.rollout.cost import measured_cost, rollout_cost
from mismatch.admission.gates import Gate, preset_gates
from mismatch.admission.decision import Decision, decide, judge, overall, resolve_gates, window_gates
from mismatch.admission.lagged import TrainerSettings, measure_lag, pipeline_rollout
from mismatch.admission.transfer import WINDOW
from mismatch.admission.recipe import search_recipe
from mismatch.admission.thresholds import Thresholds, load_thresholds
from mismatch.analysis.length import exponent_text
from mismatch.analysis.tolerance import short_text
from mismatch.dumps import score_rollouts
from mismatch.rollout.source import RolloutSource, open_source
from mismatch.errors import InputError, of_type
from mismatch.model.generate import Batch
from mismatch.model.loader import LM, parse_dtype
from mismatch.model.device import model_device
from mismatch.pairs.load import check_same_vocabulary, load_member
from mismatch.perturb import parse_spec, select
from mismatch.probes.core import probe, reference
from mismatch.rollout.spec import RolloutSpec
from mismatch.opd.precision import trainer_precision
from mismatch.defaults import DEFAULT_CLIP
from mismatch.verdict import Verdict, from_word

DEFAULT_ROLLOUT = "fp8-e4m3:block128"  # the spec checked when neither a spec nor a dump is given
NO_COPY = "none"  # the static copy of `stale:K` / `reuse:R`: the model itself
# With `offload=None` the rollout copy's originals leave memory while it runs when the model's parameters take at
# least this much: below, a second copy costs less than writing the weights out and reading them back twice.
OFFLOAD_BYTES = 1 << 30


DUMP = "dump:"  # an Admission's `rollout` when it judged an engine's dump (`dump:PATH`), not a spec


@dataclass
class Admission:
    """The check's answer. `status` is `admit`, `uncertain` or `reject`; `admitted` = admit.
    `metrics`: every statistic measured (mismatch's own names, the frameworks' names, full-vocabulary
    probe summaries under `probe/`); `violations`: the gates not passed (failed or uncertain);
    `recipe` and `cost` are filled by the recipe search and the cost model when asked for."""

    model: str
    rollout: str
    layers: str
    status: str
    metrics: dict[str, float]
    decisions: list[Decision]
    notes: list[str] = field(default_factory=list)
    calibration: dict[str, object] = field(default_factory=dict)
    recipe: dict | None = None
    cost: dict | None = None

    @property
    def admitted(self) -> bool:
        return self.status == "admit"

    @property
    def from_dump(self) -> bool:
        """Whether an engine's rollout dump was judged (`rollout` is `dump:PATH`), not a spec's copy."""
        return self.rollout.startswith(DUMP)

    @property
    def violations(self) -> list[Decision]:
        """The deciding gates not passed (failed or uncertain)."""
        return [d for d in self.decisions if d.decides and d.status != "admit"]

    def to_dict(self) -> dict:
        out = asdict(self)
        out["admitted"] = self.admitted
        out["decisions"] = [d.to_dict() for d in self.decisions]
        out["violations"] = [v.to_dict() for v in self.violations]
        return out


def _carried(source: str, level: int, verdict: Verdict, note: str, r: dict | None = None) -> tuple[Decision, str]:
    """A carried-over study verdict as a decision of its own (`study/stale:K`): the level's Δ accuracy
    (fraction) and 95% interval when the study measured it, no limit of its own; `note` says the rest."""
    acc = math.nan if r is None or r.get("acc_delta") is None else float(r["acc_delta"])
    half = math.nan if r is None or r.get("acc_delta_hw") is None else float(r["acc_delta_hw"])
    return Decision(metric=f"study/{source}:{level}", value=acc, low=acc - half, high=acc + half, limit=math.nan,
                    source="the study's verdict, carried over (Δ accuracy; notes)", verdict=verdict), note


def _lagged_decision(thresholds: Thresholds, source: str, level: int, trainer: TrainerSettings,
                     tokens: float = math.nan) -> tuple[Decision, str]:
    """The study's verdict of `source` at `level` under the user's trainer settings and near the pipeline's
    response length `tokens` (within 2× of a studied level's mean response, as the limits' own window;
    NaN, or a study row without a length: any), as (decision, note): uncertain, saying so, where the study ran
    no such level at those settings and length. Where several pairs ran it there, their decided verdicts must
    agree (an undecided one contradicts none), else uncertain; the note quotes each, and the decision's number
    is the decided level's nearest in length (then the most seeds): the same whatever the rows' order."""
    rows = [r for r in thresholds.lagged if r["source"] == source]
    if not rows:
        return _carried(source, level, Verdict.UNCERTAIN,
                        f"{source}:{level}: the thresholds' study measured no {source} levels")
    wanted = _settings_words(trainer)
    match = [r for r in rows if float(r["level"]) == float(level) and wanted <= _words(r["settings"])]
    if not match:
        studied = sorted({r["settings"] for r in rows if float(r["level"]) == float(level)})
        return _carried(source, level, Verdict.UNCERTAIN,
                        f"{source}:{level}: no study covers {trainer.describe()} (studied at this level: "
                        f"{'; '.join(studied) or 'none'}); give --teacher to measure it on this checkpoint")
    near = [r for r in match if math.isnan(tokens) or math.isnan(_row_tokens(r)) or _within(tokens, (_row_tokens(r),) * 2)]
    if not near:
        lengths = ", ".join(sorted({f"{_row_tokens(r):.0f}" for r in match}, key=float))
        return _carried(source, level, Verdict.UNCERTAIN,
                        f"{source}:{level}: no study covers {trainer.describe()} near {tokens:.0f}-token responses "
                        f"(studied at {lengths} tokens at these settings; how a lag's tolerance moves with response "
                        f"length was not measured); give --teacher to measure it on this checkpoint")
    decided = {r["verdict"] for r in near if r["verdict"] != "uncertain"}
    studies = "; ".join(_study_line(r) for r in near)
    if len(decided) != 1:
        why = ("the studies at the same settings disagree" if decided else
               "the study at the same settings is undecided" if len(near) == 1 else
               "the studies at the same settings are all undecided")
        return _carried(source, level, Verdict.UNCERTAIN, f"{source}:{level} not measured on this checkpoint (no "
                        f"--teacher); {why}: {studies}; give --teacher to measure it on this checkpoint")
    r = min((r for r in near if r["verdict"] in decided),
            key=lambda r: (0.0 if math.isnan(tokens) or math.isnan(_row_tokens(r)) else
                           abs(math.log(_row_tokens(r) / tokens)), -int(r["seeds"]), r["pair"]))
    note = (f"{source}:{level} not measured on this checkpoint (no --teacher); carried over from the "
            f"stud{'ies' if len(near) > 1 else 'y'} at the same settings: {studies}")
    return _carried(source, level, from_word(r["verdict"]), note, r)  # the study's word, stored in the thresholds


def _row_tokens(r: dict) -> float:
    """A studied level's mean response length (tokens); NaN where the row has none (older, hand-made thresholds)."""
    value = r.get("response_tokens")
    return math.nan if value is None else float(value)


def _study_line(r: dict) -> str:
    """One studied level as the check's note quotes it: pair, settings, its numbers and verdict."""
    acc = "" if r["acc_delta"] is None or math.isnan(r["acc_delta"]) else (
        f"Δ accuracy {100 * r['acc_delta']:+.1f} ± {100 * r['acc_delta_hw']:.1f} pts, ")
    length = "" if math.isnan(_row_tokens(r)) else f" ({_row_tokens(r):.0f}-token responses)"
    return (f"{r['pair']}, {r['settings']}{length}: {acc}KL ratio {r['kl_ratio']:.3f} ± {r['kl_ratio_hw']:.3f} over "
            f"{r['seeds']} seeds → {r['verdict']}")


def _words(settings: str) -> set[str]:
    """A level's settings text (`loss full-rkl, lr 0.001, …`) as its `name value` items."""
    return {part.strip() for part in settings.split(",")}


def _settings_words(trainer: TrainerSettings) -> set[str]:
    """The trainer settings as the study's settings text writes them (`mismatch.analysis.tolerance.short_text`)."""
    return _words(trainer.describe())


def _measured_window(lm: LM, name: str, teacher: str | LM, thresholds: Thresholds, static: str, layers: str,
                     pipeline: Pipeline, cal, sample: dict, say: Callable[[str], None]) -> tuple[Decision, str]:
    """The pipeline — its rollout copy `static` (`NO_COPY`: the model itself) on `layers`, lagging by its
    staleness / reuse — measured on the checkpoint by its window statistic (`measure_lag`), judged against
    the window limit of the thresholds' primary statistic: the check's deciding gate when a teacher is given."""
    _, teacher_lm = _loaded(teacher, sample["seed"], next(lm.model.parameters()).dtype,  # beside the checkpoint,
                            device=model_device(lm.model))                               # in its precision
    check_same_vocabulary(lm, teacher_lm, f"{name} and its teacher")
    K, R = pipeline.staleness, pipeline.reuse
    label = "+".join(p for p in (static if static != NO_COPY else "", f"stale:{K}" if K else "",
                                 f"reuse:{R}" if R > 1 else "") if p)
    say(f"measuring {label} on {name}: {K + WINDOW} OPD steps against {teacher_lm.name}")
    lag = measure_lag(lm, teacher_lm, cal.texts, staleness=K, reuse=R, settings=pipeline.trainer, chat=sample["chat"],
                      context=sample["context"], max_new_tokens=sample["max_new_tokens"], seed=sample["seed"],
                      rollout=static, layers=layers)
    primary = thresholds.primary
    value, low, high = lag.statistics[primary]
    gate = next(iter(window_gates(thresholds, pipeline.trainer.loss)), None)
    if gate is not None:
        limit, source, verdict, missing = gate.limit, gate.source, decide(value, low, high, gate.limit), ""
    else:
        limit, source, verdict = math.nan, f"no window limit ({thresholds.fitted_on})", Verdict.UNCERTAIN
        missing = "; the thresholds hold no window limit: uncertain"
    decision = Decision(metric=f"measured/{label}/window:{primary}", value=value, low=low, high=high, limit=limit,
                        source=source, verdict=verdict)
    first, last = lag.window
    note = (f"{label} measured on this checkpoint: {lag.steps} OPD steps against {teacher_lm.name} at "
            f"{pipeline.trainer.describe()} (constant rate), {primary} averaged over steps {first}–{last}: "
            f"{value:.4g} [{low:.4g}, {high:.4g}]{missing}")
    if static != NO_COPY:
        note += ("; the window statistic decides (it transfers across sources, reports/admission_transfer.md): "
                 "the first-step gate is shown, not deciding, and the window's steps already hold the early drift")
    return decision, note


@dataclass(frozen=True)
class Pipeline:
    """The intended pipeline's lag and reuse: K ≥ 0 optimizer steps of staleness, R ≥ 1 steps per rollout
    batch, and the trainer settings a lag depends on (measured with a teacher, else matched to the study)."""

    staleness: int = 0
    reuse: int = 1
    trainer: TrainerSettings = TrainerSettings()
    response_tokens: float | None = None  # the pipeline's mean response length (tokens); None: the calibration's

    def __post_init__(self) -> None:
        if self.staleness < 0 or self.reuse < 1:
            raise InputError(f"need staleness ≥ 0 and reuse ≥ 1, got {self.staleness}, {self.reuse}")
        if self.response_tokens is not None and not self.response_tokens >= 1:
            raise InputError(f"response_tokens must be ≥ 1, got {self.response_tokens}")

    @property
    def lags(self) -> bool:
        """The rollouts lag the trained weights (staleness or reuse)."""
        return self.staleness > 0 or self.reuse > 1


def check(model: str | LM, rollout: str | None = None, *, layers: str = "linear",
          calibration: CalibrationSettings = CalibrationSettings(), pipeline: Pipeline = Pipeline(),
          thresholds: Thresholds | str | Path | dict[str, float] | None = None, presets: tuple[str, ...] = (),
          seed: int = 0, clip: float = DEFAULT_CLIP, recipe: bool | None = None, dump: str | Path | None = None,
          teacher: str | LM | None = None, ref_dtype: str = "fp32", device: str = "cpu",
          offload: bool | None = None, progress: Callable[[str], None] | None = None) -> Admission:
    """Check whether rollouts from `model` under `rollout` are safe for OPD on `model`.

    Args:
        model: anything `mismatch.load` takes (a local checkpoint, a built-in, `PAIR:student`), or an LM.
        rollout: the rollout copy in OPD's grammar (`mismatch.rollout.spec`): a perturbation spec
            (`fp8-e4m3:block128`, `int4:group128`, `bnb-nf4`, …), or `stale:K` / `reuse:R` (the model itself,
            lagged: the pipeline's lag, so not given in `pipeline` too); a perturbation with a lag takes the lag
            from `pipeline`. None: `DEFAULT_ROLLOUT`, unless `dump` is given.
        layers: the spec's layer scope (`linear`, `attn`, index ranges, a regex; `mismatch.perturb`).
        calibration: which prompts, how many, how many new tokens, chat or not (`CalibrationSettings`).
        pipeline: the intended pipeline's staleness K, reuse R and trainer settings.
        thresholds: fitted limits (a `Thresholds`, a thresholds JSON file, or `{metric: limit}`);
            default: the shipped ones.
        presets: practitioners' gates to apply too (`verl`, `slime`, `nemo-rl`).
        seed: sampling and bootstrap seed (same seed, same answer).
        clip: importance ratios outside [1/clip, clip] are counted.
        recipe: True: search a mixed-precision recipe (`mismatch.admission.recipe`) whatever the answer;
            None (default): search one when the first (fitted) gate rejects, against that gate; False: never
            (the search probes every block alone: minutes on a real checkpoint).
        dump: instead of a spec, an engine's rollout dump (`mismatch.dumps`: sampled responses with
            the engine's own log-probs), scored by `model` teacher-forced; giving `rollout` too is an error.
            The calibration set is the dump; no recipe (there is no spec to keep layers out of).
        teacher: the OPD teacher (a model spec or an LM): with it the pipeline — the rollout spec, its lag and
            reuse — is measured on `model` by its first OPD steps (`mismatch.admission.lagged`) and that window
            statistic decides (the first-step gate is kept, not deciding); without it a lag or reuse is carried
            over from the study where its settings and response length match.
        ref_dtype: the precision `model` is loaded in — the trainer's (`fp32`, `bf16` for a checkpoint that
            trains in bf16, `fp16`): the reference pass and the rollout copy (the format applied to those
            weights) both run in it; the statistics are accumulated in float64 whatever it is. Ignored for
            an `LM`, used as it is. A lag is measured in fp32 only (it trains the checkpoint).
        device: where `model` (and the teacher) is loaded: `"cpu"` (default), `"cuda[:N]"` or `"auto"`
            (`mismatch.model.device.resolve_device`); an `LM` stays where it is.
        offload: while the rollout copy runs, keep the weights it replaced out of memory (on an accelerator:
            in host memory; on the CPU: in a temporary file, under `TMPDIR`), so the model holds one copy of its
            weights, not two; None (default): when its parameters take at least `OFFLOAD_BYTES` (1 GiB).
        progress: `progress(message)` as each stage starts (loading, sampling, scoring, the recipe's
            search): the CLI prints them on stderr.

    Returns:
        An `Admission`.
    """
    say = progress or (lambda _message: None)
    of_type(model, (str, os.PathLike, LM), "model")
    of_type(rollout, (str, type(None)), "rollout")
    of_type(layers, str, "layers")
    of_type(dump, (str, os.PathLike, type(None)), "dump")
    of_type(recipe, (bool, type(None)), "recipe")
    if dump is not None:
        if rollout is not None:  # an explicit spec is never dropped in favour of the dump
            raise InputError("give either a rollout spec or a rollout dump, not both")
        return _check_dump(model, dump, thresholds, seed=seed, pipeline=pipeline, presets=presets, clip=clip,
                           recipe=recipe, say=say, ref_dtype=ref_dtype, device=device)
    spec, pipeline = _rollout_spec(DEFAULT_ROLLOUT if rollout is None else rollout, pipeline)
    windowed = teacher is not None and (pipeline.lags or spec is not None)  # the window statistic is measured
    static = NO_COPY if spec is None else str(spec)  # what the check samples with and scores
    if windowed:  # what cannot be measured is refused before the checkpoint is loaded
        trainer_precision(ref_dtype)  # it is measured by training the checkpoint
        pipeline_rollout(static, pipeline.staleness, pipeline.reuse)
    say(f"loading {model if isinstance(model, str) else model.name}")
    name, lm = _loaded(model, seed, ref_dtype, device)
    select(lm.model, layers)  # fail fast on a bad scope
    cal = calibration_prompts(name, calibration.prompts, calibration.max_prompts, seed)
    use_chat = calibration.chat if calibration.chat is not None else cal.chat if cal.chat is not None else bool(
        getattr(lm.tokenizer, "chat_template", None))
    new_tokens = response_budget(lm, cal, use_chat, wanted_tokens(calibration.max_new_tokens, cal))
    table, fitted_gates, named = _thresholds_and_gates(thresholds, presets, pipeline.trainer.loss)
    gates = fitted_gates + named
    fitted = not isinstance(thresholds, dict)  # the first gate is the table's fitted limit
    if offload is None:
        offload = sum(p.nbytes for p in lm.model.parameters()) >= OFFLOAD_BYTES
    sample = dict(chat=use_chat, context=cal.context if use_chat else (), max_new_tokens=new_tokens, seed=seed,
                  clip=clip, offload=offload)
    say(f"sampling {len(cal.texts)} calibration responses (≤ {new_tokens} tokens) under {static} [{layers}], scoring them")
    metrics, decisions, batch = measure(lm, static, layers, cal.texts, gates, **sample)
    used = {"prompts": cal.source, "n_prompts": len(cal.texts), **_sampled(batch), "max_new_tokens": new_tokens,
            "temperature": 1.0, "chat": use_chat, "seed": seed, "sampled_by": f"{name} under {static} [{layers}]",
            "ref_dtype": str(next(lm.model.parameters()).dtype).removeprefix("torch.")}
    assumed = _pipeline_tokens(pipeline, used["tokens"], used["sequences"], "calibration responses'")
    if windowed:  # the window statistic decides; the first-step gates the thresholds fitted are shown beside it
        window = _measured_window(lm, name, teacher, table, static, layers, pipeline, cal, sample, say)
        decisions = [replace(d, decides=False) if i < len(fitted_gates) and spec is not None else d
                     for i, d in enumerate(decisions)]
        primary, lagged, drift = window[0], [window], (None, "")
    else:
        primary, lagged = decisions[0], _lagged(table, pipeline, assumed[0])
        drift = _drift_margin(table, primary, RolloutSpec.parse(static).source) if fitted and spec else (None, "")
    length = (_length_margin(table, primary, assumed, pipeline.trainer, window=windowed) if fitted
              else (None, ""))
    decisions += [d for d, _ in (drift, length, *lagged) if d is not None]  # each decides like a gate, and says so
    admission = Admission(model=name, rollout=static, layers=layers,
                          status=overall(decisions), metrics=metrics, decisions=decisions,
                          notes=[*small_calibration_notes(used["sequences"]),
                                 *(n for _, n in (drift, length, *lagged) if n)],
                          calibration=used)
    # asked for, or the deciding gate failed; never for the model itself (nothing to keep out of a perturbation)
    searched = spec is not None and (recipe if recipe is not None else primary.status == "reject")
    if recipe is False and primary.status == "reject":
        admission.notes.append("no recipe searched (recipe=False, `--no-recipe`)")
    kept = _recipe(admission, lm, batch, gates, cal.texts, sample, say) if searched else []
    admission.cost = _cost(lm, static, layers, kept, cal.texts, pipeline=pipeline, seed=seed)
    return admission


def _drift_margin(table: Thresholds, fitted: Decision, source: str) -> tuple[Decision | None, str]:
    """The fitted gate again with its limit lowered by the drift margin of `source` (`Thresholds.drift`):
    the limit rests on first-step values whose levels drifted during training as the study's median level
    did; a run that drifts as much as its worst reaches the fitted limit from `limit × margin`. Between the
    two the check is uncertain (never a reject of its own: rejecting is the fitted gate's); none, with a
    note, where the study measured no drift for the source (no note for thresholds holding no drift), and none
    where the fitted gate does not admit (a lower limit cannot change a reject or an uncertain)."""
    if not table.drift or fitted.status != "admit":  # no drift measured (older or hand-made thresholds), or moot
        return None, ""
    entry = table.drift.get(source)
    if entry is None or not entry.get("levels"):
        return None, f"no drift margin: the thresholds' study measured no {source} level's drift"
    margin = float(entry["margin"])
    limit = fitted.limit * margin
    passes = decide(fitted.value, fitted.low, fitted.high, limit) is Verdict.PASS
    verdict = Verdict.PASS if passes else Verdict.UNCERTAIN  # a lower limit never rejects of its own
    decision = Decision(metric=f"drift/{fitted.metric}", value=fitted.value, low=fitted.low, high=fitted.high,
                        limit=limit, source=f"the fitted limit × the {source} drift margin {margin:.3g}", verdict=verdict)
    note = (f"drift margin: in the study's {entry['levels']} {source} levels the in-training peak of {fitted.metric} "
            f"over its first-step value had median {entry['median']:.3g} and largest {entry['largest']:.3g}; the "
            f"fitted limit {fitted.limit:.4g} absorbed the median drift, so a run drifting as the worst did meets it "
            f"from {limit:.4g} (× {margin:.3g}): "
            + ("below that, admitted with the margin" if verdict is Verdict.PASS else
               "above that, uncertain (watch the run with `mismatch monitor`)"))
    return decision, note


ASSUMED_EXPONENT = -1.0  # without a measured length law: the tolerated mismatch per sequence (T × per token) is constant


def _pipeline_tokens(pipeline: Pipeline, tokens: int, sequences: int, sampled: str) -> tuple[float, str]:
    """The response length the decision assumes (tokens) and where it comes from: the pipeline's, else the mean
    of what was `sampled` (`tokens` over `sequences`; NaN without a response)."""
    if pipeline.response_tokens is not None:
        return float(pipeline.response_tokens), "the pipeline's (response_tokens)"
    return (tokens / sequences if sequences and tokens else math.nan), f"the {sampled} mean"


def _within(tokens: float, fitted: tuple[float, float]) -> bool:
    """Whether a response length lies within 2× of the lengths the limits were fitted at."""
    return fitted[0] / 2 <= tokens <= 2 * fitted[1]


def length_factor(tokens: float, fitted: tuple[float, float], law: dict) -> tuple[float, float]:
    """How much the fitted per-token limit is scaled at a response length of `tokens`, and the exponent used.

    The limits hold, per token, within 2× of the lengths they were fitted at (`fitted`: the decided levels'
    shortest and longest mean response). Beyond, the limit follows `limit · (T / T_edge)^b` from the nearer edge
    of that window, with the exponent the length law allows that gives the lower limit (`law`'s `b_low` for
    longer responses, `b_high` for shorter: `Thresholds.length_law_for`, the study's ladders), or, without a measured
    law, `ASSUMED_EXPONENT` (per sequence) for longer responses and no change for shorter ones. An exponent the
    law leaves open (±∞) gives 0: no limit can be carried there.
    """
    low, high = fitted
    if math.isnan(tokens) or _within(tokens, fitted):
        return 1.0, 0.0
    longer = tokens > 2 * high
    edge = 2 * high if longer else low / 2
    if law:
        b = law["b_low"] if longer else law["b_high"]
        if b is None or not math.isfinite(b):  # left open by the brackets (JSON null)
            return 0.0, -math.inf if longer else math.inf
    else:
        b = ASSUMED_EXPONENT if longer else 0.0
    return (tokens / edge) ** float(b), float(b)


def _length_margin(table: Thresholds, fitted: Decision, assumed: tuple[float, str], trainer: TrainerSettings, *,
                   window: bool = False) -> tuple[Decision | None, str]:
    """The fitted gate at the pipeline's response length (`length_factor`): where that length lies outside the
    window of lengths the trainer's loss's limit was fitted at (`Thresholds.for_loss`: the first-step limit's,
    or with `window` the window limit's), the gate again with the limit scaled by the length law of the
    trainer's loss (`Thresholds.length_law_for`) — admit below it, else uncertain (never a reject of its own:
    rejecting is the fitted gate's). The note always says which length was assumed, and which ladders' law — and
    that the law is carried over where its ladders ran with another TIS cap than the `trainer`'s."""
    tokens, origin = assumed
    fitted_at = table.for_loss(trainer.loss, window=window)[2]
    if len(fitted_at) != 2 or math.isnan(tokens):
        return None, ""
    low, high = fitted_at
    measured, ladders = table.length_law_for(trainer.loss)
    factor, b = length_factor(tokens, (low, high), measured)
    where = f"response length: {tokens:.0f} tokens, {origin}; the limits were fitted at {low:.0f}–{high:.0f} tokens"
    if _within(tokens, (low, high)):
        return None, f"{where} (within 2x: per token as fitted)"
    caps, tis = (measured or {}).get("tis_caps") or [], short_text(trainer.tis_cap)  # as the ladders' settings write it
    carried = (f"; they ran with tis_cap {', '.join(caps)}, this trainer's is {tis}: carried over, not measured"
               if caps and tis not in caps else "")
    law = (f"the study's length law from {ladders} (exponent b in [{exponent_text(measured['b_low'], -1)}, "
           f"{exponent_text(measured['b_high'], 1)}], b = {exponent_text(b, 1 if b > 0 else -1)} taken{carried})"
           if measured else
           f"no length law measured yet: assumed per sequence (b = {b:+.0f})" if b else
           "no length law measured yet: shorter responses keep the limit")
    if fitted.status != "admit" or factor >= 1.0:  # a lower limit cannot change a reject or an uncertain,
        return None, f"{where}; {law}"                # nor a higher one an admit
    limit = fitted.limit * factor
    passes = decide(fitted.value, fitted.low, fitted.high, limit) is Verdict.PASS
    verdict = Verdict.PASS if passes else Verdict.UNCERTAIN  # a lower limit never rejects of its own
    decision = Decision(metric=f"length/{fitted.metric}", value=fitted.value, low=fitted.low, high=fitted.high,
                        limit=limit, source=f"the fitted limit × {factor:.3g} at {tokens:.0f} tokens ({law})",
                        verdict=verdict)
    return decision, (f"{where}; {law}: the limit at that length is {limit:.4g} (× {factor:.3g}): "
                      + ("below it, admitted" if verdict is Verdict.PASS else "not clearly below it, uncertain"))


def _sampled(batch) -> dict[str, int]:
    """How much the calibration batch holds: sequences with a response, and response tokens."""
    return {"sequences": int(batch.response_mask.any(1).sum()), "tokens": batch.response_tokens}


def _rollout_spec(rollout: str, pipeline: Pipeline) -> tuple[object | None, Pipeline]:
    """The static copy's perturbation config (None: the model itself) and the pipeline, from a rollout string in
    OPD's grammar (`mismatch.rollout.spec`): a perturbation spec, or `stale:K` / `reuse:R` — the model itself,
    lagged, which is the pipeline's lag (given here or as `staleness` / `reuse`, not both)."""
    parsed = RolloutSpec.parse(rollout)
    if parsed.resample or parsed.engine is not None:
        raise InputError(f"{rollout}: the check takes a perturbation spec, stale:K or reuse:R (an engine's rollouts: "
                         "its dump, --dump)")
    if parsed.staleness or parsed.reuse > 1:
        if pipeline.lags:
            raise InputError(f"{rollout}: give the lag once, in the rollout spec or as staleness / reuse")
        pipeline = replace(pipeline, staleness=parsed.staleness, reuse=parsed.reuse)
    return (None if parsed.perturbation is None else parse_spec(rollout)), pipeline


def _loaded(model: str | LM, seed: int, dtype: str | torch.dtype = "fp32", device: str | torch.device = "cpu") -> tuple[str, LM]:
    """The model's name and the model (a spec loaded in `dtype` on `device`; an LM as it is)."""
    return (model.name, model) if isinstance(model, LM) else (model, load_member(model, seed=seed, device=device,
                                                                                   dtype=parse_dtype(dtype)))


def _thresholds_and_gates(thresholds, presets: tuple[str, ...], loss: str) -> tuple[Thresholds, list[Gate], list[Gate]]:
    """The resolved thresholds table (the fitted gate's and the lagged verdicts'), its gates (the fitted one for
    the trainer's `loss`, or the limits given) and the practitioners' gates named by `presets` — applied in that
    order."""
    table = thresholds if isinstance(thresholds, Thresholds) else (
        load_thresholds(thresholds if isinstance(thresholds, (str, Path)) else None))
    return table, resolve_gates(thresholds, table, loss), list(preset_gates(tuple(presets)))


def _lagged(table: Thresholds, pipeline: Pipeline, tokens: float) -> list[tuple[Decision, str]]:
    """The study's carried-over verdicts of the pipeline's lag and reuse (none for K = 0, R = 1) at a response
    length of `tokens` (the decision's assumed length)."""
    return [_lagged_decision(table, source, level, pipeline.trainer, tokens) for source, level, off in
            (("stale", pipeline.staleness, 0), ("reuse", pipeline.reuse, 1)) if level != off]


def _check_dump(model: str | LM, dump: str | Path, thresholds, *, seed: int, pipeline: Pipeline,
                presets: tuple[str, ...], clip: float, recipe: bool | None, say: Callable[[str], None],
                ref_dtype: str = "fp32", device: str = "cpu") -> Admission:
    """`check` on an engine's rollout dump: its tokens and log-probs are the calibration set."""
    say(f"loading {model if isinstance(model, str) else model.name}")
    name, lm = _loaded(model, seed, ref_dtype, device)
    table, fitted_gates, named = _thresholds_and_gates(thresholds, presets, pipeline.trainer.loss)
    gates = fitted_gates + named
    say(f"scoring the rollouts of {dump}")
    scored = score_rollouts(lm, dump, clip=clip)
    tok = scored.per_token
    metrics, decisions = judge(torch.tensor(tok["logp_ref"].to_numpy()), torch.tensor(tok["logp_cand"].to_numpy()),
                               torch.tensor(tok["seq"].to_numpy()), gates, clip=clip, seed=seed)
    metrics.update({f"probe/{k}": v for k, v in scored.summary.items() if k.endswith("_topk_mean")})
    dumped = _pipeline_tokens(pipeline, len(tok), int(scored.summary["sequences"]), "dump's")
    lagged = _lagged(table, pipeline, dumped[0])
    fitted = not isinstance(thresholds, dict)
    drift = _drift_margin(table, decisions[0], "engine") if fitted else (None, "")
    length = _length_margin(table, decisions[0], dumped, pipeline.trainer) if fitted else (None, "")
    decisions = [*decisions, *(d for d, _ in (drift, length, *lagged) if d is not None)]
    notes = [*scored.notes, *small_calibration_notes(int(scored.summary["sequences"])),
             *(n for _, n in (drift, length, *lagged) if n)]
    if recipe:
        notes.append("no recipe: the rollouts come from an engine, not from a spec whose layers could be kept out")
    calibration = {"prompts": str(dump), "sequences": int(scored.summary["sequences"]),
                   "tokens": int(scored.summary["tokens"]), "sampled_by": scored.candidate, "seed": seed}
    return Admission(model=name, rollout=f"{DUMP}{dump}", layers="", metrics=metrics, decisions=decisions,
                     status=overall(decisions), notes=notes, calibration=calibration)


def _cost(lm: LM, spec, layers: str, kept: list[str], texts: list[str], *, pipeline: Pipeline,
          seed: int) -> dict | None:
    """The analytic cost of the rollout configuration, with measured speeds where CUDA and the
    format's own kernels are present."""
    cost = rollout_cost(lm.model, str(spec), layers, kept=kept, staleness=pipeline.staleness,
                        reuse=pipeline.reuse).to_dict()
    measured = measured_cost(lm, str(spec), texts, layers=layers, seed=seed)
    if measured is not None:
        cost["measured"] = measured
    return cost


def _recipe(admission: Admission, lm: LM, batch: Batch, gates: list[Gate], texts: list[str], sample: dict,
            say: Callable[[str], None]) -> list[str]:
    """Search a recipe for `admission` against its first gate (the fitted one: a preset's gate may
    be out of any recipe's reach); store it, with a note; return the modules it keeps."""
    def verify(scope: str) -> tuple[str, float]:
        _, checked, _ = measure(lm, admission.rollout, scope, texts, gates[:1], **sample)
        return checked[0].status, checked[0].value

    first = admission.decisions[0]
    found = search_recipe(lm, admission.rollout, batch, admission.layers, gates[0].limit, verify,
                          seed=sample["seed"], baseline=(first.status, first.value), progress=say)
    admission.recipe = found.to_dict()
    admission.notes.append(f"recipe: keep {len(found.kept)} modules ({100 * found.kept_fraction:.1f}% of the "
                           f"linear weights) in high precision → {found.verified_status} "
                           f"({gates[0].metric} {found.verified_value:.4g})"
                           + ("" if math.isnan(found.bits_per_weight) else f", {found.bits_per_weight:.2f} bits/weight"))
    return found.kept


def measure(lm: LM, spec: str, layers: str, texts: list[str], gates: list[Gate], *, chat: bool,
            context: tuple[tuple[str, str], ...], max_new_tokens: int, seed: int, clip: float,
            offload: bool = False) -> tuple[dict[str, float], list[Decision], Batch]:
    """Sample the calibration responses with `lm` under `spec` on `layers`, score them by `lm`
    (reference pass) and by the rollout copy (candidate pass), and apply `gates`; with `offload` the rollout
    copy's originals leave memory while it runs (`mismatch.perturb.perturb_`). `spec` `none` (`NO_COPY`): the
    copy is `lm` itself — a lagged or reused copy before its first update — and every statistic is 0.

    Returns:
        `(metrics, decisions, batch)`: every statistic, one `Decision` per gate, the sampled batch.
    """
    def copy():  # the rollout copy for one block: `lm` under `spec`, or `lm` itself
        if spec == NO_COPY:
            return contextlib.nullcontext(RolloutSource(lm, lm.tokenizer))
        return open_source(lm, spec, layers, seed=seed, offload=offload)

    with copy() as source:  # sampled as the rollout copy would
        batch = source.generate(texts, max_new_tokens=max_new_tokens, chat=chat, context=context, seed=seed)
    ref = reference(lm, batch, per_layer=False)
    with copy() as source:
        result = probe(ref, source.candidate, per_layer=False, clip=clip)
    tok = result.per_token
    metrics, decisions = judge(torch.tensor(tok["logp_ref"].to_numpy()), torch.tensor(tok["logp_cand"].to_numpy()),
                               torch.tensor(tok["seq"].to_numpy()), gates, clip=clip, seed=seed)
    metrics.update({f"probe/{k}": result.summary[k] for k in ("kl_fwd_mean", "kl_rev_mean", "tv_mean", "top1_agree")})
    return metrics, decisions, batch


