"""ReLU then dropout as one autograd step, with a CPU mask made of as few random bits as the rate
needs and, in float32, applied in the same pass as the ReLU.

torch's CPU dropout draws one Bernoulli variate per element (``bernoulli_``) from the Mersenne
twister and writes a full-size mask that a product and a clamp then read: at 16 random bits an
element the twister's draws alone took longer than the layer's GEMM. Here the random bits are
SplitMix64 words (one 64-bit seed drawn from the caller's torch generator per mask, so
``torch.manual_seed`` reproduces it). A rate ``p = k / 2^b`` with ``b`` in {1, 2} (0.5, 0.25,
0.75) takes ``b`` bits per element; other rates take 16 bits, i.e. ``p`` rounded to a multiple of
2^-16. Element ``i`` reads bits ``i b .. i b + b - 1`` of the word stream (little-endian) and is
kept where that lane is at least the dropped levels (16-bit lanes read as signed, against the
dropped levels less 2^15). Kept entries are scaled by the exact ``1 / (1 - p_used)``, so the
layer stays unbiased.

In float32 a compiled loop writes ``max(h * m, 0)`` straight from the words, one pass over ``h``
with no mask tensor, in blocks on torch's OpenMP threads (``omp_blocks``): word ``i`` of the
stream depends on ``i`` alone, so each block draws its own words. In bfloat16 or float16
(``precision="bf16-mixed"``) the words are expanded into a mask of that dtype (a 256-row table
whose row ``v`` holds the ``8 / b`` mask values byte ``v`` encodes), the same mask, with the
scale as that dtype holds it (exact where it is a power of two, as for p = 0.5 or 0.75, rounded
otherwise, e.g. 4/3 for p = 0.25). On CUDA, whose RNG is fast, it is ``F.dropout(F.relu(h))``.

ReLU and the mask share one autograd node: ``relu(h) * m == max(h * m, 0)`` because ``m >= 0``.
Every kept entry has the same scale ``s``, and an output is positive exactly where the entry was
kept and ``h > 0``, so the gradient ``m * g`` on those entries is ``s * g`` where the output is
positive: backward reads the output only, and the mask is done with as soon as forward is. In
place (``ReLUDropout(inplace=True)``) the output is written over ``h`` and the incoming gradient
is scaled where it lies: an activation-sized tensor freshly allocated every step costs several
times the arithmetic that fills it.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable

import numpy as np
import torch
from numba import njit
from torch import Tensor, nn
from torch.nn import functional as F
from torch.profiler import record_function

from lightning_mqgnn.models.omp_blocks import blocked_loop, run_blocked

_LEVELS = 1 << 16
_FEW_BITS = (1, 2)

# SplitMix64 (Steele, Lea & Flood, "Fast splittable pseudorandom number generators", OOPSLA 2014):
# the golden-ratio increment and the variant-13 mixing constants of its finaliser
_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


@njit(inline="always")
def _splitmix64(z):
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


@njit("void(uint64[::1], uint64)", nogil=True, cache=True)
def _fill_words(out, seed):
    """Word ``i`` of the stream started at ``seed``: ``mix(seed + (i + 1) gamma)``."""
    for i in range(out.size):
        out[i] = _splitmix64(seed + np.uint64(i + 1) * _GAMMA)


def quantised_drop_probability(p: float) -> float:
    """The probability the CPU mask really uses: ``p`` rounded to a multiple of 2^-16 (exact for
    the rates of 1 or 2 bits)."""
    return round(p * _LEVELS) / _LEVELS


def mask_bits(p: float) -> int:
    """Random bits per element the CPU mask of rate ``p`` takes: 1 or 2 where ``p * 2^b`` is an
    integer, else 16."""
    for bits in _FEW_BITS:
        if (p * (1 << bits)).is_integer():
            return bits
    return 16


def _keep_threshold(p: float, bits: int) -> int:
    """Lanes of ``bits`` bits below this value are dropped: the dropped levels, and for 16-bit
    lanes, which are read as signed, the dropped levels less 2^15."""
    dropped = round(p * (1 << bits))
    return dropped - _LEVELS // 2 if bits == 16 else dropped


def _draw_seed(generator: torch.Generator | None) -> np.uint64:
    """A mask's stream seed: 64 random bits from ``generator`` (torch's default one if None)."""
    seed = torch.empty((), dtype=torch.int64).random_(-(2**63), None, generator=generator)
    return np.uint64(int(seed) & 0xFFFFFFFFFFFFFFFF)


@torch.compiler.disable  # a numba loop over numpy views: nothing a graph could hold
def random_words(num_elements: int, bits: int, generator: torch.Generator | None = None) -> Tensor:
    """The int64 words holding ``bits`` random bits for each of ``num_elements`` elements: one
    SplitMix64 stream from a seed drawn from ``generator``."""
    words = torch.empty((num_elements * bits + 63) // 64, dtype=torch.int64)
    _fill_words(words.numpy().view(np.uint64), _draw_seed(generator))
    return words


@njit("void(float32[::1], uint32[::1], float32)", nogil=True, cache=True)
def _relu_keep_bits_(h, keep, scale):
    """``h = max(h * m, 0)`` in place, ``m`` = ``scale`` where bit ``i mod 32`` of ``keep[i // 32]``
    is set, else 0. One bit a lane and no branch: the compiler vectorises the lane loop (a
    separate output array it could not prove apart from ``h`` would keep it scalar)."""
    zero = np.float32(0.0)
    one = np.uint32(1)
    full = h.size // 32
    for j in range(full):  # a constant trip count inside
        w = keep[j]
        for lane in range(32):
            i = j * 32 + lane
            h[i] = max(h[i] * (np.float32((w >> np.uint32(lane)) & one) * scale), zero)
    for i in range(full * 32, h.size):
        h[i] = max(h[i] * (np.float32((keep[full] >> np.uint32(i - full * 32)) & one) * scale), zero)


_EVEN_BITS = np.uint64(0x5555555555555555)


@njit("void(uint32[::1], uint64[::1], boolean)", nogil=True, cache=True)
def _two_bit_keep(keep, words, either):
    """One keep bit per 2-bit lane: a lane is kept where its value is at least 1 (``either`` of
    its bits set, p = 1/4) or 3 (both, p = 3/4); the 32 lanes of a word are packed into 32 bits."""
    for j in range(words.size):
        low, high = words[j] & _EVEN_BITS, (words[j] >> np.uint64(1)) & _EVEN_BITS
        x = (low | high) if either else (low & high)
        x = (x | (x >> np.uint64(1))) & np.uint64(0x3333333333333333)  # gather the even bits
        x = (x | (x >> np.uint64(2))) & np.uint64(0x0F0F0F0F0F0F0F0F)
        x = (x | (x >> np.uint64(4))) & np.uint64(0x00FF00FF00FF00FF)
        x = (x | (x >> np.uint64(8))) & np.uint64(0x0000FFFF0000FFFF)
        keep[j] = np.uint32((x | (x >> np.uint64(16))) & np.uint64(0xFFFFFFFF))


@njit("void(float32[::1], int16[::1], int16, float32)", nogil=True, cache=True)
def _relu_mask_16_(h, lanes, threshold, scale):
    """``h = max(h * m, 0)`` in place for 16-bit lanes, read as the int16 array they are."""
    zero = np.float32(0.0)
    for i in range(h.size):
        x = max(h[i] * scale, zero)
        h[i] = x if lanes[i] >= threshold else zero


@njit("void(float32[::1], uint64, int64, int64, int64, float32)", nogil=True, cache=True)
def _relu_mask_span_(h, seed, first_word, bits, threshold, scale):
    """``h = max(h * m, 0)`` in place for the elements of ``h``, which start at word ``first_word``
    of the stream from ``seed`` (a multiple of 64 elements in): their words drawn here, as word
    ``i`` depends on ``i`` alone, then the pass for ``bits`` bits a lane."""
    words = np.empty((h.size * bits + 63) // 64, np.uint64)
    _fill_words(words, seed + np.uint64(first_word) * _GAMMA)
    if bits == 16:
        _relu_mask_16_(h, words.view(np.int16), np.int16(threshold), scale)
    elif bits == 1:
        _relu_keep_bits_(h, words.view(np.uint32), scale)
    else:
        keep = np.empty(words.size, np.uint32)
        _two_bit_keep(keep, words, threshold == 1)
        _relu_keep_bits_(h, keep, scale)


def _relu_mask_blocks(blocks_of, parallel: bool):
    """The pass over ``h`` in ``blocks`` spans of whole 64-element chunks, on threads
    (``parallel``) or in turn (``omp_blocks``): every block draws its own words, the same ones."""

    @njit(
        "void(float32[::1], uint64, int64, int64, float32, int64)", nogil=True, parallel=parallel, cache=True
    )
    def relu_mask_blocks_(h, seed, bits, threshold, scale, blocks):
        chunks = (h.size + 63) // 64
        for b in blocks_of(blocks):
            start = 64 * (chunks * b // blocks)
            stop = min(h.size, 64 * (chunks * (b + 1) // blocks))
            if start < stop:
                _relu_mask_span_(h[start:stop], seed, start * bits // 64, bits, threshold, scale)

    return relu_mask_blocks_


_RELU_MASK = blocked_loop(_relu_mask_blocks)


def _operator_scope(name: str) -> contextlib.AbstractContextManager:
    """A profiler scope around compiled loops, so that a profile counts them as an operator; opened
    only while a profiler records: opening one costs 10-100 us, profiling or not."""
    return record_function(name) if torch.autograd._profiler_enabled() else contextlib.nullcontext()


@torch.compiler.disable  # numba loops over numpy views of ``h``: torch.compile runs it eagerly
def relu_mask_(h: Tensor, p: float, generator: torch.Generator | None = None) -> Tensor:
    """``h = relu(h) * random_keep_mask(h.shape, p, generator)`` in one compiled pass over ``h``,
    with no mask tensor, for contiguous float32 ``h``, in blocks on torch's threads
    (``omp_blocks``); returns ``h``. The compiled loops run inside one ``mqgnn::`` profiler scope,
    as an operator would."""
    bits = mask_bits(p)
    with _operator_scope("mqgnn::relu_dropout"):
        args = (h.view(-1).numpy(), _draw_seed(generator), bits, _keep_threshold(p, bits))
        run_blocked(_RELU_MASK, *args, np.float32(keep_scale(p)), threads=torch.get_num_threads())
    return h


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


@torch.compiler.disable  # a cached host number: traced, its tensor would break the graph
@functools.lru_cache(maxsize=64)
def keep_scale(p: float, dtype: torch.dtype = torch.float32) -> float:
    """The value of a kept entry of the CPU mask in ``dtype``: ``1 / (1 -
    quantised_drop_probability(p))`` as that dtype holds it (cached: every training step asks)."""
    return float(torch.tensor(1.0 / (1.0 - quantised_drop_probability(p)), dtype=dtype))


class MaskBuffer:
    """Storage a ``ReLUDropout`` reuses for its half-precision masks, step after step: grown (with
    1/8 slack, as batches vary in size) when a mask needs more, never pickled."""

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
    """The mask of ``dtype`` the CPU layer applies: 0 with probability
    ``quantised_drop_probability(p)``, else ``keep_scale(p, dtype)``; written into ``buffer`` when
    given (valid until its next use)."""
    n = math.prod(shape)
    bits = mask_bits(p)
    words = random_words(n, bits, generator)
    threshold = _keep_threshold(p, bits)
    if bits < 16:
        table = _byte_table(bits, threshold, dtype)
        rows = (
            None
            if buffer is None
            else buffer.take(words.numel() * 8 * table.shape[1], dtype).view(-1, table.shape[1])
        )
        return torch.index_select(table, 0, words.view(torch.uint8).long(), out=rows).view(-1)[:n].view(shape)
    keep = words.view(torch.int16)[:n].view(shape) >= threshold
    scale, zero = torch.tensor(keep_scale(p, dtype), dtype=dtype), torch.zeros((), dtype=dtype)
    out = None if buffer is None else buffer.take(n, dtype).view(shape)
    return torch.where(keep, scale, zero, out=out)


def _relu_times_mask_(h: Tensor, mask: Tensor) -> Tensor:
    return h.mul_(mask).clamp_min_(0.0)


class _ReLUMasked(torch.autograd.Function):
    """``max(h * mask, 0)``, written in place by ``apply_(x)`` on ``h`` or a copy of it, for a
    mask of zeros and ``scale``, with the gradient ``scale * g`` where the output is positive
    (one pass; a non-finite ``g`` on an entry whose output is zero gives NaN there, not zero);
    ``inplace``: written over ``h``, and the gradient over ``g`` where that can be done (a
    contiguous ``g``: an expanded one is shared by its entries)."""

    @staticmethod
    def forward(ctx, h: Tensor, apply_: Callable[[Tensor], Tensor], scale: float, inplace: bool) -> Tensor:
        if inplace:
            ctx.mark_dirty(h)
        out = apply_(h if inplace else h.clone(memory_format=torch.contiguous_format))
        ctx.save_for_backward(out)
        ctx.scale, ctx.inplace = scale, inplace
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        (out,) = ctx.saved_tensors
        # ELU's backward from its result, with alpha 0, is ``scale * g`` where the result is
        # positive and ``g * result``, zero, elsewhere: the scale and the threshold in one pass
        args = (grad, 0.0, ctx.scale, 1.0, True, out)
        if ctx.inplace and grad.is_contiguous() and not grad.requires_grad:
            return torch.ops.aten.elu_backward.grad_input(*args, grad_input=grad), None, None, None
        return torch.ops.aten.elu_backward(*args), None, None, None


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
        if h.dtype == torch.float32 and h.is_contiguous():
            apply_ = functools.partial(relu_mask_, p=self.p)
        else:
            mask = random_keep_mask(h.shape, self.p, dtype=h.dtype, buffer=self.masks)
            apply_ = functools.partial(_relu_times_mask_, mask=mask)
        return _ReLUMasked.apply(h, apply_, keep_scale(self.p, h.dtype), self.inplace)

    def extra_repr(self) -> str:
        return f"p={self.p}" + (", inplace" if self.inplace else "")
