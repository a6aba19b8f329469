"""Periodic model synchronisation of RaCoM: average parameters, buffers and optimiser state across ranks."""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import Tensor
from torch.nn import Module
from torch.optim import Optimizer

from lightning_mqgnn.strategy.comm import Reducer


def sync_tensors(module: Module, optimizers: Iterable[Optimizer], with_optimizer_state: bool) -> list[Tensor]:
    """The tensors a model synchronisation averages.

    Parameters, floating-point buffers (e.g. batch-norm running statistics, which stay rank-local without
    DDP's buffer broadcast) and, optionally, the optimiser's per-parameter floating tensors (Adam's
    exp_avg / exp_avg_sq, SGD momentum). 0-dim state (Adam's ``step``) is a counter equal on every rank.
    """
    tensors = [p.data for p in module.parameters()]
    tensors += [b for b in module.buffers() if b.is_floating_point()]
    if with_optimizer_state:
        for (
            optimizer
        ) in optimizers:  # walk param_groups, not the state dict, for the same order on every rank
            for group in optimizer.param_groups:
                for p in group["params"]:
                    state = optimizer.state.get(p, {})
                    tensors += [
                        state[key]
                        for key in sorted(state)
                        if torch.is_tensor(state[key])
                        and state[key].is_floating_point()
                        and state[key].dim() > 0
                    ]
    return tensors


def average_across_ranks(tensors: list[Tensor], reducer: Reducer) -> None:
    """Replace every tensor by its mean over ranks (one blocking all-reduce per dtype/device group)."""
    groups: dict[tuple[torch.dtype, torch.device], list[Tensor]] = {}
    for t in tensors:
        groups.setdefault((t.dtype, t.device), []).append(t)
    flats = [torch.cat([t.reshape(-1) for t in members]) for members in groups.values()]
    reducer.launch(flats).wait()
    for members, flat in zip(groups.values(), flats):
        flat.div_(reducer.world_size)
        offset = 0
        for t in members:
            n = t.numel()
            t.copy_(flat[offset : offset + n].view(t.shape))
            offset += n


def broadcast_buffers(module: Module, src: int = 0, group: object = None) -> None:
    """Overwrite every buffer with rank ``src``'s (one blocking broadcast per dtype/device group).

    DDP does this before a forward when ``broadcast_buffers=True``; without the wrapper the strategy does
    it where its buffer policy says (before evaluation, at the end of fit).
    """
    buffers = list(module.buffers())
    groups: dict[tuple[torch.dtype, torch.device], list[Tensor]] = {}
    for b in buffers:
        groups.setdefault((b.dtype, b.device), []).append(b)
    for members in groups.values():
        flat = torch.cat([b.detach().reshape(-1) for b in members])
        dist.broadcast(flat, src=src, group=group)
        offset = 0
        for b in members:
            n = b.numel()
            b.data.copy_(flat[offset : offset + n].view(b.shape))
            offset += n


def gather_buffers(module: Module) -> list[list[Tensor]]:
    """Every rank's buffers (on the CPU), indexed [rank][buffer]: what a checkpoint needs when they differ."""
    local = [b.detach().cpu().clone() for b in module.buffers()]
    gathered: list[list[Tensor] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, local)
    return [list(rank_buffers) for rank_buffers in gathered if rank_buffers is not None]
