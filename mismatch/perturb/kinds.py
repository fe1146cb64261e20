"""The built-in perturbation kinds, registered once each (`mismatch.perturb.registry`): their spec names,
configs, parsers, docs rows and the handlers that realise them, named `"module:function"` so that this module —
and with it every spec's parsing and validation — imports no torch. The handlers live in `native` (torch rounding,
dtype, noise) and `backends` (bitsandbytes, optimum-quanto) and load when a kind is first applied."""

from __future__ import annotations

from mismatch.perturb.configs import BnbConfig, DtypeConfig, FP8Config, IntConfig, NoiseConfig, QuantoConfig
from mismatch.perturb.registry import Backend, Kind, register_kind

register_kind(Kind(
    names=("fp8-e4m3", "fp8-e5m2"), config=FP8Config, parse=FP8Config.from_spec, apply="mismatch.perturb.native:_apply_fp8_",
    backend=Backend.TORCH, usage=("fp8-e4m3:tensor|channel|block128", "fp8-e5m2:…", "…,w8a8", "…,w8a8,scaled_mm"),
    description="weights rounded through `torch.float8_e4m3fn` / `float8_e5m2` with an absmax scale per tensor / "
                "output channel / 128×128 block (saturating), de-quantized, fp32 matmul; `w8a8` adds dynamic "
                "FP8 rounding of every targeted linear's input, per token (and per 128 columns for block128, as "
                "vLLM's block FP8); `w8a8,scaled_mm` runs the same operands on the real FP8 GEMM "
                "(`torch._scaled_mm`: `mismatch.perturb.fp8_gemm`)",
    examples=("fp8-e4m3:tensor", "fp8-e4m3:channel", "fp8-e4m3:block128", "fp8-e4m3:channel,w8a8",
              "fp8-e5m2:channel", "fp8-e5m2:block128,w8a8", "fp8-e4m3:channel,w8a8,scaled_mm",
              "fp8-e4m3:block128,w8a8,scaled_mm")))

register_kind(Kind(
    names=("int8", "int4", "int3", "int2"), config=IntConfig, parse=IntConfig.from_spec, apply="mismatch.perturb.native:_apply_int_",
    backend=Backend.TORCH, usage=("int8:channel", "int4:group128", "int3:…", "int2:…", "…:groupN"),
    description="symmetric integer rounding in torch, one absmax scale per output channel or per group of N "
                "input columns (int2: the ternary {−1, 0, 1}·scale)",
    examples=("int8:channel", "int4:group128", "int4:group32", "int8:group128", "int4:channel", "int3:group32",
              "int2:group32")))

register_kind(Kind(
    names=("dtype",), config=DtypeConfig, parse=DtypeConfig.from_spec, apply="mismatch.perturb.native:_apply_dtype_",
    backend=Backend.TORCH, usage=("dtype:bf16", "dtype:fp16"),
    description="targeted linears run in that dtype (weights cast, inputs cast, outputs cast back)",
    examples=("dtype:bf16", "dtype:fp16")))

register_kind(Kind(
    names=("noise",), config=NoiseConfig, parse=NoiseConfig.from_spec, apply="mismatch.perturb.native:_apply_noise_",
    backend=Backend.TORCH, usage=("noise:SIGMA",),
    description="W ← W + σ·rms(W)·ε per weight tensor, ε ~ N(0, 1) from a generator seeded by `seed`",
    examples=("noise:0", "noise:0.03", "noise:1e-05")))

register_kind(Kind(
    names=("bnb-int8", "bnb-nf4", "bnb-fp4"), config=BnbConfig, parse=BnbConfig.from_spec, apply="mismatch.perturb.backends:_apply_bnb_",
    backend=Backend.BITSANDBYTES, usage=("bnb-int8", "bnb-nf4", "bnb-fp4"),
    description="real bitsandbytes `Linear8bitLt` (LLM.int8(), threshold 6; fp32 activations cast to fp16) / "
                "`Linear4bit` (fp32 compute)",
    examples=("bnb-int8", "bnb-nf4", "bnb-fp4")))

register_kind(Kind(
    names=("quanto-int8", "quanto-int4", "quanto-fp8"), config=QuantoConfig, parse=QuantoConfig.from_spec,
    apply="mismatch.perturb.backends:_apply_quanto_", backend=Backend.QUANTO, usage=("quanto-int8", "quanto-int4", "quanto-fp8", "…:a8"),
    description="real optimum-quanto `QLinear` with qint8 / qint4 / qfloat8 weights; `:a8` adds qint8 activations "
                "whose static scales are calibrated on `calibration_ids` (the probed batch)",
    examples=("quanto-int8", "quanto-int4", "quanto-fp8", "quanto-int8:a8", "quanto-fp8:a8")))
