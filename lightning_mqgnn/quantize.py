"""Row-wise stochastic quantisation to 2, 4 or 8 bits, packed into bytes: PipeQS's halo messages
and the gradient queue's quantised buckets (``strategy/quantize_hook.py``) share it.

Each row ``x`` is mapped to ``q = floor((x - min) / step + u)`` with ``u ~ U[0, 1)`` and
``step = (max - min) / (2^b - 1)`` (PipeQS, after ActNN/EXACT: per-row asymmetric min-max scaling
with stochastic rounding). ``E[q] = (x - min) / step``, so the dequantised ``q * step + min`` is an
unbiased estimate of ``x`` with error below one ``step``. ``8 // b`` codes share a byte along the
feature axis; each row carries its ``min`` and ``step`` as float32 (8 bytes).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

BIT_WIDTHS = (2, 4, 8)
META_BYTES_PER_ROW = 8  # float32 min and step


@dataclass
class QuantizedRows:
    """Packed codes ``[N, ceil(F * bits / 8)]`` uint8 and per-row ``meta`` ``[N, 2]`` (min, step)."""

    packed: Tensor
    meta: Tensor
    bits: int
    num_cols: int

    def to_bytes(self) -> Tensor:
        """One flat uint8 buffer (codes, then metadata): what goes on the wire."""
        return torch.cat([self.packed.reshape(-1), self.meta.reshape(-1).view(torch.uint8)])

    @classmethod
    def from_bytes(cls, buffer: Tensor, num_rows: int, num_cols: int, bits: int) -> QuantizedRows:
        width = packed_width(num_cols, bits)
        codes = buffer[: num_rows * width].reshape(num_rows, width)
        meta = buffer[num_rows * width :].clone().view(torch.float32).reshape(num_rows, 2)
        return cls(codes, meta, bits, num_cols)


def packed_width(num_cols: int, bits: int) -> int:
    per_byte = 8 // bits
    return -(-num_cols // per_byte)


def message_bytes(num_rows: int, num_cols: int, bits: int | None) -> int:
    """Bytes of a message of ``num_rows`` rows; ``bits=None`` is plain float32."""
    if bits is None:
        return num_rows * num_cols * 4
    return num_rows * (packed_width(num_cols, bits) + META_BYTES_PER_ROW)


def quantize(x: Tensor, bits: int, generator: torch.Generator | None = None) -> QuantizedRows:
    """Stochastically round each row of the float matrix ``x`` to ``bits`` bits and pack the codes."""
    if bits not in BIT_WIDTHS:
        raise ValueError(f"bits must be one of {BIT_WIDTHS}, got {bits}")
    if x.dim() != 2:
        raise ValueError(f"quantize expects a [rows, cols] matrix, got shape {tuple(x.shape)}")
    x = x.detach().to(torch.float32)
    levels = (1 << bits) - 1
    lo, hi = x.aminmax(dim=1) if x.shape[0] else (x.new_zeros(0), x.new_zeros(0))
    # a constant row has no range: any positive step codes it exactly as 0 * step + min
    step = ((hi - lo) / levels).clamp_min(torch.finfo(torch.float32).tiny)
    codes = torch.rand(x.shape, generator=generator, device=x.device)
    codes.add_((x - lo[:, None]).div_(step[:, None])).floor_().clamp_(0, levels)
    return QuantizedRows(pack(codes.to(torch.uint8), bits), torch.stack([lo, step], 1), bits, x.shape[1])


def expected_noise_sq(rows: QuantizedRows) -> float:
    """Expected squared error of the dequantised rows: stochastic rounding of a value at
    fraction ``f`` of a step errs with variance ``step^2 f (1 - f)``, ``step^2 / 6`` on average
    over uniform ``f``; computed from the per-row steps alone, without decoding."""
    return float(rows.meta[:, 1].double().pow(2).sum()) * rows.num_cols / 6.0


def dequantize(rows: QuantizedRows) -> Tensor:
    q = unpack(rows.packed, rows.bits, rows.num_cols).to(torch.float32)
    return q * rows.meta[:, 1:2] + rows.meta[:, 0:1]


def pack(codes: Tensor, bits: int) -> Tensor:
    """``[N, F]`` codes below ``2^bits`` -> ``[N, ceil(F * bits / 8)]`` bytes, code ``j`` of a byte
    in bits ``j*bits .. (j+1)*bits - 1``."""
    per_byte = 8 // bits
    n, f = codes.shape
    width = packed_width(f, bits)
    padded = torch.zeros(n, width * per_byte, dtype=torch.uint8, device=codes.device)
    padded[:, :f] = codes
    grouped = padded.reshape(n, width, per_byte)
    out = grouped[:, :, 0].clone()
    for j in range(1, per_byte):
        out |= grouped[:, :, j] << (j * bits)
    return out


def unpack(packed: Tensor, bits: int, num_cols: int) -> Tensor:
    per_byte = 8 // bits
    mask = (1 << bits) - 1
    parts = [(packed >> (j * bits)) & mask for j in range(per_byte)]
    return torch.stack(parts, 2).reshape(packed.shape[0], packed.shape[1] * per_byte)[:, :num_cols]
