"""Where the toolkit computes: one rule for `device=` (API) and `--device` (CLI), and the random streams
that follow a model onto it.

`"auto"` is CUDA when present, else the CPU; `"cpu"`, `"cuda"` and `"cuda:N"` ask for that device and fail
in one line where it is absent. The CPU stays the default everywhere, so nothing changes for results made
without a device. Batches are assembled on the CPU and moved to the model's device where a model reads
them; what the toolkit allocates beside a model's output follows that output's device.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from mismatch.errors import InputError

DEVICES = "auto, cpu, cuda, cuda:N"


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
