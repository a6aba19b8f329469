"""A layer pipeline's history rows inside a chunk's autograd graph: the rows a chunk reads from
the history send their gradients to the gradient history as the backward computes them, and a
chunk takes the gradients its own rows received when its backward reaches them. A gathering
backward (``backward_into_history``) runs only that part: what the history reads send, no
parameter gradient."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from lightning_mqgnn.fullgraph.chunks import HistorySlots

# an input that requires grad, so that autograd runs _ReadHistory's backward; it never gets one
_ANCHOR = torch.empty(0, requires_grad=True)


class _ReadHistory(torch.autograd.Function):
    @staticmethod
    def forward(ctx, anchor: Tensor, history: Tensor, grad_history: Tensor, slots: Tensor) -> Tensor:
        # not saved tensors: other chunks' backwards write the buffer in between
        ctx.grad_history, ctx.slots = grad_history, slots
        return history[slots]

    @staticmethod
    def backward(ctx, grad: Tensor):
        ctx.grad_history.index_add_(0, ctx.slots, grad)
        return None, None, None, None


def read_history(history: Tensor, grad_history: Tensor, slots: Tensor) -> Tensor:
    """``history[slots]``; under autograd, its gradient is added to ``grad_history[slots]`` the
    moment the backward computes it. Neither the rows read nor their gradient outlive their use:
    a leaf and its ``.grad`` would stay until the chunk's whole backward ends, one pair per layer."""
    if not torch.is_grad_enabled():
        return history[slots]
    return _ReadHistory.apply(_ANCHOR, history, grad_history, slots)


def take_arrived_gradients(grad_history: Tensor, slots: HistorySlots) -> Callable[[Tensor], Tensor]:
    """A gradient hook for a chunk's rows: adds the gradients other chunks (or peers) sent for
    them to ``grad_history`` and zeroes those rows, so that what arrives later waits for the next
    epoch."""

    def hook(grad: Tensor) -> Tensor:
        arrived = grad_history[slots.write_slots]
        grad_history[slots.write_slots] = 0.0
        return grad.index_add(0, slots.write_pos, arrived)

    return hook


def backward_into_history(
    tensor: Tensor, grad: Tensor | None, chunk_input: Tensor | None, retain_graph: bool = False
) -> None:
    """Backpropagate ``grad`` from ``tensor`` through a chunk only as far as its history reads
    (which send their gradients to the gradient history) and its input rows, whose hooks take the
    gradients that arrived for them: no parameter gets a gradient. The input's own gradient is
    computed for those hooks to run, then dropped."""
    inputs = [_ANCHOR] if chunk_input is None else [_ANCHOR, chunk_input]
    torch.autograd.backward(tensor, grad, retain_graph=retain_graph, inputs=inputs)
    if chunk_input is not None:
        chunk_input.grad = None


__all__ = ["backward_into_history", "read_history", "take_arrived_gradients"]
