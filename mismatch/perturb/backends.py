"""Real quantized modules from bitsandbytes and optimum-quanto, swapped in for linear layers.

bitsandbytes (0.50): `bnb-int8` is `Linear8bitLt` (LLM.int8(), outlier threshold 6.0, as
`transformers`' `BitsAndBytesConfig` defaults; it casts fp32 activations to fp16), `bnb-nf4` / `bnb-fp4` are `Linear4bit` with fp32
compute. Weights are quantized when the module is moved to its device (`.to("cpu")` runs the
CPU kernels here); modules run in eval mode, which `Linear8bitLt` needs to quantize activations.

optimum-quanto (0.2.7): `quanto-int8|int4|fp8` are `QLinear` with qint8 / qint4 / qfloat8 weights,
frozen. `:a8` adds qint8 activations, whose static scales quanto calibrates on data: pass
`calibration_ids`. Probes run under `torch.no_grad` (quanto's qint4 fails under
`torch.inference_mode`).

The original modules are never modified: each swap builds a new module from a copy of the
weights, and the snapshot keeps the original object for `restore_`.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from mismatch.errors import InputError
from mismatch.perturb.spec import BnbConfig, QuantoConfig

# LLM.int8() casts fp32 inputs to fp16 by design and warns on every call: known, documented above.
warnings.filterwarnings("ignore", message="MatMul8bitLt: inputs will be cast from")


def _as_linear(module: nn.Module, weight_out_in: torch.Tensor) -> nn.Linear:
    out_f, in_f = weight_out_in.shape
    lin = nn.Linear(in_f, out_f, bias=module.bias is not None, dtype=weight_out_in.dtype)
    with torch.no_grad():
        lin.weight.copy_(weight_out_in)
        if module.bias is not None:
            lin.bias.copy_(module.bias.detach())
    return lin


def _bnb_module(lin: nn.Linear, config: BnbConfig, device: torch.device) -> nn.Module:
    import bitsandbytes as bnb

    w = lin.weight.detach().clone()
    if config.method == "int8":
        q = bnb.nn.Linear8bitLt(lin.in_features, lin.out_features, bias=lin.bias is not None,
                                has_fp16_weights=False, threshold=6.0)
        q.weight = bnb.nn.Int8Params(w, requires_grad=False, has_fp16_weights=False)
    else:
        q = bnb.nn.Linear4bit(lin.in_features, lin.out_features, bias=lin.bias is not None,
                              compute_dtype=torch.float32, quant_type=config.method)
        q.weight = bnb.nn.Params4bit(w, requires_grad=False, quant_type=config.method)
    if lin.bias is not None:
        q.bias = nn.Parameter(lin.bias.detach().clone(), requires_grad=False)
    return q.to(device).eval()  # .to() quantizes


def _quanto_module(lin: nn.Linear, config: QuantoConfig) -> nn.Module:
    from optimum.quanto import QLinear, qfloat8, qint4, qint8

    weights = {"int8": qint8, "int4": qint4, "fp8": qfloat8}[config.weights]
    return QLinear.from_module(lin, weights=weights, activations=qint8 if config.activations else None).eval()


def swap_(model: nn.Module, config: BnbConfig | QuantoConfig, names: list[str], snap,
          calibration_ids: torch.Tensor | None = None) -> None:
    """Replace the named linear modules of `model` by quantized ones, recording originals in `snap`."""
    from mismatch.perturb.apply import weight_out_in

    if isinstance(config, QuantoConfig) and config.activations and calibration_ids is None:
        raise InputError(f"{config} quantizes activations with calibrated static scales: "
                         "pass calibration_ids (token ids [B, T]) to perturb")
    modules = dict(model.named_modules())
    device = next(model.parameters()).device
    swapped = []
    for name in names:
        module = modules[name]
        if module.weight.dtype != torch.float32 and isinstance(config, QuantoConfig):
            raise InputError(f"{config} expects an fp32 model, {name} is {module.weight.dtype}")
        lin = _as_linear(module, weight_out_in(module).float())
        q = _bnb_module(lin, config, device) if isinstance(config, BnbConfig) else _quanto_module(lin, config)
        parent_name, _, child = name.rpartition(".")
        parent = modules[parent_name] if parent_name else model
        snap.modules.append((parent, child, module))
        setattr(parent, child, q)
        swapped.append(q)
    if isinstance(config, QuantoConfig):
        if config.activations:
            from optimum.quanto import Calibration

            with torch.no_grad(), Calibration():
                model(input_ids=calibration_ids.to(device), use_cache=False)
        for q in swapped:
            q.freeze()
