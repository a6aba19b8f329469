"""Lightning strategies for full-graph training on graph partitions: graph-parallel (synchronous),
PipeGCN (halo one epoch stale) and PipeQS (stale and adaptively quantised)."""

from __future__ import annotations

import math
from typing import Any

import torch
from lightning.fabric.strategies import _StrategyRegistry
from torch.optim import Optimizer
from typing_extensions import override

from lightning_mqgnn.fullgraph.adaptive import AdaptiveRule
from lightning_mqgnn.fullgraph.halo import HaloExchanger
from lightning_mqgnn.fullgraph.reduce import reduce_gradients
from lightning_mqgnn.fullgraph.strategy_base import FullGraphStrategyBase, TransportFactory

VARIANTS = {
    "graph_parallel": dict(mode="sync", quantize=False),
    "pipegcn": dict(mode="stale", quantize=False),
    "pipeqs": dict(mode="stale", quantize=True),
}


class FullGraphStrategy(FullGraphStrategyBase):
    """Each rank trains the whole model on its graph partition (a ``PartitionBatch`` per epoch)
    and exchanges halo rows every layer through a ``HaloExchanger``; weight gradients are
    averaged over ranks after the backward, as DDP does, in one flat all-reduce that also carries
    the exchanger's drift measurements and the loss, so every rank applies the adaptive rule to
    the same numbers (``FullGraphStrategyBase``: no ``DistributedDataParallel`` wrapper).

    Args:
        mode: "sync" (graph-parallel) or "stale" (halo one epoch old, PipeGCN).
        quantize: quantise stale messages with the adaptive bit width (PipeQS).
        rule: thresholds of the adaptive rule (``AdaptiveRule`` or its fields as a dict).
        halo_timeout_s: how long an exchange waits for a silent peer before failing.
        transport: builds the ``Transport`` from (rank, world size, process group); the default
            sends with ``isend``/``irecv``. Benchmarks pass one that models a slower link.
        seed: seeds the stochastic rounding (per rank).
        smoothing: stale modes: exponential averaging factor of the stale halo rows (see
            ``halo``); without it (0) the loss of a stale run oscillates from epoch to epoch.
        **kwargs: passed to ``DDPStrategy`` (accelerator, start_method, timeout, ...).
    """

    def __init__(
        self,
        mode: str = "sync",
        quantize: bool = False,
        rule: AdaptiveRule | dict | None = None,
        halo_timeout_s: float = 60.0,
        transport: TransportFactory | None = None,
        seed: int = 0,
        smoothing: float = 0.8,
        **kwargs: Any,
    ) -> None:
        if mode not in ("sync", "stale"):
            raise ValueError(f"FullGraphStrategy: mode must be 'sync' or 'stale', got {mode!r}")
        if quantize and mode != "stale":
            raise ValueError("FullGraphStrategy: quantize needs mode='stale' (PipeQS)")
        super().__init__(halo_timeout_s, transport, seed, **kwargs)
        self.mode = mode
        self.quantize = quantize
        self.rule = AdaptiveRule(**rule) if isinstance(rule, dict) else (rule or AdaptiveRule())
        self.smoothing = smoothing
        self.exchanger: HaloExchanger | None = None
        self._best_loss = math.inf
        self.halo_wait_s = 0.0  # the training thread's waits for exchanges, of closed exchangers

    def _exchanger_for(self, batch: Any) -> HaloExchanger:
        batch = self.partition_batch(batch)
        if self.exchanger is None:
            part = batch.partition
            if part.num_parts != self.world_size:
                raise ValueError(
                    f"partition has {part.num_parts} parts but the run has {self.world_size} ranks"
                )
            transport = self.transport_factory(self.global_rank, self.world_size, self._group)
            self.exchanger = HaloExchanger(
                part,
                transport,
                mode=self.mode,
                quantize=self.quantize,
                rule=self.rule,
                seed=self.seed,
                smoothing=self.smoothing,
            )
        return self.exchanger

    @override
    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        batch = args[0]
        exchanger = self._exchanger_for(batch)
        assert self.lightning_module is not None
        exchanger.begin_epoch(self.lightning_module.trainer.current_epoch)
        self.start_epoch_clock()
        batch.halo = exchanger.with_halo
        return super().training_step(*args, **kwargs)

    @override
    def validation_step(self, *args: Any, **kwargs: Any) -> Any:
        args[0].halo = self._exchanger_for(args[0]).exact
        return super().validation_step(*args, **kwargs)

    @override
    def test_step(self, *args: Any, **kwargs: Any) -> Any:
        args[0].halo = self._exchanger_for(args[0]).exact
        return super().test_step(*args, **kwargs)

    @override
    def reduce_after_backward(self, optimizer: Optimizer, loss: Any) -> None:
        """One all-reduce of [gradients ; exchanger signals ; loss ; bytes]: gradients averaged,
        signals and bytes summed, then the adaptive rule advances."""
        ex = self.exchanger
        assert ex is not None
        extra = torch.cat(
            [
                ex.signals(),
                torch.tensor(
                    [
                        float(loss.detach()) if loss is not None else math.nan,
                        float(ex.bytes_sent - self._bytes_mark),
                    ],
                    dtype=torch.float64,
                ),
            ]
        )
        self._bytes_mark = ex.bytes_sent
        flat = reduce_gradients(optimizer, extra, self.world_size, divide_by=self.world_size)
        loss_mean = float(flat[-2]) / self.world_size
        self.record_epoch(loss_mean, int(flat[-1]))
        first_loss = self.epoch_losses[0]
        ex.end_epoch(flat[:-2].cpu(), loss_mean, self._best_loss, first_loss)
        if math.isfinite(loss_mean):
            self._best_loss = min(self._best_loss, loss_mean)

    def result_fields(self) -> str:
        """Communication figures for the recipe's RESULT line: mean halo bytes per training epoch
        (all ranks), the training thread's total wait for exchanges on rank 0."""
        mean_bytes = self.mean_epoch_bytes()
        if mean_bytes is None:
            return ""
        wait = self.halo_wait_s + (self.exchanger.wait_s if self.exchanger is not None else 0.0)
        return f" comm_bytes={mean_bytes:.0f} halo_wait_s={wait:.2f}"

    @override
    def teardown(self) -> None:
        if self.exchanger is not None:
            self.exchanger.close()
            self.halo_wait_s += self.exchanger.wait_s
            self.exchanger = None
        super().teardown()

    @override
    def __getstate__(self) -> dict:
        state = super().__getstate__()
        state["exchanger"] = None
        return state

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
        for name, variant in VARIANTS.items():
            if name not in strategy_registry:
                strategy_registry.register(
                    name,
                    cls,
                    description=f"full-graph training on partitions: {name}",
                    start_method="popen",
                    **variant,
                )


__all__ = ["VARIANTS", "FullGraphStrategy"]
