"""Where the toolkit computes: one rule for `device=` (API) and `--device` (CLI), and the random streams
that follow a model onto it.

`"auto"` is CUDA when present, else the CPU; `"cpu"`, `"cuda"` and `"cuda:N"` ask for that device and fail
in one line where it is absent. `"balanced"` spreads a checkpoint larger than one GPU over every visible CUDA
device with accelerate's device map (`spread`), for the commands that only read a model (`load`, `check`,
`probe`, `score-rollouts`); its batches enter on the first device. The CPU stays the default everywhere, so nothing changes for results made
without a device. Batches are assembled on the CPU and moved to the model's device where a model reads
them; what the toolkit allocates beside a model's output follows that output's device.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from mismatch.errors import InputError

DEVICES = "auto, cpu, cuda, cuda:N, balanced"
BALANCED = "balanced"  # every visible CUDA device, one part of the model on each (accelerate's device map)


def resolve_device(device: str | torch.device | None = "cpu") -> torch.device:
    """`device` as a `torch.device`: `"auto"` (CUDA when present, else CPU), `"cpu"`, `"cuda"`, `"cuda:N"` or
    a `torch.device`; None is the CPU.

    Raises:
        InputError: an unknown name, or CUDA asked for where none (or not device N) is present.
    """
    if device is None:
        return torch.device("cpu")
    if isinstance(device, str) and device.strip().lower() == "auto":
        return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    if is_balanced(device):  # where its batches enter: the first device
        if not torch.cuda.is_available():
            raise InputError(f"device {device!r} spreads a model over CUDA devices: none is present here "
                             "(use --device cpu or auto)")
        return torch.device("cuda", 0)
    try:
        dev = torch.device(device.strip().lower() if isinstance(device, str) else device)
    except (RuntimeError, TypeError):
        raise InputError(f"unknown device {device!r}; valid: {DEVICES}") from None
    if dev.type not in ("cpu", "cuda"):
        raise InputError(f"unknown device {device!r}; valid: {DEVICES}")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise InputError(f"device {device!r}: no CUDA device is present here (use --device cpu or auto)")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise InputError(f"device {device!r}: only {torch.cuda.device_count()} CUDA device(s) present")
    return dev


def is_balanced(device: object) -> bool:
    """Whether `device` asks for the model spread over every CUDA device (`"balanced"`)."""
    return isinstance(device, str) and device.strip().lower() == BALANCED


def spread(model: torch.nn.Module, device_map: dict[str, str | int | torch.device] | None = None, *,
           hooks: bool = False) -> torch.nn.Module:
    """Place `model` (its weights in CPU memory) across devices with accelerate's `dispatch_model`: each
    module's weights move once to their device and hooks carry the activations between devices, so a
    perturbation still acts in place on the one copy of the weights and its restore is still bitwise.

    Args:
        model: a loaded causal LM.
        device_map: module name → device; None: accelerate's balanced map over every visible CUDA device,
            whole decoder blocks on one device each.
        hooks: attach the hooks even when every module lands on one device (what a test on one device does to
            run the multi-device code path).

    Raises:
        InputError: no CUDA device for a balanced map, or a map that leaves weights off the devices ("cpu",
            "disk" offload: a weight the hooks reload at every forward would not keep the perturbation).
    """
    from accelerate import dispatch_model, infer_auto_device_map  # only here: `import mismatch` stays light
    from accelerate.utils import get_balanced_memory

    if device_map is None:
        if not torch.cuda.is_available():
            raise InputError("a balanced device map spreads a model over CUDA devices: none is present here")
        free = {i: torch.cuda.mem_get_info(i)[0] for i in range(torch.cuda.device_count())}
        blocks = getattr(model, "_no_split_modules", None) or []
        budget = get_balanced_memory(model, max_memory=free, no_split_module_classes=blocks)
        device_map = infer_auto_device_map(model, max_memory=budget, no_split_module_classes=blocks)
        off = sorted({str(v) for v in device_map.values() if not isinstance(v, int) and str(v) in ("cpu", "disk")})
        if off:
            need = sum(p.numel() * p.element_size() for p in model.parameters()) / 2 ** 30
            raise InputError(f"the model ({need:.1f} GiB of weights) does not fit on the {len(free)} CUDA device(s) "
                             f"({sum(free.values()) / 2 ** 30:.1f} GiB free): parts would go to {', '.join(off)}, "
                             "where a perturbation does not stay in place")
    else:
        for name, where in device_map.items():
            if str(where) in ("disk", "meta"):
                raise InputError(f"device map puts {name or 'the model'} on {where}: a perturbation needs the weights "
                                 "resident (cpu or cuda)")
            if not isinstance(where, int):
                resolve_device(where)  # a bad or absent device fails in one line
    return dispatch_model(model, device_map=device_map, force_hooks=hooks)


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of `model`'s first parameter (the CPU for a model without parameters)."""
    return next((p.device for p in model.parameters()), torch.device("cpu"))


@contextlib.contextmanager
def seeded(seed: int, device: torch.device) -> Iterator[None]:
    """Seed torch's random streams for a block on `device` (the CPU's, and the CUDA device's where `device`
    is one) and give every stream back as it was: the same seed draws the same samples on the same device,
    and the caller's random state is untouched."""
    cuda = [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda, device_type="cuda"):
        torch.manual_seed(seed)  # seeds the CPU and every CUDA device
        yield
