"""What generates the rollouts, as one value: `RolloutSpec`, parsed once from a rollout string.

A rollout string is one of
  * `none` (or empty): the student itself, fresh every step — the clean run;
  * a perturbation spec (`fp8-e4m3:block128`, `noise:0.1`, …; `mismatch.perturb.parse_spec`): a copy of
    the student with that perturbation applied to its weights;
  * `engine:llama.cpp[,WEIGHTS][,kv-f32]`: the student exported to another inference engine, which
    samples (OPD) or scores (probes) in its place;
  * `stale:K`: the student's weights K optimizer steps old (an asynchronous pipeline);
  * `reuse:R`: one rollout batch trained on for R consecutive optimizer steps;
  * `resample:S`: the student itself, fresh every step, sampling from another random stream (S ≥ 1
    names which) with the same prompts and initial weights — the A/A control: clean against clean,
    whose spread is the noise floor any mismatch is judged against.
A perturbation or engine combines with a lag through OPD's separate `staleness` field (label
`SPEC + stale:K`). Only perturbations can be applied to a model in place (`perturb_`); staleness and
reuse exist only inside an OPD trajectory, an engine only outside PyTorch.

Clean has one definition, `RolloutSpec.is_clean`: what trains exactly as the student's own fresh
rollouts — no perturbation, no engine, no lag, no reuse, its own sampling stream (`resample:S` is the
same policy but other samples, so other numbers: a level, source `A/A`). `stale:0`, `reuse:1` and
`resample:0` are therefore clean
(the same numbers, bit for bit): they are labelled `clean`, planned as the clean run, and an
`OPDConfig` stores them as `none` (one run, one id).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass

from mismatch.errors import InputError, ModelNotAvailableError
from mismatch.perturb.configs import PerturbConfig, SpecText, NoiseConfig
from mismatch.perturb.spec import parse_spec

NONE_FORMS = ("", "none")  # rollout strings meaning "the student itself"
LLAMA_CPP_MISSING = ("llama.cpp is not installed: `make engines` (or pip install 'mismatch[engines]') builds "
                     "llama-cpp-python, ~10 minutes")

ENGINES = ("llama.cpp",)
GGUF_WEIGHTS = ("f32", "f16", "q8_0", "q5_0", "q5_1", "q4_0", "q4_1", "gguf")  # gguf: the file the model came from
KV_CACHE = ("f16", "f32")


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """Another inference engine runs the candidate / rollout copy: `engine:llama.cpp[,WEIGHTS][,kv-f32]`.
    `weights`: the GGUF weight type the model is exported with (`gguf`: the GGUF file it was loaded
    from); `kv`: the engine's KV cache type (llama.cpp's default f16)."""

    engine: str = "llama.cpp"
    weights: str = "f32"
    kv: str = "f16"

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise InputError(f"unknown engine {self.engine!r}; valid: {', '.join(ENGINES)}")
        if self.weights not in GGUF_WEIGHTS:
            raise InputError(f"unknown GGUF weight type {self.weights!r}; valid: {', '.join(GGUF_WEIGHTS)}")
        if self.kv not in KV_CACHE:
            raise InputError(f"unknown KV cache type {self.kv!r}; valid: {', '.join(KV_CACHE)}")

    @classmethod
    def from_spec(cls, text: SpecText) -> EngineConfig:
        if not text.options:
            raise InputError(f"engine needs a name: engine:{ENGINES[0]}[,WEIGHTS][,kv-f32]")
        engine, *rest = text.options
        weights = [o for o in rest if not o.startswith("kv-")]
        kv = [o[3:] for o in rest if o.startswith("kv-")]
        if len(weights) > 1 or len(kv) > 1:
            raise InputError(f"{text.spec}: at most one weight type and one kv-TYPE")
        return cls(engine=engine, weights=weights[0] if weights else "f32", kv=kv[0] if kv else "f16")

    def __str__(self) -> str:
        return f"engine:{self.engine},{self.weights}" + (f",kv-{self.kv}" if self.kv != "f16" else "")

    @property
    def weight_bits(self) -> float:
        """Stored bits per 2-D weight: 32, 16, or a block format's bits plus its fp16 scale (and minimum)
        per 32 values (q8_0 8.5, q5_0 5.5, q5_1 6, q4_0 4.5, q4_1 5); NaN for `gguf` (the file's own mix)."""
        return {"f32": 32.0, "f16": 16.0, "q8_0": 8.5, "q5_0": 5.5, "q5_1": 6.0, "q4_0": 4.5,
                "q4_1": 5.0}.get(self.weights, float("nan"))


def _steps(text: SpecText) -> int:
    """The one integer option of `stale:K` / `reuse:R`."""
    try:
        (steps,) = text.options
        return int(steps)
    except ValueError:
        raise InputError(f"{text.kind} needs an integer number of steps, e.g. {text.kind}:4; "
                         f"got {text.spec!r}") from None


ROLLOUT_FORMS = (  # (form, what generates the rollouts): the rollout-only forms, beside the perturbation kinds
    ("none", "the student itself, fresh every step (the clean run)"),
    ("stale:K", "the student's weights K optimizer steps old (an asynchronous pipeline; OPD only)"),
    ("reuse:R", "one rollout batch trained on for R consecutive optimizer steps (R = 1: the clean numbers; OPD only)"),
    ("resample:S", "the student itself with another sampling stream S ≥ 1, same prompts and initial weights: the "
                   "A/A control whose spread is the noise floor (S = 0: the clean run; OPD only)"),
    ("engine:llama.cpp[,f32|f16|q8_0|q5_0|q5_1|q4_0|q4_1|gguf][,kv-f32]",
     "the model exported to GGUF (or its own GGUF file: `gguf`) and run by llama.cpp's CPU kernels, KV cache f16 "
     "unless kv-f32 (needs `make engines`)"),
)


@dataclass(frozen=True)
class RolloutSpec:
    """What generates an OPD run's rollouts or a probe's candidate.

    Attributes:
        text: the rollout string as given (labels keep its spelling: `fp8-e4m3` stays `fp8-e4m3`).
        perturbation: the perturbation applied to the rollout copy's weights, or None.
        engine: the engine that runs the copy instead of PyTorch, or None.
        staleness: K ≥ 0, optimizer steps the served weights lag behind.
        reuse: R ≥ 1, optimizer steps trained on each rollout batch.
        resample: S ≥ 0, the sampling stream (0: the run's own; S ≥ 1: the A/A control).
    """

    text: str = "none"
    perturbation: PerturbConfig | None = None
    engine: EngineConfig | None = None
    staleness: int = 0
    reuse: int = 1
    resample: int = 0

    @classmethod
    def parse(cls, rollout: str | None, staleness: int = 0) -> RolloutSpec:
        """Parse a rollout string (module docstring) with the run's separate `staleness` (K).

        Raises:
            InputError: an unknown kind or option, a negative lag, reuse < 1, or `stale:K` beside a
                different `staleness`.
        """
        if staleness < 0:
            raise InputError(f"staleness must be ≥ 0 optimizer steps, got {staleness}")
        text = (rollout or "").strip()
        if text in NONE_FORMS:
            return cls("none" if rollout is None else rollout, staleness=staleness)
        parts = SpecText.split(text)
        if parts.kind == "stale":
            k = _steps(parts)
            if k < 0:
                raise InputError(f"staleness must be ≥ 0 optimizer steps, got {k}")
            if staleness not in (0, k):
                raise InputError(f"rollout {text} and staleness {staleness} disagree")
            return cls(text, staleness=k)
        if parts.kind == "reuse":
            r = _steps(parts)
            if r < 1:
                raise InputError(f"reuse needs ≥ 1 optimizer step per rollout batch, got {r}")
            return cls(text, staleness=staleness, reuse=r)
        if parts.kind == "resample":
            stream = _steps(parts)
            if stream < 0:
                raise InputError(f"resample needs a sampling stream ≥ 0, got {stream}")
            return cls(text, staleness=staleness, resample=stream)
        if parts.kind == "engine":
            return cls(text, engine=EngineConfig.from_spec(parts), staleness=staleness)
        return cls(text, perturbation=parse_spec(text), staleness=staleness)

    @property
    def is_clean(self) -> bool:
        """Trains exactly as the student's own fresh rollouts: no perturbation, no engine, K = 0, R = 1
        on the run's own sampling stream (the one definition: `none`, `stale:0`, `reuse:1`, `resample:0`)."""
        return (self.perturbation is None and self.engine is None and self.staleness == 0 and self.reuse == 1
                and self.resample == 0)

    @property
    def perturbation_spec(self) -> str | None:
        """The perturbation's canonical spec (`str(config)`), or None."""
        return None if self.perturbation is None else str(self.perturbation)

    @property
    def copy_spec(self) -> str | None:
        """What the rollout copy runs, as `RolloutCopy` takes it: the perturbation's or the engine's
        canonical spec, or None (the student's own weights)."""
        return self.perturbation_spec or (None if self.engine is None else str(self.engine))

    @property
    def label(self) -> str:
        """`clean`, the rollout string, or `SPEC + stale:K` (`stale:K` alone for a lagged student)."""
        if self.is_clean:
            return "clean"
        base = "clean" if self.text.strip() in NONE_FORMS else self.text
        if self.staleness and not self.text.startswith("stale:"):
            return f"stale:{self.staleness}" if base == "clean" else f"{base} + stale:{self.staleness}"
        return base

    @property
    def source(self) -> str:
        """The mismatch source: `clean`, `A/A` (`resample:S`), `stale`, `reuse`, `noise`, `engine` or `format`."""
        if self.perturbation is not None:
            return "noise" if isinstance(self.perturbation, NoiseConfig) else "format"
        if self.engine is not None:
            return "engine"
        if self.is_clean:
            return "clean"
        if self.resample and not self.staleness and self.reuse == 1:
            return "A/A"
        return "reuse" if self.reuse != 1 else "stale"

    @property
    def level(self) -> object:
        """The level within its source: σ (noise), K (stale), R (reuse), the spec (format, engine: with
        `+ stale:K` when lagged too), 0 (clean and A/A: one level, whichever stream)."""
        source = self.source
        if source in ("clean", "A/A"):
            return 0
        if source == "stale":
            return self.staleness
        level = {"noise": getattr(self.perturbation, "sigma", None), "reuse": self.reuse}.get(
            source, str(self.engine if source == "engine" else self.perturbation))
        if self.staleness:
            return f"{level} + stale:{self.staleness}"
        return level

    @property
    def weight_bits(self) -> float:
        """Stored bits per weight of the copy's format (the perturbation's or the engine's export; NaN
        for none)."""
        return float(getattr(self.perturbation or self.engine, "weight_bits", float("nan")))


def parse_candidate(spec: str) -> PerturbConfig | EngineConfig:
    """A probe candidate: a perturbation spec or an engine (`stale:K`, `reuse:R`, `resample:S` exist only in OPD).

    Raises:
        InputError: anything else, or a bad spec.
    """
    rollout = RolloutSpec.parse(spec)
    if rollout.perturbation is None and rollout.engine is None:
        raise InputError(f"{spec} exists only inside an OPD trajectory; a probe candidate is a perturbation "
                         "spec or an engine:… spec")
    return rollout.perturbation or rollout.engine


def require_engines(specs) -> None:
    """Fail now, before any model runs, when a rollout string among `specs` names an engine that is not
    installed (looked up, not imported). A config stays valid without it (reports read engine runs
    anywhere); the verbs that would run one call this first. Raises `ModelNotAvailableError`."""
    for spec in specs:
        if spec and spec.partition(":")[0].strip() == "engine" and importlib.util.find_spec("llama_cpp") is None:
            raise ModelNotAvailableError(f"{spec}: {LLAMA_CPP_MISSING}")


def render_rollout_table() -> str:
    """The rollout-only forms as a Markdown table (the docs' spec grammar, beside `render_spec_table()`)."""
    forms = ["| rollout | what generates the rollouts |", "|---|---|"]
    forms += ["| `" + form.replace("|", "\\|") + f"` | {what} |" for form, what in ROLLOUT_FORMS]
    return "\n".join(forms)


def rollout_label(fields: Mapping[str, object]) -> str:
    """The one label of a rollout configuration given as its fields (`rollout`, `staleness`, `layers`: an
    `OPDConfig`'s, a result row's, a probe's perturbation as `rollout`): `RolloutSpec.label`, with the layer
    scope in brackets when it is not `linear` (`int4:group128 [attn]`)."""
    label = RolloutSpec.parse(str(fields.get("rollout", "none")), int(fields.get("staleness", 0) or 0)).label
    layers = fields.get("layers")
    if label != "clean" and isinstance(layers, str) and layers not in ("", "linear"):
        label += f" [{layers}]"
    return label
