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
  computes is logged, under the toolkit's names and the frameworks' (`mismatch.admission.decision.statistics`:
  `mismatch_kl`, verl's `rollout_corr/…`, slime's `train/train_rollout_logprob_abs_diff`, NeMo RL's
  `train/token_mult_prob_error`, …), so they land in `trainer.state.log_history` and whatever TRL
  reports to. With `rollout=None` the rollout policy is the student: every mismatch statistic is exactly
  its no-mismatch value (0; 1 for the ratio-type `train/token_mult_prob_error` and ESS).
* The admission gates (`mismatch.admission.judge`: the shipped fitted limits, or `thresholds`) judge the
  first batch against the first-step limit, then every `gate_every` optimizer steps the tokens of the last
  `gate_every` batches — a window statistic (pooled over tokens) — against the window limit
  (`Thresholds.window_limits`, what `check --teacher` and `mismatch monitor` judge by; over
  `Thresholds.window_steps` = 10 steps, the default `gate_every`). The limits are those of the trainer's loss
  (`trainer_loss`): TRL's generalized JSD at `beta` 1 (its default) is the study's `full-rkl`, judged by its
  own limit where the check would use it (`Thresholds.for_loss`); any other `beta` is a loss the study did
  not run, judged by the limits pooled over losses. Limits given as `{statistic: limit}`
  apply to every judgement. A
  reject is a violation: `on_violation="warn"` logs one warning line (statistic, interval, limit);
  `"stop"` ends training after that step with a checkpoint saved.

The copy is prepared by accelerate as TRL prepares its teacher, so its forward runs in the trainer's mixed
precision as the student's does (TRL's default `bf16=True` autocasts, on CPU too): an unperturbed copy
scores exactly as the student.
Sampling settings the statistics do not model (top-k, min-p, a repetition penalty) are warned about once:
the statistics are of the temperature / top-p warped distributions, as `check` calibrates them.

The subclass overrides private hooks of TRL's trainer and reads private attributes, a contract TRL does not
publish: it is tested on `TESTED_TRL`, and importing this module checks the hooks' signatures (`HOOKS`),
constructing the trainer the attributes (`ATTRIBUTES`), each failing in one line naming the installed TRL.
"""

from __future__ import annotations

import inspect
import logging
from collections import defaultdict, deque
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
import trl
from accelerate.utils import is_peft_model, parse_flag_from_env
from datasets import Dataset
from packaging.specifiers import SpecifierSet
from packaging.version import Version
from transformers import PreTrainedTokenizerBase, TrainerCallback
from trl import DistillationTrainer

from mismatch.admission.decision import Decision, judge, resolve_gates, statistics, window_gates
from mismatch.admission.thresholds import Thresholds, load_thresholds
from mismatch.errors import InputError, MismatchError
from mismatch.model.generate import Batch, sequence_logprobs
from mismatch.model.positions import position_ids
from mismatch.rollout.copy import RolloutCopy
from mismatch.rollout.copy import rollout_seed
from mismatch.rollout.spec import RolloutSpec
from mismatch.defaults import DEFAULT_CLIP

log = logging.getLogger("mismatch")
ON_VIOLATION = ("warn", "stop")
STATUS_CODE = {"admit": 1.0, "uncertain": 0.0, "reject": -1.0}  # `admission/status` in the logs

# -- the TRL contract ---------------------------------------------------------------------------------------

TESTED_TRL = SpecifierSet(">=1.16.0,<1.17")  # the releases the tests ran on (1.16.0); pyproject's `trl` extra
# TRL's private methods this module overrides or calls, with their parameters in TRL 1.16.0
# (trl/trainer/distillation_trainer.py: 1003, 1465, 1532, 952)
HOOKS: dict[str, tuple[str, ...]] = {
    "_generate_single_turn": ("self", "prompt_ids", "images", "multimodal_fields", "has_tool_images=False"),
    "_get_last_hidden_state": ("self", "unwrapped_model", "input_ids", "attention_mask", "logits_to_keep",
                               "pixel_values=None", "image_grid_thw=None", "pixel_attention_mask=None",
                               "spatial_shapes=None", "image_sizes=None", "token_type_ids=None",
                               "mm_token_type_ids=None", "image_position_ids=None"),
    "_generate_and_score_completions": ("self", "inputs"),
    "_tokenize_prompts": ("self", "prompts"),
}


def _is_metrics(value) -> bool:
    return isinstance(value, dict) and all(
        isinstance(value.get(mode), defaultdict) and value[mode].default_factory is list for mode in ("train", "eval"))


# the trainer attributes read (TRL 1.16.0 sets them in `DistillationTrainer.__init__`: 398–402, 714, 762;
# `model_wrapped`, transformers' `Trainer`, is what TRL's `_generate_single_turn` generates from)
ATTRIBUTES: dict[str, tuple[str, Callable[[object], bool]]] = {
    "_metrics": ("{'train', 'eval'} → defaultdict(list)", _is_metrics),
    "_tokenizer": ("a tokenizer", lambda v: isinstance(v, PreTrainedTokenizerBase)),
    "_is_vlm": ("a bool", lambda v: isinstance(v, bool)),
    "model_wrapped": ("a module", lambda v: isinstance(v, torch.nn.Module)),
    "beta": ("a number in [0, 1]", lambda v: isinstance(v, (int, float)) and 0 <= v <= 1),
}


def trainer_loss(beta: float) -> str | None:
    """The study's name for the loss TRL's `DistillationTrainer` trains with at `beta`: its generalized JSD on
    the student's samples over the full vocabulary is, at `beta` 1, the reverse KL `full-rkl` (the rollout copy
    only chooses the prefixes); at any other `beta` (forward KL at 0, JSD between) a loss the study did not run:
    None, the limits pooled over losses."""
    return "full-rkl" if beta == 1 else None


class TRLVersionError(MismatchError):
    """The installed TRL's trainer differs from the hooks or attributes this module was written against."""

    def __init__(self, what: str) -> None:
        super().__init__(f"trl {trl.__version__}: {what}; mismatch.integrations.trl is tested with trl{TESTED_TRL} "
                         f"(pip install 'trl{TESTED_TRL}')")


def _parameters(function) -> tuple[str, ...]:
    """`function`'s parameters as `HOOKS` writes them: names, with `=default` where one is given."""
    return tuple(p.name if p.default is inspect.Parameter.empty else f"{p.name}={p.default!r}"
                 for p in inspect.signature(function).parameters.values())


def check_trl(trainer_class: type = DistillationTrainer, hooks: dict[str, tuple[str, ...]] = HOOKS) -> None:
    """Check that `trainer_class` has every hook of `hooks` with exactly those parameters (names, order and
    defaults; annotations aside). Run at import; a TRL outside `TESTED_TRL` whose hooks match logs a warning.

    Raises:
        TRLVersionError: a hook is missing or takes other parameters; one line with the installed TRL version.
    """
    for name, want in hooks.items():
        if not callable(getattr(trainer_class, name, None)):
            raise TRLVersionError(f"{trainer_class.__name__} has no {name}, which this integration relies on")
        got = _parameters(getattr(trainer_class, name))
        if got != want:
            raise TRLVersionError(f"{trainer_class.__name__}.{name} takes ({', '.join(got)}), this integration "
                                  f"expects ({', '.join(want)})")
    if Version(trl.__version__) not in TESTED_TRL:
        log.warning(f"mismatch: trl {trl.__version__} is outside the tested trl{TESTED_TRL}; its hooks' signatures "
                    "match, their behaviour is untested")


def check_attributes(trainer: DistillationTrainer) -> None:
    """Check that a constructed TRL trainer has every attribute of `ATTRIBUTES`, of the kind read.

    Raises:
        TRLVersionError: one is missing or of another kind; one line with the installed TRL version.
    """
    for name, (kind, is_kind) in ATTRIBUTES.items():
        if not hasattr(trainer, name):
            raise TRLVersionError(f"DistillationTrainer.{name} is not set, which this integration reads")
        if not is_kind(getattr(trainer, name)):
            raise TRLVersionError(f"DistillationTrainer.{name} is a {type(getattr(trainer, name)).__name__}, "
                                  f"this integration reads it as {kind}")


check_trl()


def sharding_of(args) -> str | None:
    """How the training arguments shard the student's parameters across processes, if they do.

    Args:
        args: TRL's `DistillationConfig` (a transformers `TrainingArguments`).

    Returns:
        "FSDP" when `args.fsdp_plugin_args` is set (`fsdp=…`, from which transformers' `Trainer` builds accelerate's
        FSDP plugin) or accelerate's launcher asked for it (`accelerate launch --use_fsdp` sets ACCELERATE_USE_FSDP,
        which accelerate's `AcceleratorState` reads); "DeepSpeed ZeRO-3" when `args.deepspeed_plugin.zero_stage`
        is 3 (a `deepspeed=` config, or the launcher's, as TRL itself reads it); else None.
    """
    if getattr(args, "fsdp_plugin_args", None) is not None or parse_flag_from_env("ACCELERATE_USE_FSDP", default=False):
        return "FSDP"
    plugin = getattr(args, "deepspeed_plugin", None)
    if plugin is not None and plugin.zero_stage == 3:
        return "DeepSpeed ZeRO-3"
    return None


def _round_up(n: int, multiple: int | None) -> int:
    return n if not multiple else -(-n // multiple) * multiple


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
        thresholds: the gates — None: the shipped fitted limits of the trainer's loss (the first batch against
            the first-step limit, later windows against the window limit); a thresholds file or `Thresholds`
            (the same two);
            or `{statistic: limit}` of any names `statistics` gives (every judgement).
        gate_every: judge the gates on the last `gate_every` batches' tokens every `gate_every` optimizer
            steps (and on the first batch).
        on_violation: `"warn"` (log a warning line) or `"stop"` (end training after the step, checkpoint saved).
        clip: the importance-ratio bound of `mismatch_is_ratio_outside_frac` (r outside [1/clip, clip]).
        fix_positions: train on the positions the samples were generated at. TRL 1.16's training forward
            passes no `position_ids`, so a model that then counts positions from the row's start (learned
            absolute position embeddings: GPT-2, OPT) trains every left-padded row at positions shifted by its
            padding (huggingface/trl#6800 reports the same omission in Online DPO); with True (the default) the
            student's and the teacher's training forwards get `position_ids` counted from each row's first
            attended token, as `generate` counts them — for rotary models a no-op; a PEFT student is unwrapped
            as TRL unwraps it (adapters in place). False: TRL's own forward.

    Raises:
        InputError: an argument out of range; FSDP or DeepSpeed ZeRO-3 (`sharding_of`: untested, refused); a
            longest row past the student's or the teacher's positions (`_check_positions`).
        TRLVersionError: the installed TRL's trainer lacks an attribute this class reads (`ATTRIBUTES`).

    Attributes:
        rollout_copy: the `mismatch.rollout.copy.RolloutCopy` that samples (None with `rollout=None`).
        study_loss: the study's name for the trainer's loss (`trainer_loss`; None: one the study did not run).
        gates: the `Gate`s the first batch is judged by; `later_gates`: those every later judgement (a window
            of `gate_every` batches) is judged by.
        gate_records: every `GateRecord`, in order.
        last_rollout: the latest generation batch as a `mismatch.model.generate.Batch` (prompt and
            completion tokens, left-padded prompts) with `(logp_train_N, logp_rollout_N)` of its completion
            tokens — what the logged statistics were computed from.
    """

    def __init__(self, *args, rollout=None, layers: str = "linear", thresholds=None, gate_every: int = 10,
                 on_violation: str = "warn", clip: float = DEFAULT_CLIP, fix_positions: bool = True, **kwargs) -> None:
        if on_violation not in ON_VIOLATION:
            raise InputError(f"on_violation must be one of {', '.join(ON_VIOLATION)}, got {on_violation!r}")
        if gate_every < 1:
            raise InputError(f"gate_every must be ≥ 1, got {gate_every}")
        spec, layers = rollout_of(rollout, layers)
        table = thresholds if isinstance(thresholds, Thresholds) else load_thresholds(
            thresholds if isinstance(thresholds, (str, Path)) else None)
        given = thresholds if isinstance(thresholds, dict) else None
        if given is not None:  # checked before the models load; the table's gates wait for the trainer's loss
            self.gates = self.later_gates = resolve_gates(given, table)
        try:
            training_args = inspect.signature(DistillationTrainer.__init__).bind_partial(self, *args, **kwargs)
        except TypeError:  # TRL's own call below says so, in its words
            training_args = None
        sharding = sharding_of(training_args.arguments.get("args")) if training_args is not None else None
        if sharding is not None:
            # TRL's generation gathers the parameters of `model_wrapped`, which the copy would replace with an
            # unsharded model, and the statistics read the student's parameters whole
            raise InputError(f"{sharding} shards the student's parameters: MismatchDistillationTrainer is not "
                             "supported (untested) under FSDP or DeepSpeed ZeRO-3")
        super().__init__(*args, **kwargs)
        check_attributes(self)
        self.study_loss = trainer_loss(self.beta)
        if given is None:
            self.gates = resolve_gates(None, table, self.study_loss)
            # after the first batch the gates judge a window of batches: the window limit, where the table has one
            self.later_gates = window_gates(table, self.study_loss) or self.gates
        self._check_positions()
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

    def _check_positions(self) -> None:
        """Refuse a run whose longest row needs more positions than the student or the teacher has.

        A row is a prompt and up to `max_completion_length` sampled tokens, each part padded to
        `pad_to_multiple_of` as TRL pads them; the longest prompt is measured by TRL's own tokenization
        (`_tokenize_prompts`, text only) over every map-style `datasets.Dataset` given (train and eval), else
        taken as 1 token. A learned position table (GPT-2's) fails in `generate` with `IndexError: index out of
        range in self` as soon as a sample runs past `max_position_embeddings`.

        Raises:
            InputError: one line with the lengths and the largest `max_completion_length` that fits.
        """
        evals = self.eval_dataset.values() if isinstance(self.eval_dataset, dict) else [self.eval_dataset]
        longest = 1
        for data in (self.train_dataset, *evals):
            if isinstance(data, Dataset) and "prompt" in data.column_names and not self._is_vlm:
                for chunk in data.iter(batch_size=1024):
                    longest = max(longest, *map(len, self._tokenize_prompts(chunk["prompt"])[0]))
        multiple, completion = self.pad_to_multiple_of, self.max_completion_length
        prompt = _round_up(longest, multiple)
        need = prompt + _round_up(completion, multiple)
        for role, model in (("student", self.model), ("teacher", self.teacher_model)):
            config = None if model is None else self.accelerator.unwrap_model(model).config.get_text_config()
            positions = getattr(config, "max_position_embeddings", None)
            if positions is not None and need > positions:
                fit = (positions - prompt) // (multiple or 1) * (multiple or 1)
                padded = f", padded to multiples of {multiple}," if multiple else ""
                raise InputError(f"max_completion_length {completion} + the longest prompt ({longest} tokens){padded} "
                                 f"needs {need} positions, but the {role} has {positions} positions "
                                 f"(max_position_embeddings): " + (f"set max_completion_length ≤ {fit}" if fit > 0
                                                                   else "shorten the prompts"))

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
        text-only backbone forward given the generation's `position_ids` (see the class docstring). A PEFT
        model is unwrapped as TRL unwraps it: its transformers model, adapters in place."""
        model = unwrapped_model.base_model.model if is_peft_model(unwrapped_model) else unwrapped_model  # TRL: 1480
        backbone = getattr(model, "base_model", None)
        takes_positions = backbone is not None and "position_ids" in inspect.signature(backbone.forward).parameters
        if (not self.fix_positions or self._is_vlm or any(v is not None for v in multimodal.values())
                or not takes_positions):
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
        gates = self.gates if step == 0 else self.later_gates
        _, decisions = judge(logp_train, logp_rollout, seq, gates, clip=self.clip, seed=step)
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
