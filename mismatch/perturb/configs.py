"""Frozen configs of the perturbation kinds, each with its parser and its spec string.

A spec is `KIND[:OPT[,OPT…]]` (docs/design.md "Perturbation specs"). Each config class parses itself
from the parts of a spec (`from_spec`) and prints back its canonical spec (`__str__`), so
`parse_spec(str(config)) == config`; it flattens to result columns with `dataclasses.asdict`.
Which kinds exist, and what runs for each, is the registry's business (`mismatch.perturb.registry`);
this module holds data and validation only (no torch).
"""

from __future__ import annotations

from dataclasses import dataclass

from mismatch.errors import InputError

FP8_GRANULARITIES = ("tensor", "channel", "block128")


@dataclass(frozen=True, kw_only=True)
class SpecText:
    """The parts of a spec string: `spec` (stripped), `kind`, the raw option text `rest`, `options`."""

    spec: str
    kind: str
    rest: str
    options: tuple[str, ...]

    @classmethod
    def split(cls, spec: str) -> SpecText:
        """Split `KIND[:OPT[,OPT…]]`; docs/design.md's `quanto-int8,a8` spelling means `quanto-int8:a8`."""
        spec = spec.strip()
        if spec.startswith("quanto-") and ":" not in spec and "," in spec:
            spec = spec.replace(",", ":", 1)
        kind, _, rest = spec.partition(":")
        options = tuple(o.strip() for o in rest.split(",") if o.strip()) if rest else ()
        return cls(spec=spec, kind=kind, rest=rest, options=options)

    def no_options(self) -> None:
        """Raise `InputError` if the spec has options."""
        if self.options:
            raise InputError(f"{self.kind} takes no options, got {','.join(self.options)}")


@dataclass(frozen=True, kw_only=True)
class FP8Config:
    """Weights rounded through an FP8 dtype (`fmt` e4m3 | e5m2) with an absmax scale."""

    fmt: str
    granularity: str = "channel"
    w8a8: bool = False
    scaled_mm: bool = False  # the GEMM on FP8 operands (`torch._scaled_mm`), not de-quantized: needs w8a8

    def __post_init__(self) -> None:
        if self.fmt not in ("e4m3", "e5m2"):
            raise InputError(f"unknown FP8 format {self.fmt!r}; valid: e4m3, e5m2")
        if self.granularity not in FP8_GRANULARITIES:
            raise InputError(f"unknown FP8 scale {self.granularity!r}; valid: {', '.join(FP8_GRANULARITIES)}")
        if self.scaled_mm and not self.w8a8:
            raise InputError(f"fp8-{self.fmt}:{self.granularity},scaled_mm multiplies FP8 activations: give w8a8 too "
                             f"(fp8-{self.fmt}:{self.granularity},w8a8,scaled_mm)")

    @classmethod
    def from_spec(cls, text: SpecText) -> FP8Config:
        gran = [o for o in text.options if o not in ("w8a8", "scaled_mm")]
        if len(gran) > 1:
            raise InputError(f"{text.kind} takes one scale granularity ({', '.join(FP8_GRANULARITIES)}) "
                             f"and optionally w8a8 and scaled_mm, got {text.rest}")
        return cls(fmt=text.kind[4:], granularity=gran[0] if gran else "channel", w8a8="w8a8" in text.options,
                   scaled_mm="scaled_mm" in text.options)

    def __str__(self) -> str:
        return (f"fp8-{self.fmt}:{self.granularity}" + (",w8a8" if self.w8a8 else "")
                + (",scaled_mm" if self.scaled_mm else ""))

    @property
    def weight_bits(self) -> float:
        """Stored bits per weight: 8 (one fp32 scale per tensor, row or 128×128 block adds < 0.01)."""
        return 8.0


INT_BITS = (8, 4, 3, 2)


@dataclass(frozen=True, kw_only=True)
class IntConfig:
    """Symmetric integer rounding: `bits` 8 | 4 | 3 | 2 (2 bits: the ternary {−1, 0, 1}·s), `granularity`
    channel | groupN."""

    bits: int
    granularity: str

    def __post_init__(self) -> None:
        if self.bits not in INT_BITS:
            raise InputError(f"integer rounding supports {', '.join(map(str, INT_BITS))} bits, got {self.bits}")
        if self.granularity != "channel" and not (
                self.granularity.startswith("group") and self.granularity[5:].isdigit()
                and int(self.granularity[5:]) > 0):
            raise InputError(f"unknown integer granularity {self.granularity!r}; "
                             "valid: channel, groupN (e.g. group128)")

    @property
    def group_size(self) -> int | None:
        """Input columns per scale; None for one scale per output channel."""
        return None if self.granularity == "channel" else int(self.granularity[5:])

    @classmethod
    def from_spec(cls, text: SpecText) -> IntConfig:
        if len(text.options) > 1:
            raise InputError(f"{text.kind} takes one granularity (channel or groupN), got {text.rest}")
        default = "channel" if text.kind == "int8" else "group128"
        return cls(bits=int(text.kind[3:]), granularity=text.options[0] if text.options else default)

    def __str__(self) -> str:
        return f"int{self.bits}:{self.granularity}"

    @property
    def weight_bits(self) -> float:
        """Stored bits per weight, with one fp16 scale per group (`groupN`: bits + 16/N)."""
        group = self.granularity.removeprefix("group")
        return self.bits + (16 / int(group) if group.isdigit() else 0.0)


@dataclass(frozen=True, kw_only=True)
class DtypeConfig:
    """Targeted linear layers run in a lower float precision (`dtype` bf16 | fp16)."""

    dtype: str

    def __post_init__(self) -> None:
        if self.dtype not in ("bf16", "fp16"):
            raise InputError(f"unknown dtype {self.dtype!r}; valid: bf16, fp16")

    @classmethod
    def from_spec(cls, text: SpecText) -> DtypeConfig:
        if len(text.options) != 1:
            raise InputError("dtype needs one option: dtype:bf16 or dtype:fp16")
        return cls(dtype=text.options[0])

    def __str__(self) -> str:
        return f"dtype:{self.dtype}"

    @property
    def weight_bits(self) -> float:
        """Stored bits per weight: 16."""
        return 16.0


@dataclass(frozen=True, kw_only=True)
class NoiseConfig:
    """Gaussian weight noise of relative size `sigma` (times each tensor's rms)."""

    sigma: float

    def __post_init__(self) -> None:
        if not self.sigma >= 0:
            raise InputError(f"noise sigma must be ≥ 0, got {self.sigma}")

    @classmethod
    def from_spec(cls, text: SpecText) -> NoiseConfig:
        try:
            (sigma,) = text.options
            value = float(sigma)
        except ValueError:
            raise InputError(f"noise needs one number, e.g. noise:0.01; got {text.spec!r}") from None
        return cls(sigma=value)

    def __str__(self) -> str:
        return f"noise:{self.sigma:g}"


@dataclass(frozen=True, kw_only=True)
class BnbConfig:
    """A bitsandbytes module (`method` int8 | nf4 | fp4)."""

    method: str

    def __post_init__(self) -> None:
        if self.method not in ("int8", "nf4", "fp4"):
            raise InputError(f"unknown bitsandbytes method {self.method!r}; valid: int8, nf4, fp4")

    @classmethod
    def from_spec(cls, text: SpecText) -> BnbConfig:
        text.no_options()
        return cls(method=text.kind[4:])

    def __str__(self) -> str:
        return f"bnb-{self.method}"

    @property
    def weight_bits(self) -> float:
        """Stored bits per weight: int8 8; nf4/fp4 4 + 8/64 + 32/(64·256) (blocks of 64 with
        double-quantized absmax, bitsandbytes' `Linear4bit` default)."""
        return 8.0 if self.method == "int8" else 4 + 8 / 64 + 32 / (64 * 256)


@dataclass(frozen=True, kw_only=True)
class QuantoConfig:
    """An optimum-quanto module (`weights` int8 | int4 | fp8), optionally with qint8 activations."""

    weights: str
    activations: bool = False

    def __post_init__(self) -> None:
        if self.weights not in ("int8", "int4", "fp8"):
            raise InputError(f"unknown quanto weights {self.weights!r}; valid: int8, int4, fp8")

    @classmethod
    def from_spec(cls, text: SpecText) -> QuantoConfig:
        bad = [o for o in text.options if o != "a8"]
        if bad:
            raise InputError(f"{text.kind} takes only the option a8, got {','.join(bad)}")
        return cls(weights=text.kind[7:], activations="a8" in text.options)

    def __str__(self) -> str:
        return f"quanto-{self.weights}" + (":a8" if self.activations else "")

    @property
    def weight_bits(self) -> float:
        """Stored bits per weight: int8 / fp8 8; int4 4 + 32/128 (groups of 128 with an fp16 scale and shift)."""
        return 4 + 32 / 128 if self.weights == "int4" else 8.0


PerturbConfig = FP8Config | IntConfig | DtypeConfig | NoiseConfig | BnbConfig | QuantoConfig
