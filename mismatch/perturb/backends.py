"""Real quantized modules from bitsandbytes and optimum-quanto, swapped in for linear layers.

bitsandbytes (0.50): `bnb-int8` is `Linear8bitLt` (LLM.int8(), outlier threshold 6.0, as
`transformers`' `BitsAndBytesConfig` defaults; it casts fp32 activations to fp16), `bnb-nf4` /
`bnb-fp4` are `Linear4bit` with fp32 compute. Weights are quantized when the module is moved to
its device (`.to("cpu")` runs the CPU kernels here); modules run in eval mode, which
`Linear8bitLt` needs to quantize activations. LLM.int8() announces that cast on every call through
`logging` (not `warnings`): a logging filter drops that one notice around each swapped module's
forward only (a pre-hook adds it, a post-hook that runs even when forward raises removes it).

optimum-quanto (0.2.7): `quanto-int8|int4|fp8` are `QLinear` with qint8 / qint4 / qfloat8 weights,
frozen. `:a8` adds qint8 activations, whose static scales quanto calibrates on data: pass
`calibration_ids`. Probes run under `torch.no_grad` (quanto's qint4 fails under
`torch.inference_mode`).

Both quantize `nn.Linear` layers only: a scope holding an MoE experts module (3-D expert tensors)
or an MoE router (not an `nn.Linear`) is refused, naming the tensor, before anything is swapped.

The original modules are never modified: each swap builds a new module from a copy of the
weights, and the snapshot keeps the original object for `restore_`. Registers `bnb-int8|nf4|fp4`
and `quanto-int8|int4|fp8`.
"""

from __future__ import annotations

import copy
import logging
import types

import torch
from torch import nn

from mismatch.errors import InputError
from mismatch.model.device import model_device
from mismatch.perturb.configs import BnbConfig, QuantoConfig
from mismatch.perturb.registry import ApplyContext
from mismatch.perturb.scope import is_linear
from mismatch.perturb.snapshot import Snapshot, named_targets, swap_module_, weight_names, weight_out_in

# bitsandbytes 0.50 logs "MatMul8bitLt: inputs will be cast from torch.float32 to float16 during
# quantization" (logger.warning) on every Linear8bitLt call with non-fp16 inputs.
_INT8_CAST_LOGGER = logging.getLogger("bitsandbytes.autograd._functions")
INT8_CAST_NOTICE = "MatMul8bitLt: inputs will be cast from"


class _DropInt8CastNotice(logging.Filter):
    """Drops LLM.int8()'s fp32 → fp16 cast notice (known and documented above), nothing else."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(INT8_CAST_NOTICE)


_DROP_INT8_CAST_NOTICE = _DropInt8CastNotice()


def _quiet_int8_cast_(snap: Snapshot, module: nn.Module) -> None:
    """Drop the cast notice while `module` runs forward, and only then."""

    def pre_hook(_module, _args) -> None:
        _INT8_CAST_LOGGER.addFilter(_DROP_INT8_CAST_NOTICE)

    def post_hook(_module, _args, _output) -> None:
        _INT8_CAST_LOGGER.removeFilter(_DROP_INT8_CAST_NOTICE)

    snap.hooks.append(module.register_forward_pre_hook(pre_hook))
    snap.hooks.append(module.register_forward_hook(post_hook, always_call=True))


def _linear_targets(config, model: nn.Module, names: list[str]) -> list[tuple[str, nn.Module]]:
    """`named_targets`, each checked to be a linear layer.

    Raises:
        InputError: an MoE experts module or router among them (named with its tensor's shape).
    """
    targets = named_targets(model, names)
    for name, module in targets:
        if not is_linear(module):
            attr = weight_names(module)[0]
            shape = list(getattr(module, attr).shape)
            raise InputError(f"{config} quantizes nn.Linear layers only, not {name}.{attr} {shape} "
                             f"({type(module).__name__}); use a torch-native kind (int4:group128, fp8-e4m3:channel) "
                             "or a scope without MoE experts and routers (attn)")
    return targets


def _as_linear(module: nn.Module) -> nn.Linear:
    """A plain fp32 `nn.Linear` holding a copy of a linear layer's weight (`[out, in]`) and bias."""
    w = weight_out_in(module).float()
    out_f, in_f = w.shape
    lin = nn.Linear(in_f, out_f, bias=module.bias is not None, dtype=w.dtype)
    with torch.no_grad():
        lin.weight.copy_(w)
        if module.bias is not None:
            lin.bias.copy_(module.bias.detach())
    return lin


def _bnb_module(lin: nn.Linear, config: BnbConfig, device: torch.device) -> nn.Module:
    import bitsandbytes as bnb  # heavy optional backend: imported on first use

    w = lin.weight.detach().clone()
    if config.method == "int8":
        q = bnb.nn.Linear8bitLt(lin.in_features, lin.out_features, bias=lin.bias is not None,
                                has_fp16_weights=False, threshold=6.0)
        q.weight = bnb.nn.Int8Params(w, requires_grad=False, has_fp16_weights=False)
    else:
        q = bnb.nn.Linear4bit(lin.in_features, lin.out_features, bias=lin.bias is not None,
                              compute_dtype=torch.float32, quant_type=config.method)
        q.weight = bnb.nn.Params4bit(w, requires_grad=False, quant_type=config.method)
        # On AVX512-BF16 CPUs bitsandbytes 0.50 repacks the weight at the first forward: it asserts
        # out_features % 32 == 0 (any other layer fails) and stores the absmax scales in bf16, a
        # different quantization than on other CPUs or CUDA. Its generic path: one format everywhere.
        q.support_avx512bf16_for_cpu = False
    if lin.bias is not None:
        q.bias = nn.Parameter(lin.bias.detach().clone(), requires_grad=False)
    q = q.to(device).eval()  # .to() quantizes
    if config.method != "int8" and device.type == "cpu" and lin.in_features % q.weight.quant_state.blocksize:
        q.forward = types.MethodType(_flat_dequant_forward, q)
    return q


def _flat_dequant_forward(self, x: torch.Tensor) -> torch.Tensor:
    """`Linear4bit.forward` on the CPU when `in_features` is not a multiple of the block size.

    bitsandbytes (0.50.2) quantizes the flattened weight in blocks of 64 values, so a block spans
    rows when a row is not a multiple of 64 long; its CPU `dequantize_4bit` then reads the wrong
    scales for those blocks (measured: 40% relative weight error for a [144, 48] weight, against
    9% for NF4 computed by hand, which is what it gives when the rows divide). Dequantizing the
    flat tensor with the same `quant_state` is right: this forward does that with bitsandbytes' own
    `dequantize_4bit`, then the same fp32 matmul its generic CPU path runs."""
    import bitsandbytes as bnb

    state = copy.copy(self.weight.quant_state)
    state.shape = torch.Size([self.out_features * self.in_features])
    weight = bnb.functional.dequantize_4bit(self.weight.data, state).view(self.out_features, self.in_features)
    return torch.nn.functional.linear(x.to(weight.dtype), weight, self.bias).to(x.dtype)


def _apply_bnb_(config: BnbConfig, model: nn.Module, names: list[str], snap: Snapshot,
                ctx: ApplyContext) -> None:
    device = model_device(model)
    for name, module in _linear_targets(config, model, names):
        q = _bnb_module(_as_linear(module), config, device)
        if config.method == "int8":
            _quiet_int8_cast_(snap, q)
        swap_module_(snap, model, name, q)


def _apply_quanto_(config: QuantoConfig, model: nn.Module, names: list[str], snap: Snapshot,
                   ctx: ApplyContext) -> None:
    from optimum.quanto import Calibration, QLinear, qfloat8, qint4, qint8  # heavy optional backend

    if config.activations and ctx.calibration_ids is None:
        raise InputError(f"{config} quantizes activations with calibrated static scales: "
                         "pass calibration_ids (token ids [B, T]) to perturb")
    targets = _linear_targets(config, model, names)
    for name, module in targets:
        if module.weight.dtype != torch.float32:
            raise InputError(f"{config} expects an fp32 model, {name} is {module.weight.dtype}")
    device = model_device(model)
    weights = {"int8": qint8, "int4": qint4, "fp8": qfloat8}[config.weights]
    swapped = []
    for name, module in targets:
        q = QLinear.from_module(_as_linear(module), weights=weights,
                                activations=qint8 if config.activations else None).eval()
        swap_module_(snap, model, name, q)
        swapped.append(q)
    if config.activations:
        with torch.no_grad(), Calibration():
            model(input_ids=ctx.calibration_ids.to(device), use_cache=False)
    for q in swapped:
        q.freeze()
