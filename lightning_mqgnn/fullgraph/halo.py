"""Halo exchange: before each layer, a rank receives the rows of its halo nodes from their owners
(forward), and after the layer's backward it returns their gradients to the owners, who add them
to the gradients of the rows they sent.

``HaloExchanger`` runs every exchange on one communication thread, in the same order on every
rank. Synchronous ("fresh") exchanges wait for their result. Stale ones (PipeGCN) return the halo
received for the previous epoch and leave this epoch's exchange in flight while the layers
compute, so an epoch's halo features and halo gradients are exactly one epoch old: the staleness
bound ``MAX_STALENESS`` is checked on every use. The first epoch, and any epoch the
``BitWidthController`` sends fresh, is synchronous and exact.

With ``smoothing`` = γ > 0 a stale channel uses the exponential average ``γ s + (1 - γ) x`` of
the rows it received instead of the newest ``x`` alone (PipeGCN's smoothing of stale features and
gradients): the average follows the same trajectory, while the epoch-to-epoch error of one-epoch-old
values, which otherwise feeds back into an oscillating loss, is damped. The newest rows in it are
still exactly one epoch old.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import torch
from torch import Tensor

from lightning_mqgnn.fullgraph.adaptive import AdaptiveRule, BitWidthController, MessagePolicy
from lightning_mqgnn.fullgraph.partition import LocalPartition
from lightning_mqgnn.fullgraph.transport import HaloExchangeError, Transport
from lightning_mqgnn.quantize import (
    QuantizedRows,
    dequantize,
    expected_noise_sq,
    message_bytes,
    quantize,
)
from lightning_mqgnn.sampling.rng import derived_seed

MODES = ("sync", "stale")
MAX_STALENESS = 1  # epochs: a stale halo is always the previous epoch's
FORWARD, BACKWARD = "forward", "backward"


@dataclass
class _Channel:
    """State of one (layer, direction): its policy controller, the exchange in flight, the last
    received rows and the epoch they were sent in, and last epoch's sent rows (for the drift)."""

    controller: BitWidthController
    pending: Future | None = None
    pending_epoch: int = -1
    latest: Tensor | None = None
    latest_epoch: int = -1
    smoothed: Tensor | None = None
    previous_sent: Tensor | None = None
    drift_sq: float = 0.0
    norm_sq: float = 0.0
    noise_sq: float = 0.0
    ages: list[int] = field(default_factory=list)


class HaloExchanger:
    """Halo exchange of one rank's partition (see the module docstring).

    ``mode="sync"``: every exchange fresh and exact (graph-parallel training). ``mode="stale"``:
    one epoch stale after the first (PipeGCN); with ``quantize`` messages are quantised with the
    adaptive bit width of ``rule`` (PipeQS). ``smoothing``: the averaging factor of stale rows
    (module docstring; 0 uses the newest rows as they are).
    """

    def __init__(
        self,
        part: LocalPartition,
        transport: Transport,
        mode: str = "sync",
        quantize: bool = False,
        rule: AdaptiveRule | None = None,
        seed: int = 0,
        smoothing: float = 0.0,
    ):
        if mode not in MODES:
            raise ValueError(f"halo exchange mode must be one of {MODES}, got {mode!r}")
        if quantize and mode != "stale":
            raise ValueError("quantised halo messages need mode='stale'")
        self.part = part
        self.transport = transport
        self.mode = mode
        self.quantize = quantize
        self.rule = rule or AdaptiveRule()
        if not 0.0 <= smoothing < 1.0:
            raise ValueError(f"smoothing must be in [0, 1), got {smoothing}")
        self.smoothing = smoothing
        self.generator = torch.Generator().manual_seed(derived_seed(seed, part.rank))
        self.epoch = 0
        self.channels: dict[tuple[int, str], _Channel] = {}
        self.bytes_sent = 0  # payload of every training message this rank launched
        self.wait_s = 0.0  # time the training thread waited for exchanges
        self._tag = 0
        self._send_all = torch.cat(part.send_idx) if part.send_idx else torch.empty(0, dtype=torch.int64)
        self._executor: ThreadPoolExecutor | None = ThreadPoolExecutor(1, thread_name_prefix="halo")

    # ------------------------------------------------------------------ public
    def begin_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        for ch in self.channels.values():
            ch.drift_sq = ch.norm_sq = ch.noise_sq = 0.0

    def with_halo(self, layer: int, h: Tensor) -> Tensor:
        """``[h ; halo rows]`` for a training forward: differentiable, halo gradients go back to
        their owners in the backward."""
        if h.shape[0] != self.part.num_inner:
            raise ValueError(f"layer {layer}: expected {self.part.num_inner} inner rows, got {h.shape[0]}")
        return _HaloFunction.apply(h, self, layer)

    def exact(self, layer: int, h: Tensor) -> Tensor:
        """``[h ; halo rows]`` exchanged fresh and exact, without gradients (evaluation)."""
        job = self._launch(self._split_sends(h.detach()), self.part.recv_counts, None, training=False)
        halo = self._run(job).result()
        return torch.cat([h, halo.to(h.device, h.dtype)])

    def channel_keys(self) -> list[tuple[int, str]]:
        return sorted(self.channels)

    def signals(self) -> Tensor:
        """This epoch's local (drift^2, noise^2, norm^2) per channel, in ``channel_keys`` order."""
        values = [
            (c.drift_sq, c.noise_sq, c.norm_sq) for c in (self.channels[k] for k in self.channel_keys())
        ]
        return torch.tensor(values, dtype=torch.float64).reshape(-1)

    def end_epoch(self, global_signals: Tensor, loss: float, best_loss: float, first_loss: float) -> None:
        """Apply the adaptive rule to the all-reduced signals and losses (identical on every rank)."""
        triples = global_signals.reshape(-1, 3).tolist()
        for key, (drift_sq, noise_sq, norm_sq) in zip(self.channel_keys(), triples):
            drift = (drift_sq / norm_sq) ** 0.5 if norm_sq > 0 else 0.0
            noise = (noise_sq / norm_sq) ** 0.5 if norm_sq > 0 else 0.0
            if self.mode == "stale":
                controller = self.channels[key].controller
                quantised = controller.policy().bits is not None
                controller.update(drift, noise if quantised else None, loss, best_loss, first_loss)

    def policies(self) -> dict[tuple[int, str], MessagePolicy]:
        return {k: self._policy(k) for k in self.channel_keys()}

    def close(self) -> None:
        """Finish the exchanges in flight (peers are waiting for them) and stop the thread."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    # ------------------------------------------------------------------ internals
    def _policy(self, key: tuple[int, str]) -> MessagePolicy:
        if self.mode == "sync":
            return MessagePolicy(fresh=True, bits=None)
        return self._channel(key).controller.policy()

    def _channel(self, key: tuple[int, str]) -> _Channel:
        if key not in self.channels:
            self.channels[key] = _Channel(BitWidthController(self.rule, self.quantize))
        return self.channels[key]

    def _split_sends(self, h: Tensor) -> list[Tensor]:
        return [h[idx.to(h.device)] for idx in self.part.send_idx]

    def _run(self, job) -> Future:
        if self._executor is None:
            raise RuntimeError("halo exchanger is closed")
        return self._executor.submit(job)

    def _launch(
        self,
        rows: list[Tensor],
        recv_counts: list[int],
        bits: int | None,
        channel: _Channel | None = None,
        training: bool = True,
    ):
        """Encode ``rows[p]`` for every peer and return the job that exchanges and decodes them;
        with ``channel``, add the expected quantisation error to its noise."""
        cols = next((r.shape[1] for r in rows if r.dim() == 2), 0)
        rows = [r.detach().to("cpu", torch.float32) for r in rows]  # messages travel through gloo on the CPU
        if bits is None:
            sends = [r.contiguous() for r in rows]
            recvs = [torch.empty(n, cols, dtype=torch.float32) for n in recv_counts]
        else:
            codes = [quantize(r, bits, self.generator) for r in rows]
            if channel is not None:
                channel.noise_sq += sum(expected_noise_sq(c) for c in codes)
            sends = [c.to_bytes() for c in codes]
            recvs = [torch.empty(message_bytes(n, cols, bits), dtype=torch.uint8) for n in recv_counts]
        if training:
            self.bytes_sent += sum(s.numel() * s.element_size() for s in sends)
        tag = self._tag
        self._tag = (self._tag + 1) % (1 << 24)
        transport = self.transport

        def job() -> Tensor:
            transport.exchange(sends, recvs, tag)
            if bits is None:
                return torch.cat(recvs) if recvs else torch.empty(0, cols)
            parts = [
                dequantize(QuantizedRows.from_bytes(buf, n, cols, bits)) for buf, n in zip(recvs, recv_counts)
            ]
            return torch.cat(parts)

        return job

    def _wait(self, future: Future) -> Tensor:
        start = time.perf_counter()
        try:
            return future.result()
        finally:
            self.wait_s += time.perf_counter() - start

    def _exchange(self, key: tuple[int, str], rows: list[Tensor], recv_counts: list[int]) -> Tensor:
        """One training exchange of channel ``key``: returns the received rows to use now (this
        epoch's when fresh, last epoch's when stale) and records the drift of what was sent."""
        ch = self._channel(key)
        policy = self._policy(key)
        if self.quantize:  # the adaptive rule's inputs; the other modes need none
            sent = torch.cat(rows).detach().to("cpu", torch.float32) if rows else torch.empty(0)
            if ch.previous_sent is not None and ch.previous_sent.shape == sent.shape:
                ch.drift_sq += float(torch.dist(sent, ch.previous_sent)) ** 2
            ch.norm_sq += float(torch.linalg.vector_norm(sent)) ** 2
            ch.previous_sent = sent
        if ch.pending is not None:  # last epoch's exchange: needed now when stale, else only finished
            ch.latest, ch.latest_epoch = self._wait(ch.pending), ch.pending_epoch
            ch.pending = None
        job = self._launch(rows, recv_counts, policy.bits, ch if self.quantize else None)
        if policy.fresh or ch.latest is None:
            ch.latest, ch.latest_epoch = self._wait(self._run(job)), self.epoch
            ch.smoothed = ch.latest
            ch.ages.append(0)
            return ch.latest
        age = self.epoch - ch.latest_epoch
        if age > MAX_STALENESS:
            raise RuntimeError(f"halo {key} is {age} epochs stale (bound {MAX_STALENESS})")
        ch.ages.append(age)
        ch.pending, ch.pending_epoch = self._run(job), self.epoch
        if self.smoothing > 0 and ch.smoothed is not None and ch.smoothed.shape == ch.latest.shape:
            ch.smoothed = torch.lerp(ch.latest, ch.smoothed, self.smoothing)
            return ch.smoothed
        return ch.latest


class _HaloFunction(torch.autograd.Function):
    """``[h ; halo]`` forward; backward sends the halo rows' gradients to their owners and adds
    the gradients peers return for this rank's sent rows."""

    @staticmethod
    def forward(ctx, h: Tensor, exchanger: HaloExchanger, layer: int) -> Tensor:
        ctx.exchanger, ctx.layer = exchanger, layer
        part = exchanger.part
        halo = exchanger._exchange((layer, FORWARD), exchanger._split_sends(h.detach()), part.recv_counts)
        return torch.cat([h, halo.to(h.device, h.dtype)])

    @staticmethod
    def backward(ctx, grad: Tensor):
        ex: HaloExchanger = ctx.exchanger
        part = ex.part
        grad_inner = grad[: part.num_inner].clone()
        grad_halo = grad[part.num_inner :].detach()
        rows = list(torch.split(grad_halo, part.recv_counts))
        returned = ex._exchange((ctx.layer, BACKWARD), rows, [int(i.numel()) for i in part.send_idx])
        if returned.numel():
            index = ex._send_all.to(grad_inner.device)
            grad_inner.index_add_(0, index, returned.to(grad_inner.device, grad_inner.dtype))
        return grad_inner, None, None


__all__ = ["FORWARD", "BACKWARD", "MAX_STALENESS", "HaloExchangeError", "HaloExchanger"]
