"""Apply a perturbation to a model in place, and restore it bit for bit.

A perturbation never writes into the model's own tensors: it swaps in new `Parameter` objects
(rounded, noised or cast weights), new modules (bitsandbytes / optimum-quanto layers) and
forward hooks (activation rounding, dtype casts). The `Snapshot` keeps the original objects, so
`restore_` puts back exactly what was there — bitwise by construction, also for tied weights
(perturbing `lm_head` of a tied model leaves the embedding untouched) — and it runs in
`finally` when `perturbed(...)`'s body raises. Per-layer isolation (`layers="7"`) touches only
that block's modules: no reload, no deep copy.

`perturb_` dispatches on the config's type through the kind registry
(`mismatch.perturb.registry`); it also records the snapshot on the model, so that
`active_perturbations` / `is_perturbed` can tell (read-only) whether a model is perturbed in place.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from mismatch.perturb.registry import ApplyContext, kind_of
from mismatch.perturb.scope import select
from mismatch.perturb.snapshot import Snapshot, reload_, trim_heap
from mismatch.perturb.spec import PerturbConfig, parse_spec

# Key in `model.__dict__` (not a registered attribute, so never in `state_dict` or `named_modules`)
# holding the tuple of snapshots applied in place and not yet restored; absent when there are none.
ACTIVE_PERTURBATIONS_KEY = "_mismatch_active_perturbations"


def active_perturbations(model: nn.Module) -> tuple[Snapshot, ...]:
    """Snapshots of the perturbations currently applied to `model` in place, oldest first.

    Read-only: it never creates state on the model (an unperturbed model gives `()`).
    """
    return model.__dict__.get(ACTIVE_PERTURBATIONS_KEY, ())


def is_perturbed(model: nn.Module) -> bool:
    """Whether some perturbation is currently applied to `model` in place (read-only)."""
    return bool(active_perturbations(model))


def _mark_active(model: nn.Module, snap: Snapshot) -> None:
    model.__dict__[ACTIVE_PERTURBATIONS_KEY] = (*active_perturbations(model), snap)


def _unmark_active(model: nn.Module, snap: Snapshot) -> None:
    rest = tuple(s for s in active_perturbations(model) if s is not snap)
    if rest:
        model.__dict__[ACTIVE_PERTURBATIONS_KEY] = rest
    else:
        model.__dict__.pop(ACTIVE_PERTURBATIONS_KEY, None)


def perturb_(model: nn.Module, config: PerturbConfig | str, layers: str = "linear",
             seed: int = 0, calibration_ids: torch.Tensor | None = None, offload: bool = False) -> Snapshot:
    """Perturb `model` in place; return the `Snapshot` that `restore_` needs.

    Args:
        model: a `transformers` causal LM.
        config: a perturbation config or spec string (`mismatch.perturb.spec`).
        layers: layer scope (`mismatch.perturb.scope`).
        seed: seed of the noise generator (`noise:SIGMA`).
        calibration_ids: `[B, T]` token ids to calibrate static activation scales
            (`quanto-…:a8` only).
        offload: move each replaced original's values out of memory while perturbed (an accelerator's to
            host memory, the CPU's to a temporary file; `mismatch.perturb.snapshot.offload_`), so the
            model holds one copy of its weights instead of two; `restore_` reads them back, bitwise.

    Raises:
        InputError: unknown spec or scope, `stale:K` outside an OPD run, or a backend that
            cannot run this spec here. The model is restored before it propagates.
    """
    config = parse_spec(config) if isinstance(config, str) else config
    kind = kind_of(config)
    names = select(model, layers)
    snap = Snapshot(spec=str(config), layers=layers, names=names, offload=offload)
    if offload:  # a parameter reached under two names (tied weights) stays in memory when one is swapped
        seen: dict[int, int] = {}
        for _, param in model.named_parameters(remove_duplicate=False):
            seen[id(param)] = seen.get(id(param), 0) + 1
        snap.shared = frozenset(i for i, n in seen.items() if n > 1)
    _mark_active(model, snap)
    try:
        kind.handler(config, model, names, snap, ApplyContext(seed=seed, calibration_ids=calibration_ids))
    except BaseException:
        restore_(model, snap)
        raise
    if offload:  # the rounding's temporaries, freed between the new weights, leave the heap's arenas too
        trim_heap()
    return snap


def restore_(model: nn.Module, snapshot: Snapshot) -> None:
    """Undo `perturb_`: remove hooks, put back the original parameters and modules (idempotent)."""
    if snapshot.restored:
        return
    for handle in reversed(snapshot.hooks):
        handle.remove()
    for module, name, original in reversed(snapshot.params):
        setattr(module, name, original)
    for parent, child, original in reversed(snapshot.modules):
        setattr(parent, child, original)
    reload_(snapshot)  # after the swaps back: the perturbed copies are freed before the originals return
    _unmark_active(model, snapshot)
    snapshot.restored = True


@contextmanager
def perturbed(model: nn.Module, spec: PerturbConfig | str, layers: str = "linear",
              seed: int = 0, calibration_ids: torch.Tensor | None = None, offload: bool = False
              ) -> Iterator[nn.Module]:
    """Context manager: the model perturbed in place inside the block, exactly restored after.

    Args: as `perturb_`.

    Yields:
        The candidate model (the same object, perturbed).
    """
    snap = perturb_(model, spec, layers=layers, seed=seed, calibration_ids=calibration_ids, offload=offload)
    try:
        yield model
    finally:
        restore_(model, snap)
