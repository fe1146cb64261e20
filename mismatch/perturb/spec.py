"""Perturbation specs: `KIND[:OPT[,OPT…]]` strings parsed into frozen dataclass configs.

Each config knows its spec string (`str(config)` round-trips through `parse_spec`) and
flattens to result columns with `dataclasses.asdict`. Kinds (DESIGN.md):

    fp8-e4m3:tensor|channel|block128[,w8a8]   fp8-e5m2:…      rounded through torch's FP8 dtypes
    int8:channel   int4:group128                              symmetric integer rounding in torch
    dtype:bf16     dtype:fp16                                 lower float precision
    noise:SIGMA                                               W ← W + σ·rms(W)·ε
    bnb-int8  bnb-nf4  bnb-fp4                                bitsandbytes modules
    quanto-int8  quanto-int4  quanto-fp8[,a8]                 optimum-quanto modules
    stale:K                                                   weights K optimizer steps old (OPD only)
"""

from __future__ import annotations

from dataclasses import dataclass

from mismatch.errors import InputError

FP8_GRANULARITIES = ("tensor", "channel", "block128")


@dataclass(frozen=True, kw_only=True)
class FP8Config:
    fmt: str  # "e4m3" | "e5m2"
    granularity: str = "channel"
    w8a8: bool = False

    def __post_init__(self) -> None:
        if self.fmt not in ("e4m3", "e5m2"):
            raise InputError(f"unknown FP8 format {self.fmt!r}; valid: e4m3, e5m2")
        if self.granularity not in FP8_GRANULARITIES:
            raise InputError(f"unknown FP8 scale {self.granularity!r}; valid: {', '.join(FP8_GRANULARITIES)}")

    def __str__(self) -> str:
        return f"fp8-{self.fmt}:{self.granularity}" + (",w8a8" if self.w8a8 else "")


@dataclass(frozen=True, kw_only=True)
class IntConfig:
    bits: int  # 8 | 4
    granularity: str  # "channel" | "groupN"

    def __post_init__(self) -> None:
        if self.bits not in (8, 4):
            raise InputError(f"integer rounding supports 8 or 4 bits, got {self.bits}")
        if self.granularity != "channel" and not (
                self.granularity.startswith("group") and self.granularity[5:].isdigit()
                and int(self.granularity[5:]) > 0):
            raise InputError(f"unknown integer granularity {self.granularity!r}; valid: channel, groupN (e.g. group128)")

    @property
    def group_size(self) -> int | None:
        return None if self.granularity == "channel" else int(self.granularity[5:])

    def __str__(self) -> str:
        return f"int{self.bits}:{self.granularity}"


@dataclass(frozen=True, kw_only=True)
class DtypeConfig:
    dtype: str  # "bf16" | "fp16"

    def __post_init__(self) -> None:
        if self.dtype not in ("bf16", "fp16"):
            raise InputError(f"unknown dtype {self.dtype!r}; valid: bf16, fp16")

    def __str__(self) -> str:
        return f"dtype:{self.dtype}"


@dataclass(frozen=True, kw_only=True)
class NoiseConfig:
    sigma: float

    def __post_init__(self) -> None:
        if not self.sigma >= 0:
            raise InputError(f"noise sigma must be ≥ 0, got {self.sigma}")

    def __str__(self) -> str:
        return f"noise:{self.sigma:g}"


@dataclass(frozen=True, kw_only=True)
class BnbConfig:
    method: str  # "int8" | "nf4" | "fp4"

    def __post_init__(self) -> None:
        if self.method not in ("int8", "nf4", "fp4"):
            raise InputError(f"unknown bitsandbytes method {self.method!r}; valid: int8, nf4, fp4")

    def __str__(self) -> str:
        return f"bnb-{self.method}"


@dataclass(frozen=True, kw_only=True)
class QuantoConfig:
    weights: str  # "int8" | "int4" | "fp8"
    activations: bool = False

    def __post_init__(self) -> None:
        if self.weights not in ("int8", "int4", "fp8"):
            raise InputError(f"unknown quanto weights {self.weights!r}; valid: int8, int4, fp8")

    def __str__(self) -> str:
        return f"quanto-{self.weights}" + (":a8" if self.activations else "")


@dataclass(frozen=True, kw_only=True)
class StaleConfig:
    steps: int

    def __post_init__(self) -> None:
        if self.steps < 0:
            raise InputError(f"staleness must be ≥ 0 optimizer steps, got {self.steps}")

    def __str__(self) -> str:
        return f"stale:{self.steps}"


PerturbConfig = FP8Config | IntConfig | DtypeConfig | NoiseConfig | BnbConfig | QuantoConfig | StaleConfig

KINDS = ("fp8-e4m3", "fp8-e5m2", "int8", "int4", "dtype", "noise", "bnb-int8", "bnb-nf4", "bnb-fp4",
         "quanto-int8", "quanto-int4", "quanto-fp8", "stale")


def _no_opts(kind: str, opts: list[str]) -> None:
    if opts:
        raise InputError(f"{kind} takes no options, got {','.join(opts)}")


def parse_spec(spec: str) -> PerturbConfig:
    """Parse a perturbation spec string (see module docstring) into its frozen config.

    Raises:
        InputError: unknown kind or option, naming the valid ones.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise InputError(f"empty perturbation spec; valid kinds: {', '.join(KINDS)}")
    spec = spec.strip()
    if spec.startswith("quanto-") and ":" not in spec and "," in spec:
        spec = spec.replace(",", ":", 1)  # DESIGN.md also writes quanto-int8,a8
    kind, _, rest = spec.partition(":")
    opts = [o.strip() for o in rest.split(",") if o.strip()] if rest else []
    if kind in ("fp8-e4m3", "fp8-e5m2"):
        gran = [o for o in opts if o != "w8a8"]
        if len(gran) > 1:
            raise InputError(f"{kind} takes one scale granularity ({', '.join(FP8_GRANULARITIES)}) "
                             f"and optionally w8a8, got {rest}")
        return FP8Config(fmt=kind[4:], granularity=gran[0] if gran else "channel", w8a8="w8a8" in opts)
    if kind in ("int8", "int4"):
        if len(opts) > 1:
            raise InputError(f"{kind} takes one granularity (channel or groupN), got {rest}")
        default = "channel" if kind == "int8" else "group128"
        return IntConfig(bits=int(kind[3:]), granularity=opts[0] if opts else default)
    if kind == "dtype":
        if len(opts) != 1:
            raise InputError("dtype needs one option: dtype:bf16 or dtype:fp16")
        return DtypeConfig(dtype=opts[0])
    if kind == "noise":
        try:
            (sigma,) = opts
            value = float(sigma)
        except ValueError:
            raise InputError(f"noise needs one number, e.g. noise:0.01; got {spec!r}") from None
        return NoiseConfig(sigma=value)
    if kind.startswith("bnb-"):
        _no_opts(kind, opts)
        if kind[4:] not in ("int8", "nf4", "fp4"):
            raise InputError(f"unknown kind {kind!r}; valid kinds: {', '.join(KINDS)}")
        return BnbConfig(method=kind[4:])
    if kind.startswith("quanto-"):
        bad = [o for o in opts if o != "a8"]
        if bad:
            raise InputError(f"{kind} takes only the option a8, got {','.join(bad)}")
        if kind[7:] not in ("int8", "int4", "fp8"):
            raise InputError(f"unknown kind {kind!r}; valid kinds: {', '.join(KINDS)}")
        return QuantoConfig(weights=kind[7:], activations="a8" in opts)
    if kind == "stale":
        try:
            (steps,) = opts
            value = int(steps)
        except ValueError:
            raise InputError(f"stale needs an integer number of steps, e.g. stale:4; got {spec!r}") from None
        return StaleConfig(steps=value)
    raise InputError(f"unknown perturbation kind {kind!r}; valid kinds: {', '.join(KINDS)}")
