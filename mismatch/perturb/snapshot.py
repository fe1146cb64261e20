"""What a perturbation replaced, and the swap primitives every perturbation kind writes through.

A perturbation never writes into the model's own tensors: it swaps in new `Parameter` objects,
new modules and forward hooks, and records each original here first. Putting
the originals back (`mismatch.perturb.apply.restore_`) is then exact by construction. This module
is shared by the torch-native kinds and the bitsandbytes / optimum-quanto backends; `weight_out_in`
is the one place that knows which layouts store a matrix `[in, out]`.

With `offload`, the values of each original are moved out of memory as soon as it is swapped out (an
accelerator's tensors to host memory, the CPU's to a temporary file) and read back by `restore_`: the model
then holds one copy of its weights while perturbed (the perturbed one) instead of two. The original
`Parameter` objects stay what they were (their `.data` is swapped for an empty tensor and back), so restoring
stays exact; a parameter the model still reaches under another name (a tied embedding) is never offloaded.
A CPU original that is a view of a memory-mapped checkpoint file (how transformers loads safetensors in the
checkpoint's own dtype) already lives in that file: it keeps its data, and its pages are handed back to the
kernel instead (`madvise(MADV_PAGEOUT)`, which preserves contents: a later read faults them in again).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle
from transformers.pytorch_utils import Conv1D

from mismatch.errors import InputError
from mismatch.model.moe import expert_bias_names, expert_tensor_names, is_experts


@dataclass(kw_only=True)
class Snapshot:
    """What `perturb_` replaced, to be put back by `restore_` (filled while perturbing).

    Attributes:
        spec: the canonical spec string of the perturbation (`str(config)`).
        layers: the layer scope as given.
        names: full names of the modules the scope selected, in model order.
        params: `(module, attribute, original Parameter)` for every swapped parameter.
        modules: `(parent, child name, original module)` for every swapped module.
        hooks: handles of the forward (pre-)hooks added.
        restored: whether `restore_` already ran.
        offload: move the originals' values out of memory while perturbed (`offload_`).
        shared: ids of the parameters the model reached under several names when perturbed (never offloaded).
        offloaded: `(parameter, where its values are: a host tensor or a file path, shape)` per offloaded one.
        offload_dir: the temporary directory of the CPU's offloaded values (removed by `reload_`).
    """

    spec: str
    layers: str
    names: list[str]
    params: list[tuple[nn.Module, str, nn.Parameter]] = field(default_factory=list)
    modules: list[tuple[nn.Module, str, nn.Module]] = field(default_factory=list)
    hooks: list[RemovableHandle] = field(default_factory=list)
    restored: bool = False
    offload: bool = False
    shared: frozenset[int] = frozenset()
    offloaded: list[tuple[nn.Parameter, torch.Tensor | str, torch.Size]] = field(default_factory=list)
    offload_dir: str | None = None


def weight_names(module: nn.Module) -> tuple[str, ...]:
    """The weight matrices of a selected module that a perturbation rewrites: `weight` of a linear layer
    or router, every 3-D expert tensor of an MoE experts module (`mismatch.model.moe`)."""
    return expert_tensor_names(module) if is_experts(module) else ("weight",)


def _is_in_out(module: nn.Module) -> bool:
    """Whether the module stores its matrices `[..., in, out]`: GPT-2's `Conv1D`, transposed experts."""
    return isinstance(module, Conv1D) or (is_experts(module) and module.is_transposed)


def weight_out_in(module: nn.Module, attr: str = "weight") -> torch.Tensor:
    """The matrix `attr` of a selected module as `[out, in]` (an experts tensor: `[E, out, in]`), detached;
    GPT-2's `Conv1D` stores `[in, out]`, GPT-OSS's experts `[E, in, out]`."""
    w = getattr(module, attr).detach()
    return w.transpose(-1, -2) if _is_in_out(module) else w


def bias_names(module: nn.Module) -> tuple[str, ...]:
    """The biases beside `weight_names(module)` (a linear's `bias`, GPT-OSS experts' `<tensor>_bias`)."""
    if is_experts(module):
        return expert_bias_names(module)
    return ("bias",) if isinstance(getattr(module, "bias", None), nn.Parameter) else ()


def named_targets(model: nn.Module, names: list[str]) -> list[tuple[str, nn.Module]]:
    """`(name, module)` for each of `names` (full module names of `model`), in that order."""
    modules = dict(model.named_modules())
    return [(name, modules[name]) for name in names]


def swap_param_(snap: Snapshot, module: nn.Module, name: str, value: torch.Tensor) -> None:
    """Replace `module.<name>` by a new frozen `Parameter` holding `value`; record the original."""
    original = getattr(module, name)
    snap.params.append((module, name, original))
    setattr(module, name, nn.Parameter(value, requires_grad=False))
    offload_(snap, original)


def swap_weight_(snap: Snapshot, module: nn.Module, new_out_in: torch.Tensor, attr: str = "weight") -> None:
    """Replace the matrix `attr` of a selected module by `new_out_in` (`[..., out, in]`, stored back in the
    module's own layout)."""
    value = new_out_in.transpose(-1, -2).contiguous() if _is_in_out(module) else new_out_in
    swap_param_(snap, module, attr, value)


def swap_module_(snap: Snapshot, model: nn.Module, name: str, new: nn.Module) -> None:
    """Replace the submodule `name` (a full module name) of `model` by `new`; record the original."""
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    original = getattr(parent, child)
    snap.modules.append((parent, child, original))
    setattr(parent, child, new)
    kept = {id(p) for p in new.parameters()}  # a backend's module may reuse an original (a bias)
    for param in original.parameters():
        if id(param) not in kept:
            offload_(snap, param)


def offload_(snap: Snapshot, param: nn.Parameter) -> None:
    """With `snap.offload`, move the values of `param` (an original just swapped out) out of memory: to host
    memory from an accelerator, to a file in `snap.offload_dir` from the CPU; `param.data` becomes an empty
    tensor until `reload_`. Parameters the model still reaches (`snap.shared`) and non-contiguous ones stay."""
    if not snap.offload or id(param) in snap.shared or not param.is_contiguous() or param.numel() == 0:
        return
    data = param.data
    if data.device.type == "cpu":
        trim_heap()  # what the rounding of this one left freed in the heap, before the next one's temporaries
        if _page_out(data):
            return
    if data.device.type == "cpu":
        if snap.offload_dir is None:
            snap.offload_dir = tempfile.mkdtemp(prefix="mismatch-offload-")
        where: torch.Tensor | str = os.path.join(snap.offload_dir, f"{len(snap.offloaded)}.bin")
        try:
            data.reshape(-1).view(torch.uint8).numpy().tofile(where)
        except OSError as exc:  # a full disk: the original stays in memory, the part written goes
            if os.path.exists(where):
                os.unlink(where)
            raise InputError(f"cannot offload the original weights to {snap.offload_dir} ({exc.strerror}): free "
                             "disk space there, point TMPDIR elsewhere, or turn offloading off") from None
    else:
        where = data.to("cpu", copy=True)
    snap.offloaded.append((param, where, data.shape))
    param.data = torch.empty(0, dtype=data.dtype, device=data.device)


MADV_PAGEOUT = 21  # Linux ≥ 5.4, <linux/mman.h> (Python's `mmap` module does not name it)


def _file_mappings() -> list[tuple[int, int]]:
    """`(start, end)` of this process's mappings of regular files (/proc/self/maps), Linux only."""
    spans = []
    for line in open("/proc/self/maps"):
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5].startswith("/") and not fields[5].startswith("/dev/"):
            start, end = (int(x, 16) for x in fields[0].split("-"))
            spans.append((start, end))
    return spans


def _page_out(data: torch.Tensor) -> bool:
    """Hand the pages of `data` back to the kernel if it is a view of a memory-mapped file (contents are
    preserved: the pages are read again from the file, or from swap for pages written since); whether it was.
    Only the pages wholly inside `data` are advised (a hint: pages still dirty in the page cache, a checkpoint
    just written, stay until written back); other platforms: never."""
    if not sys.platform.startswith("linux"):
        return False
    start, size = data.data_ptr(), data.numel() * data.element_size()
    if not any(lo <= start and start + size <= hi for lo, hi in _file_mappings()):
        return False
    page = os.sysconf("SC_PAGE_SIZE")
    first, last = -(-start // page) * page, (start + size) // page * page
    if last > first:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise(ctypes.c_void_p(first), ctypes.c_size_t(last - first), MADV_PAGEOUT)  # a hint: failure is harmless
    return True


def trim_heap() -> None:
    """Return the heap's free memory to the kernel (glibc's `malloc_trim`): the perturbed copies just freed
    would otherwise stay resident in its arenas (tensors below its dynamic mmap threshold, ≤ 32 MiB, live
    there), beside the originals coming back. Elsewhere: nothing."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None).malloc_trim(0)
        except AttributeError:  # not glibc (musl)
            pass


def reload_(snap: Snapshot) -> None:
    """Put the offloaded originals' values back (`offload_`), bitwise, and remove the temporary directory.
    Called by `restore_` after the perturbed copies are swapped out: with offloading, the heap they leave is
    returned first (`trim_heap`)."""
    if snap.offload:
        trim_heap()
    for param, where, shape in snap.offloaded:
        if isinstance(where, str):
            values = torch.empty(shape, dtype=param.dtype)
            with open(where, "rb") as f:
                f.readinto(memoryview(values.reshape(-1).view(torch.uint8).numpy()))
            os.unlink(where)
        else:
            values = where.to(param.device).view(shape)
        param.data = values
    snap.offloaded.clear()
    if snap.offload_dir is not None:
        shutil.rmtree(snap.offload_dir, ignore_errors=True)
        snap.offload_dir = None
