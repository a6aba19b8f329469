"""The once-per-step all-reduce of full-graph training: weight gradients and a few scalars in one
flat buffer, so every rank applies the optimizer to the same gradients and the same numbers."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor
from torch.optim import Optimizer


def reduce_gradients(optimizer: Optimizer, extra: Tensor, world_size: int, divide_by: int) -> Tensor:
    """Sum every trainable parameter's gradient (zeros where a rank left it unused, so that every
    rank contributes the same layout) and ``extra`` over ranks in one all-reduce; the gradients end
    divided by ``divide_by``. Returns the summed ``extra``."""
    params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    grads = [p.grad.reshape(-1) for p in params]
    extra = extra.to(torch.float64)
    flat = torch.cat([torch.cat(grads).to(torch.float64), extra.to(grads[0].device)]) if grads else extra
    if world_size > 1:
        dist.all_reduce(flat)
    if grads:
        n = sum(g.numel() for g in grads)
        reduced = (flat[:n] / divide_by).to(grads[0].dtype)
        offset = 0
        for p in params:
            k = p.grad.numel()
            p.grad.copy_(reduced[offset : offset + k].view_as(p.grad))
            offset += k
        flat = flat[n:]
    return flat.cpu()
