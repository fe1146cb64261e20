"""On-policy distillation in TRL with rollouts from a mismatched copy: `MismatchDistillationTrainer`.

`trl.DistillationTrainer` trains a student on its own samples to match a teacher. This subclass lets a
*rollout copy* sample instead — the student under a perturbation spec (`fp8-e4m3:channel`,
`int4:group128`, `noise:0.1`, …, on a layer scope), a recipe the admission check produced (its kept
modules stay in full precision), or the student exported to llama.cpp (`engine:llama.cpp,…`, where the
`engines` extra is built) — the way a cheaper inference engine would serve a real run. Everything else is
TRL's own: its sampler (`generate` with its `GenerationConfig`), its prompts, its loss, its schedule — but
for the positions of its training forward, which by default are those the samples were generated at
(`fix_positions`: TRL 1.16 trains left-padded rows of absolute-position models at shifted positions).

* The copy follows the student: before each generation batch whose optimizer step has moved on, it is
  rebuilt from the current weights (re-quantized, re-noised, or re-exported), so the mismatch is the
  rollout engine's, not staleness.
* Every generation batch's mismatch is measured on its own rollout tokens: the student's log-prob of each
  sampled token (a teacher-forced pass at the current weights, eval mode, no gradient) against the
  copy's (its teacher-forced pass in PyTorch, or the engine's own log-prob). Every statistic the check
  computes is logged, under the toolkit's names and the frameworks' (`mismatch.admission.judge.statistics`:
  `mismatch_kl`, verl's `rollout_corr/…`, slime's `train/train_rollout_logprob_abs_diff`, NeMo RL's
  `train/token_mult_prob_error`, …), so they land in `trainer.state.log_history` and whatever TRL
  reports to. With `rollout=None` the rollout policy is the student: every mismatch statistic is exactly
  its no-mismatch value (0; 1 for the ratio-type `train/token_mult_prob_error` and ESS).
* The admission gates (`mismatch.admission.judge`: the shipped fitted limit, or `thresholds`) judge the
  first batch, then every `gate_every` optimizer steps the tokens of the last `gate_every` batches. A
  reject is a violation: `on_violation="warn"` logs one warning line (statistic, interval, limit);
  `"stop"` ends training after that step with a checkpoint saved.

The copy is prepared by accelerate as TRL prepares its teacher, so its forward runs in the trainer's mixed
precision as the student's does (TRL's default `bf16=True` autocasts, on CPU too): an unperturbed copy
scores exactly as the student.
Sampling settings the statistics do not model (top-k, min-p, a repetition penalty) are warned about once:
the statistics are of the temperature / top-p warped distributions, as `check` calibrates them.
"""

from __future__ import annotations

import inspect
import logging
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from accelerate.utils import is_peft_model
from transformers import TrainerCallback
from trl import DistillationTrainer

from mismatch.admission.judge import Decision, judge, resolve_gates, statistics
from mismatch.admission.thresholds import Thresholds, load_thresholds
from mismatch.errors import InputError
from mismatch.model.generate import Batch, sequence_logprobs
from mismatch.model.positions import position_ids
from mismatch.opd.ring import RolloutCopy
from mismatch.opd.trainer import rollout_seed
from mismatch.rollout_spec import RolloutSpec

log = logging.getLogger("mismatch")
ON_VIOLATION = ("warn", "stop")
STATUS_CODE = {"admit": 1.0, "uncertain": 0.0, "reject": -1.0}  # `admission/status` in the logs


@dataclass(frozen=True)
class GateRecord:
    """One judgement of the gates: the optimizer step it ran at, the tokens and sequences it judged (the
    last `gate_every` batches'), and one `Decision` per gate."""

    step: int
    tokens: int
    sequences: int
    decisions: tuple[Decision, ...]

    @property
    def violations(self) -> list[Decision]:
        return [d for d in self.decisions if d.status == "reject"]


def rollout_of(rollout, layers: str) -> tuple[str | None, str]:
    """`(spec, layers)` of the copy: a rollout string with `layers` its scope, or a recipe (a
    `mismatch.admission.recipe.Recipe` or its dict, as `check` writes it) with its own scope; a recipe that
    keeps every module gives `None` (the student samples)."""
    if rollout is None or isinstance(rollout, str):
        spec = None if rollout is None else rollout
    else:
        fields = rollout if isinstance(rollout, dict) else getattr(rollout, "__dict__", {})
        if "spec" not in fields or "layers" not in fields:
            raise InputError(f"rollout must be a spec string, a recipe or None, got {type(rollout).__name__}")
        if fields["layers"] is None:
            return None, layers
        spec, layers = fields["spec"], fields["layers"]
    parsed = RolloutSpec.parse(spec)
    if parsed.staleness or parsed.reuse != 1 or parsed.resample:
        raise InputError(f"{spec}: this trainer's rollouts are fresh every step; staleness, reuse and resampling "
                         "are mismatch's own OPD loop (`mismatch opd`)")
    if parsed.is_clean:
        return None, layers
    if parsed.perturbation is not None and ":a8" in str(parsed.perturbation):
        raise InputError(f"{spec}: static activation scales need a calibration batch, which this trainer does not take")
    return spec, layers


@contextmanager
def _eval_mode(model: torch.nn.Module):
    """`model` in eval mode (no dropout) for the block, its mode restored after."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


class _GateStop(TrainerCallback):
    """Ends training after an optimizer step whose gates found a violation (`on_violation="stop"`), saving
    a checkpoint: `should_save` is honoured by the step's own save, then the loop stops."""

    def __init__(self, trainer: MismatchDistillationTrainer) -> None:
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kwargs):
        if self.trainer.stop_requested:
            control.should_save = True
            control.should_training_stop = True
        return control


class MismatchDistillationTrainer(DistillationTrainer):
    """`trl.DistillationTrainer` whose on-policy generations come from a rollout copy of the student.

    Takes every argument of `trl.DistillationTrainer` (its student `model`, `teacher_model`, `args`,
    datasets, …) and:

    Args:
        rollout: what samples — a perturbation spec (`mismatch.perturb.parse_spec`), a recipe from
            `mismatch check` (`Recipe` or its dict: its `spec` on its `layers`), `engine:llama.cpp[,…]`,
            or None (the trainer's own behaviour: the student samples).
        layers: the spec's layer scope (`mismatch.perturb.select`), default every linear layer but the head.
        thresholds: the gates — None: the shipped fitted limit; a thresholds file or `Thresholds`; or
            `{statistic: limit}` of any names `statistics` gives.
        gate_every: judge the gates on the last `gate_every` batches' tokens every `gate_every` optimizer
            steps (and on the first batch).
        on_violation: `"warn"` (log a warning line) or `"stop"` (end training after the step, checkpoint saved).
        clip: the importance-ratio bound of `mismatch_is_ratio_outside_frac` (r outside [1/clip, clip]).
        fix_positions: train on the positions the samples were generated at. TRL 1.16's training forward
            passes no `position_ids`, so a model that then counts positions from the row's start (learned
            absolute position embeddings: GPT-2, OPT) trains every left-padded row at positions shifted by its
            padding (huggingface/trl#6800 reports the same omission in Online DPO); with True (the default) the
            student's and the teacher's training forwards get `position_ids` counted from each row's first
            attended token, as `generate` counts them — for rotary models a no-op. False: TRL's own forward.

    Attributes:
        rollout_copy: the `mismatch.opd.ring.RolloutCopy` that samples (None with `rollout=None`).
        gate_records: every `GateRecord`, in order.
        last_rollout: the latest generation batch as a `mismatch.model.generate.Batch` (prompt and
            completion tokens, left-padded prompts) with `(logp_train_N, logp_rollout_N)` of its completion
            tokens — what the logged statistics were computed from.
    """

    def __init__(self, *args, rollout=None, layers: str = "linear", thresholds=None, gate_every: int = 10,
                 on_violation: str = "warn", clip: float = 2.0, fix_positions: bool = True, **kwargs) -> None:
        if on_violation not in ON_VIOLATION:
            raise InputError(f"on_violation must be one of {', '.join(ON_VIOLATION)}, got {on_violation!r}")
        if gate_every < 1:
            raise InputError(f"gate_every must be ≥ 1, got {gate_every}")
        spec, layers = rollout_of(rollout, layers)
        table = thresholds if isinstance(thresholds, Thresholds) else load_thresholds(
            thresholds if isinstance(thresholds, (str, Path)) else None)
        self.gates = resolve_gates(thresholds if isinstance(thresholds, dict) else None, table)
        super().__init__(*args, **kwargs)
        if spec is not None and self.use_vllm:
            raise InputError("a rollout copy replaces the trainer's own generation; turn use_vllm off")
        if spec is not None and self.tools:
            raise InputError("tool calling with a rollout copy is not supported")
        self.rollout_spec, self.layers, self.on_violation, self.clip = spec, layers, on_violation, clip
        self.gate_every, self.fix_positions = gate_every, fix_positions
        student = self.accelerator.unwrap_model(self.model)
        self.rollout_copy = None if spec is None else RolloutCopy(
            student, spec, 0, layers=layers, seed=self.args.seed, tokenizer=self._tokenizer)
        if self.rollout_copy is not None and not self.rollout_copy.is_student:
            # prepared as TRL prepares its teacher: its forward runs in the trainer's mixed precision, as the student's
            self.rollout_copy.model = self.accelerator.prepare_model(self.rollout_copy.model, evaluation_mode=True)
            self.rollout_copy.model.eval()
        engine = self.rollout_copy is not None and self.rollout_copy.engine is not None
        if engine and (self.temperature != 1.0 or self.top_p != 1.0 or self.top_k or self.min_p
                       or self.repetition_penalty != 1.0):
            raise InputError("llama.cpp samples at temperature 1 with no top-p, top-k, min-p or penalty here")
        if self.top_k or self.min_p or self.repetition_penalty != 1.0:
            log.warning("mismatch: top_k / min_p / repetition_penalty are not modelled by the mismatch statistics "
                        "(they are of the temperature / top-p distributions)")
        self._copy_step = 0  # the optimizer step whose weights the copy holds
        self._engine_logprobs: list[list[float]] | None = None
        self._window: deque[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = deque(maxlen=gate_every)
        self.gate_records: list[GateRecord] = []
        self.last_rollout: tuple[Batch, torch.Tensor, torch.Tensor] | None = None
        self.stop_requested = False
        self.add_callback(_GateStop(self))

    # -- generation ---------------------------------------------------------------------------------------

    def _follow_student(self) -> None:
        """Rebuild the copy from the student's current weights when an optimizer step has passed since."""
        if self.rollout_copy is not None and self.state.global_step != self._copy_step:
            self.rollout_copy.refresh()
            self._copy_step = self.state.global_step

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, has_tool_images=False):
        if self.rollout_copy is None:
            return super()._generate_single_turn(prompt_ids, images, multimodal_fields, has_tool_images)
        self._follow_student()
        if self.rollout_copy.engine is not None:
            return self._engine_generate(prompt_ids)
        # TRL's own sampling code, with the copy in the student's place (`model_wrapped` is what it unwraps)
        wrapped = self.model_wrapped
        self.model_wrapped = self.rollout_copy.model
        try:
            return super()._generate_single_turn(prompt_ids, images, multimodal_fields, has_tool_images)
        finally:
            self.model_wrapped = wrapped

    def _engine_generate(self, prompt_ids: list[list[int]]) -> list[list[int]]:
        """llama.cpp's samples (temperature 1), each ending at its first EOS, with its own log-probs kept
        for the statistics. Prompt i of optimizer step s is sampled with seed `rollout_seed(seed, s) + i`."""
        engine, base = self.rollout_copy.engine, rollout_seed(self.args.seed, self.state.global_step)
        out, logprobs = [], []
        for i, ids in enumerate(prompt_ids):
            tokens, lps = engine.sample(list(ids), self.max_completion_length, seed=(base + i) % 2**32,
                                        eos_id=self._tokenizer.eos_token_id)
            out.append(tokens)
            logprobs.append(lps)
        self._engine_logprobs = logprobs
        return out

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        mode = "train" if self.model.training else "eval"
        self._measure(output, mode)
        return output

    def _get_last_hidden_state(self, unwrapped_model, input_ids, attention_mask, logits_to_keep, **multimodal):
        """TRL's head inputs `(B, logits_to_keep, H)` of the completion tokens; with `fix_positions`, from a
        text-only backbone forward given the generation's `position_ids` (see the class docstring)."""
        backbone = getattr(unwrapped_model, "base_model", None)
        takes_positions = backbone is not None and "position_ids" in inspect.signature(backbone.forward).parameters
        if (not self.fix_positions or self._is_vlm or any(v is not None for v in multimodal.values())
                or is_peft_model(unwrapped_model) or not takes_positions):
            return super()._get_last_hidden_state(unwrapped_model, input_ids, attention_mask, logits_to_keep,
                                                  **multimodal)
        hidden = backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids(attention_mask),
                          use_cache=False).last_hidden_state
        return hidden[:, :-1, :][:, -logits_to_keep:, :]  # as TRL's: drop the last position, keep the completion's

    # -- measurement --------------------------------------------------------------------------------------

    def _measure(self, output: dict, mode: str) -> None:
        """The batch's mismatch statistics into the logs; in training, the gates when their step comes."""
        batch = self._as_batch(output)
        logp_train_N, logp_rollout_N = self._logprobs(batch)
        rows_N = torch.nonzero(batch.response_mask)[:, 0]
        seq_N = torch.unique(rows_N, return_inverse=True)[1]  # rows with no completion token drop out
        self.last_rollout = (batch, logp_train_N, logp_rollout_N)
        for name, value in statistics(logp_train_N, logp_rollout_N, seq_N, clip=self.clip).items():
            self._metrics[mode][name].append(value)
        if mode != "train":
            return
        self._window.append((logp_train_N, logp_rollout_N, seq_N))
        step = self.state.global_step
        if step == 0 or step % self.gate_every == 0:
            self._judge(step, mode)

    def _as_batch(self, output: dict) -> Batch:
        prompt_ids, prompt_mask = output["prompt_ids"].cpu(), output["prompt_mask"].cpu()
        completion_ids, completion_mask = output["completion_ids"].cpu(), output["completion_mask"].cpu()
        scored = completion_mask * output["tool_mask"].cpu() if "tool_mask" in output else completion_mask
        return Batch(torch.cat([prompt_ids, completion_ids], 1), torch.cat([prompt_mask, completion_mask], 1),
                     torch.cat([torch.zeros_like(prompt_mask), scored], 1), ())

    def _logprobs(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """`(log π_student(y), log π_rollout(y))` `[N]` fp32 of the batch's completion tokens, row-major."""
        warp = dict(temperature=self.temperature, top_p=None if self.top_p == 1.0 else self.top_p)
        student = self.accelerator.unwrap_model(self.model)
        mask = batch.response_mask.bool()
        with _eval_mode(student):
            logp_train_N = sequence_logprobs(student, batch, **warp)[mask]
        if self.rollout_copy is None:
            return logp_train_N, logp_train_N  # the student sampled: the same policy, the same numbers
        if self.rollout_copy.engine is not None:
            logp = [lp for row in self._engine_logprobs for lp in row]  # row-major, as the mask selects
            return logp_train_N, torch.tensor(logp, dtype=torch.float32)
        return logp_train_N, sequence_logprobs(self.rollout_copy.model, batch, **warp)[mask]

    def _judge(self, step: int, mode: str) -> None:
        """The gates on the window's tokens (the last `gate_every` batches, each batch's sequences apart)."""
        logp_train = torch.cat([w[0] for w in self._window])
        logp_rollout = torch.cat([w[1] for w in self._window])
        labels, first = [], 0
        for _, _, seq_N in self._window:  # batch b's sequences after every earlier batch's
            labels.append(seq_N + first)
            first += int(seq_N.max()) + 1
        seq = torch.cat(labels)
        _, decisions = judge(logp_train, logp_rollout, seq, self.gates, clip=self.clip, seed=step)
        record = GateRecord(step, len(logp_train), int(seq.max()) + 1, tuple(decisions))
        self.gate_records.append(record)
        for d in decisions:
            self._metrics[mode][f"admission/{d.metric}_low"].append(d.low)
            self._metrics[mode][f"admission/{d.metric}_high"].append(d.high)
            self._metrics[mode][f"admission/{d.metric}_limit"].append(d.limit)
        self._metrics[mode]["admission/status"].append(min(STATUS_CODE[d.status] for d in decisions))
        for d in record.violations:
            log.warning(f"mismatch gate at step {step}: {d.metric} = {d.value:.4g}, 95% interval "
                        f"[{d.low:.4g}, {d.high:.4g}] over {record.sequences} sequences, above the limit "
                        f"{d.limit:.4g} ({d.source})" + ("; stopping" if self.on_violation == "stop" else ""))
        if record.violations and self.on_violation == "stop":
            self.stop_requested = True
