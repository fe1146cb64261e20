"""The configuration of one OPD run (`OPDConfig`) and its learning-rate schedule.

A config holds data only (names, numbers), flattens to result columns (`dataclasses.asdict`) and
is hashed into the run's id (`mismatch.results.run_id`). Its fields split in two: the rollout
fields (`ROLLOUT_FIELDS`: which copy of the student generates the rollouts) and everything else;
two runs that agree on everything else are comparable, and the one with a clean rollout is the
other's baseline (`comparison_key`).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass, field

from mismatch.errors import InputError
from mismatch.defaults import DEFAULT_CHUNK_TOKENS, DEFAULT_CLIP
from mismatch.rollout.spec import RolloutSpec, rollout_label

ROLLOUT_FIELDS = ("rollout", "staleness", "layers")  # the rollout copy: spec, lag K, perturbation scope
TRAINER_DTYPES = ("fp32", "bf16")  # `ref_dtype`: fp16 would need loss scaling, which no run here models
# fields a run's columns (and so its id) carry only away from their default: runs made before they existed
# keep their ids, and a run on a GPU or in bf16 (other numbers) gets ids of its own
OMITTED_AT_DEFAULT = {"device": "cpu", "ref_dtype": "fp32"}


def _help(text: str, default: object = dataclasses.MISSING):
    """A config field with its help text (`metadata["help"]`, as TRL's configs carry theirs): written once, read by
    the CLI's options (`field_help`) and the docs."""
    return field(default=default, metadata={"help": text})


@dataclass(frozen=True, kw_only=True)
class OPDConfig:
    """One OPD run. Flattens to result columns (`dataclasses.asdict`)."""

    pair: str = _help("Student–teacher pair (`mismatch pairs`) or a pair .toml.")
    rollout: str = _help("What generates the rollouts (`mismatch.rollout.spec`): a perturbation spec, engine:…, "
                         "stale:K, reuse:R, resample:S or none.", "none")
    staleness: int = _help("K: rollouts from weights K optimizer steps old (with a perturbation spec: a copy that also "
                           "lags).", 0)
    layers: str = _help("The rollout perturbation's layer scope: linear, all, attn, mlp, experts, router, lm_head, "
                        "block indices (0-3,7) or a regex.", "linear")
    loss: str = _help("The OPD loss: full-rkl, full-fkl, pg-rkl or pg-rkl-is.", "full-rkl")  # full-rkl: measured on
    # the synthetic pairs, the lowest-variance signal (docs/opd.md)
    steps: int = _help("Optimizer steps.", 120)
    batch_size: int = _help("Prompts (rollouts) per step.", 128)
    lr: float = _help("The trainer's AdamW learning rate.", 1e-3)
    warmup_steps: int = _help("Linear learning-rate warm-up steps: a fresh AdamW's first steps move every weight by "
                              "about lr.", 10)
    decay: str = _help("After warm-up: cosine to final_lr_frac·lr at the last step, or constant.", "cosine")
    final_lr_frac: float = _help("The learning rate's share left at the last step (cosine decay).", 0.1)
    weight_decay: float = _help("AdamW's weight decay.", 0.0)
    adam_beta1: float = _help("AdamW's momentum β1: with it, consecutive updates align and lagged rollouts trail "
                              "them.", 0.9)
    grad_clip: float = _help("Gradient norm clip.", 1.0)
    temperature: float = _help("Rollout sampling temperature.", 1.0)
    top_p: float | None = _help("Rollout nucleus sampling; off by default.", None)
    tis_cap: float | None = _help("Truncated importance sampling cap C: token weights min(π_S/π_R, C); off by "
                                  "default.", None)
    max_new_tokens: int | None = _help("Response tokens per rollout (None: the pair's).", None)
    train_prompts: int = _help("The pool of train-split prompts the batches are drawn from.", 4096)
    eval_prompts: int = _help("Held-out prompts per evaluation.", 128)
    eval_every: int = _help("Held-out evaluation every N steps.", 10)
    eval_greedy: bool = _help("Also score greedy responses (`heldout_greedy_accuracy`): one more generation.", True)
    eval_probe: int = _help("Held-out samples the rollout copy is probed on against the student at each "
                            "evaluation (0: off).", 64)
    clip: float = _help("Importance ratios outside [1/clip, clip] count in is_ratio_outside_frac.", DEFAULT_CLIP)
    chunk_tokens: int = _help("Tokens per chunk of full-vocabulary work.", DEFAULT_CHUNK_TOKENS)
    seed: int = _help("Seed of prompts, sampling and noise.", 0)
    device: str = _help("Where the run computes: auto (CUDA when present), cpu, cuda, cuda:N.", "cpu")
    ref_dtype: str = _help("The trainer's precision: fp32, or bf16 (a bf16 compute copy of the student over fp32 "
                           "master weights, the teacher in bf16).", "fp32")

    def __post_init__(self) -> None:
        """Validate every field: a bad value (or a value of the wrong type, as a study file may give) is one
        `InputError` line naming the field."""
        try:
            self._validate()
        except TypeError as exc:
            raise InputError(f"OPD settings: {str(exc).splitlines()[0]}") from None

    def _validate(self) -> None:
        for spec in dataclasses.fields(self):  # numbers are numbers (a study file may quote one)
            value = getattr(self, spec.name)
            if spec.type.split(" | ")[0] in ("int", "float") and value is not None and (
                    isinstance(value, bool) or not isinstance(value, numbers.Real)):
                raise InputError(f"{spec.name} must be a number, got {value!r}")
        # what is checked against torch (the registered losses, the devices present) is imported here: reading a
        # config's fields and comparing runs (`mismatch.analysis`) needs no torch
        from mismatch.model.device import is_balanced, resolve_device
        from mismatch.opd.losses import get_loss

        get_loss(self.loss)  # an unknown loss: one line naming the registered ones
        if self.ref_dtype not in TRAINER_DTYPES:
            raise InputError(f"ref_dtype must be one of {', '.join(TRAINER_DTYPES)} (the trainer's precision), "
                             f"got {self.ref_dtype!r}")
        if is_balanced(self.device):
            raise InputError("device 'balanced' spreads a model that is only read (check, probe, score-rollouts); "
                             "OPD trains on one device: use cuda or cuda:N")
        object.__setattr__(self, "device", str(resolve_device(self.device)))  # auto resolved; absent CUDA fails here
        if self.staleness < 0:
            raise InputError(f"staleness must be ≥ 0, got {self.staleness}")
        if self.eval_probe < 0:
            raise InputError(f"eval_probe must be ≥ 0, got {self.eval_probe}")
        for name in ("steps", "batch_size", "train_prompts", "eval_prompts", "eval_every", "chunk_tokens"):
            if getattr(self, name) < 1:
                raise InputError(f"{name} must be ≥ 1, got {getattr(self, name)}")
        if self.decay not in ("cosine", "constant"):
            raise InputError(f"decay must be cosine or constant, got {self.decay!r}")
        if not 0 <= self.final_lr_frac <= 1:
            raise InputError(f"final_lr_frac must be in [0, 1], got {self.final_lr_frac}")
        if self.warmup_steps < 0:
            raise InputError(f"warmup_steps must be ≥ 0, got {self.warmup_steps}")
        if self.tis_cap is not None and self.tis_cap <= 0:
            raise InputError(f"tis_cap must be > 0, got {self.tis_cap}")
        if not 0 <= self.adam_beta1 < 1:
            raise InputError(f"adam_beta1 must be in [0, 1), got {self.adam_beta1}")
        if not self.lr > 0 or not self.temperature > 0:
            raise InputError("lr and temperature must be > 0")
        spec = self.rollout_spec  # a bad spec fails here, before any work
        if spec.is_clean and (self.rollout != "none" or self.staleness):  # stale:0, reuse:1: the clean run itself
            object.__setattr__(self, "rollout", "none")
            object.__setattr__(self, "staleness", 0)
        engine = spec.engine
        if engine is not None and (engine.weights == "gguf" or self.temperature != 1.0 or self.top_p):
            raise InputError(f"an {engine.engine} rollout copy is re-exported from the trained weights at "
                             "temperature 1 without top_p (not from its original GGUF file)")

    @property
    def rollout_spec(self) -> RolloutSpec:
        """What generates the rollouts: `rollout` with `staleness`, parsed once into one value."""
        return RolloutSpec.parse(self.rollout, self.staleness)

    @property
    def is_clean(self) -> bool:
        """The clean run (`RolloutSpec.is_clean`; a clean-equivalent rollout is stored as `none`)."""
        return self.rollout_spec.is_clean

    @property
    def label(self) -> str:
        """The run's rollout label (`clean`, `fp8-e4m3`, `stale:4`, `int4:group128 [attn]`: `rollout_label`)."""
        return rollout_label(dataclasses.asdict(self))

    def clean(self) -> OPDConfig:
        """The same run with clean rollouts: its baseline."""
        return dataclasses.replace(self, rollout="none", staleness=0, layers=OPDConfig.layers)


# what two comparable runs share: every non-rollout field, and the pair's data (`pair_sha256`)
COMPARISON_FIELDS = (*(f.name for f in dataclasses.fields(OPDConfig) if f.name not in ROLLOUT_FIELDS), "pair_sha256")


def _comparable(value: object) -> str:
    """A config value as compared across runs: missing / None / NaN / NA / "" (older files) alike,
    numbers of any type (int, float, numpy, nullable) by value."""
    import numpy as np  # a config is read without them (`mismatch opd --help`); comparing runs has them loaded
    import pandas as pd

    if value is None or pd.isna(value) or (isinstance(value, str) and value == ""):
        return "None"
    if isinstance(value, (numbers.Number, np.generic)) and not isinstance(value, (bool, np.bool_)):
        return repr(float(value))
    return str(value)


def comparison_key(config: dict[str, object]) -> tuple[str, ...]:
    """The values of every non-rollout field (`COMPARISON_FIELDS`) of a config given as result
    columns (`_comparable`): runs with equal keys differ at most in their rollout."""
    return tuple(_comparable(config.get(name)) for name in COMPARISON_FIELDS)


def lr_factor(config: OPDConfig, step: int) -> float:
    """Multiplier of `config.lr` at optimizer step `step` (1-based): linear warm-up over
    `warmup_steps`, then constant or cosine decay reaching `final_lr_frac` at `config.steps` (the
    decay settles the policy, so the final evaluation measures where the run ended rather than
    where the last few steps threw it)."""
    warm = min(1.0, step / (config.warmup_steps + 1))
    if config.decay == "constant":
        return warm
    span = max(1, config.steps - config.warmup_steps)
    progress = min(1.0, max(0.0, (step - config.warmup_steps) / span))
    return warm * (config.final_lr_frac + (1 - config.final_lr_frac) * 0.5 * (1 + math.cos(math.pi * progress)))


def where_columns(config: OPDConfig) -> dict[str, str]:
    """The `OMITTED_AT_DEFAULT` fields away from their defaults, as a run's columns (and id) carry them: a device
    by its type (the same numbers on any `cuda:N`); {} on the CPU in fp32."""
    values = {"device": config.device.split(":")[0], "ref_dtype": config.ref_dtype}
    return {name: values[name] for name, default in OMITTED_AT_DEFAULT.items() if values[name] != default}


def field_help(config: type, name: str) -> str:
    """The help text a config class's field carries (`metadata["help"]`): what the CLI and the docs say of it."""
    return next(f for f in dataclasses.fields(config) if f.name == name).metadata["help"]
