"""ReLU then dropout as one autograd step, with a CPU mask made of as few random bits as the rate needs.

torch's CPU dropout draws one Bernoulli variate per element (``bernoulli_``), and even 16 random
bits per element from the Mersenne twister cost as much as a third of a SAGE step's GEMMs. A rate
``p = k / 2^b`` with ``b`` in {1, 2, 4} (0.5, 0.25, 0.75, 0.125, ...) needs only ``b`` bits per
element: random bytes are expanded through a 256-row table whose row ``v`` holds the ``8 / b``
mask values that byte ``v`` encodes, one gather for the whole mask. Other rates use 16 bits per
element, i.e. ``p`` rounded to a multiple of 2^-16. Kept entries are scaled by the exact
``1 / (1 - p_used)``, so the layer stays unbiased (in bfloat16 or float16, as under
``precision="bf16-mixed"``, the scale as that dtype holds it: exact where it is a power of two,
as for p = 0.5 or 0.75, rounded otherwise, e.g. 4/3 for p = 0.25). On CUDA, whose RNG is fast, it is
``F.dropout(F.relu(h))``.

ReLU and the mask share one autograd node: ``relu(h) * m == max(h * m, 0)`` because ``m >= 0``, so
forward is one product and an in-place clamp. Every kept entry has the same scale ``s``, and an
output is positive exactly where the entry was kept and ``h > 0``, so the gradient ``m * g`` on
those entries is ``s * g`` where the output is positive: backward reads the output only, and the
mask is done with as soon as forward is. A module writes its masks into one buffer it reuses
(``MaskBuffer``), and in place (``ReLUDropout(inplace=True)``) it also scales the incoming gradient
where it lies: an activation-sized tensor freshly allocated every step costs several times the
arithmetic that fills it.
"""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor, nn
from torch.nn import functional as F

_LEVELS = 1 << 16
_TABLE_BITS = (1, 2, 4)


def quantised_drop_probability(p: float) -> float:
    """The probability the CPU mask really uses: ``p`` rounded to a multiple of 2^-16 (exact for
    the rates of the table path)."""
    return round(p * _LEVELS) / _LEVELS


def mask_bits(p: float) -> int:
    """Random bits per element the CPU mask of rate ``p`` takes: 1, 2 or 4 where ``p * 2^b`` is an
    integer, else 16."""
    for bits in _TABLE_BITS:
        if (p * (1 << bits)).is_integer():
            return bits
    return 16


def _random_words(num_bytes: int, generator: torch.Generator | None) -> Tensor:
    """``num_bytes`` (rounded up to 8) uniform random bytes, from 64-bit draws over the full range."""
    draws = torch.empty((num_bytes + 7) // 8, dtype=torch.int64)
    draws.random_(-(2**63), None, generator=generator)  # [-2^63, 2^63 - 1]: every bit uniform
    return draws.view(torch.uint8)


MASK_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_tables: dict[tuple[int, int, torch.dtype], Tensor] = {}


def _byte_table(bits: int, dropped: int, dtype: torch.dtype) -> Tensor:
    """Row ``v``: the ``8 // bits`` mask values byte ``v`` encodes (lane ``j`` = bits ``j*b ..``),
    0 where the lane's value is below ``dropped`` (of ``2^bits`` levels), else the kept scale."""
    key = (bits, dropped, dtype)
    if key not in _tables:
        levels = 1 << bits
        lanes = 8 // bits
        values = torch.arange(256).unsqueeze(1) >> (torch.arange(lanes) * bits) & (levels - 1)
        scale = levels / (levels - dropped)
        _tables[key] = torch.where(values >= dropped, scale, 0.0).to(dtype)
    return _tables[key]


@functools.lru_cache(maxsize=64)
def keep_scale(p: float, dtype: torch.dtype = torch.float32) -> float:
    """The value of a kept entry of the CPU mask in ``dtype``: ``1 / (1 -
    quantised_drop_probability(p))`` as that dtype holds it (cached: every training step asks)."""
    return float(torch.tensor(1.0 / (1.0 - quantised_drop_probability(p)), dtype=dtype))


class MaskBuffer:
    """Storage a ``ReLUDropout`` reuses for its masks, step after step: grown (with 1/8 slack, as
    batches vary in size) when a mask needs more, never pickled."""

    def __init__(self) -> None:
        self._storage: Tensor | None = None

    def __getstate__(self) -> dict:
        return {"_storage": None}

    def take(self, numel: int, dtype: torch.dtype) -> Tensor:
        """A flat tensor of ``numel`` entries of ``dtype``; its contents are overwritten by the next
        ``take``."""
        storage = self._storage
        if storage is None or storage.dtype != dtype or storage.numel() < numel:
            storage = self._storage = torch.empty(numel + numel // 8, dtype=dtype)
        return storage[:numel]


def random_keep_mask(
    shape: torch.Size,
    p: float,
    generator: torch.Generator | None = None,
    dtype: torch.dtype = torch.float32,
    buffer: MaskBuffer | None = None,
) -> Tensor:
    """A mask of ``dtype``: 0 with probability ``quantised_drop_probability(p)``, else
    ``keep_scale(p, dtype)``; written into ``buffer`` when given (valid until its next use)."""
    n = math.prod(shape)
    bits = mask_bits(p)
    if bits < 16:
        dropped = round(p * (1 << bits))
        table = _byte_table(bits, dropped, dtype)
        words = _random_words((n * bits + 7) // 8, generator).long()
        rows = (
            None
            if buffer is None
            else buffer.take(words.numel() * table.shape[1], dtype).view(-1, table.shape[1])
        )
        return torch.index_select(table, 0, words, out=rows).view(-1)[:n].view(shape)
    words = _random_words(2 * n, generator).view(torch.int16)[:n].view(shape)  # uniform on [-2^15, 2^15)
    keep = words >= round(p * _LEVELS) - _LEVELS // 2
    scale, zero = torch.tensor(keep_scale(p, dtype), dtype=dtype), torch.zeros((), dtype=dtype)
    out = None if buffer is None else buffer.take(n, dtype).view(shape)
    return torch.where(keep, scale, zero, out=out)


class _ReLUMasked(torch.autograd.Function):
    """``max(h * mask, 0)`` for a mask of zeros and ``scale``, with the gradient ``scale * g``
    where the output is positive; ``inplace``: written over ``h``, and the gradient over ``g``
    where that can be done (a contiguous ``g``: an expanded one is shared by its entries)."""

    @staticmethod
    def forward(ctx, h: Tensor, mask: Tensor, scale: float, inplace: bool) -> Tensor:
        if inplace:
            ctx.mark_dirty(h)
            out = h.mul_(mask).clamp_min_(0.0)
        else:
            out = torch.mul(h, mask).clamp_min_(0.0)
        ctx.save_for_backward(out)
        ctx.scale, ctx.inplace = scale, inplace
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        (out,) = ctx.saved_tensors
        if ctx.inplace and grad.is_contiguous() and not grad.requires_grad:
            grad_h = grad.mul_(ctx.scale)
        else:
            grad_h = torch.mul(grad, ctx.scale)
        torch.ops.aten.threshold_backward.grad_input(grad_h, out, 0.0, grad_input=grad_h)
        return grad_h, None, None, None


class ReLUDropout(nn.Module):
    """``Dropout(p)(relu(h))`` with the fast CPU mask (module docstring); plain ReLU in eval mode.

    ``inplace``: the CPU training path overwrites its input, and in backward the gradient it
    receives, for callers whose ``h`` nothing else reads, whose producing operation does not keep
    its output for backward, and whose consumer hands back a gradient of its own (a linear map, a
    weighted sum on either side); autograd refuses the backward, loudly, where the producer keeps
    its output.
    """

    def __init__(self, p: float = 0.5, inplace: bool = False):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        self.p = p
        self.inplace = inplace
        self.masks = MaskBuffer()

    def forward(self, h: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return torch.relu(h)
        if h.device.type != "cpu" or h.dtype not in MASK_DTYPES:
            return F.dropout(torch.relu(h), self.p, training=True)
        mask = random_keep_mask(h.shape, self.p, dtype=h.dtype, buffer=self.masks)
        return _ReLUMasked.apply(h, mask, keep_scale(self.p, h.dtype), self.inplace)

    def extra_repr(self) -> str:
        return f"p={self.p}" + (", inplace" if self.inplace else "")
