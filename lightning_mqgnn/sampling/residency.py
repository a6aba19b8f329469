"""A sampler's state on a device: move it once, size it, and refresh a moved copy in place.

A sampler is a plain object graph (the ``CSRGraph``, precomputed weights and distributions,
per-process scratch arrays, a ``GNSCache``). ``to_device`` copies that graph with every tensor
moved, keeping shared objects shared (a GNS sampler and its cache keep one graph); scratch
arrays a sampler drops when pickled are dropped here too and rebuilt on the device at first
use. On the CPU ``Tensor.to`` returns the tensor itself, so a CPU copy shares the original's
memory.
"""

from __future__ import annotations

import copy
from typing import Any, TypeVar

import torch
from torch import Tensor

T = TypeVar("T")
_PACKAGE = "lightning_mqgnn."


def _is_state_object(obj: Any) -> bool:
    """An instance of a class of this package (or of a subclass of one): a sampler's parts."""
    return (
        hasattr(obj, "__dict__")
        and not isinstance(obj, type)
        and any(cls.__module__.startswith(_PACKAGE) for cls in type(obj).__mro__)
    )


def to_device(obj: T, device: torch.device | str, memo: dict[int, Any] | None = None) -> T:
    """A copy of ``obj`` (a sampler, a feature cache, ...) with its tensors on ``device``.

    ``obj`` itself is always copied attribute by attribute; below it, tensors, lists, tuples,
    dicts and objects of this package are. ``memo`` (id -> copy) keeps objects shared across
    several calls shared in the copies (pass one dict to move a sampler and its cache).
    """
    memo = {} if memo is None else memo
    device = torch.device(device)
    return _move(obj, device, memo, root=True)


def _move(obj: Any, device: torch.device, memo: dict[int, Any], root: bool = False) -> Any:
    key = id(obj)
    if key in memo:
        return memo[key]
    if isinstance(obj, Tensor):
        out = obj.to(device)
    elif isinstance(obj, list):
        out = [_move(v, device, memo) for v in obj]
    elif isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        out = tuple(_move(v, device, memo) for v in obj)
    elif isinstance(obj, dict):
        out = {k: _move(v, device, memo) for k, v in obj.items()}
    elif root or _is_state_object(obj):
        out = copy.copy(obj)  # through __getstate__: per-process scratch arrays are left behind
        memo[key] = out  # before the attributes: cycles end here
        for name, value in vars(out).items():
            out.__dict__[name] = _move(value, device, memo)
        return out
    else:
        return obj
    memo[key] = out
    return out


def state_nbytes(obj: Any) -> int:
    """Bytes of the distinct tensor storages ``to_device`` would move (each storage once)."""
    seen: dict[int, int] = {}
    visited: set[int] = set()

    def visit(o: Any, root: bool = False) -> None:
        if id(o) in visited:
            return
        visited.add(id(o))
        if isinstance(o, Tensor):
            storage = o.untyped_storage()
            seen[storage.data_ptr()] = max(seen.get(storage.data_ptr(), 0), storage.nbytes())
        elif isinstance(o, (list, tuple)):
            for v in o:
                visit(v)
        elif isinstance(o, dict):
            for v in o.values():
                visit(v)
        elif root or _is_state_object(o):
            state = o.__getstate__() if hasattr(o, "__getstate__") else vars(o)
            for v in (state or {}).values() if isinstance(state, dict) else ():
                visit(v)

    visit(obj, root=True)
    return sum(seen.values())


def copy_state_(moved: Any, original: Any) -> None:
    """Copy ``original``'s top-level tensors into ``moved``'s (same shapes), e.g. a feature
    cache redrawn in place on the host into its device copy. The copy is ordered on the current
    stream."""
    for name, value in vars(original).items():
        target = moved.__dict__.get(name)
        if isinstance(value, Tensor) and isinstance(target, Tensor) and target is not value:
            if target.shape != value.shape:
                raise ValueError(
                    f"{type(original).__name__}.{name} changed shape {tuple(target.shape)} -> "
                    f"{tuple(value.shape)}: its device copy can only be refreshed in place"
                )
            target.copy_(value, non_blocking=True)
