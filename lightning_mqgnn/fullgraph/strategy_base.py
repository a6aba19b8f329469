"""What the full-graph strategies share: their transfer group, no DDP wrapper, one reduction of
the gradients after each backward, and per-epoch figures."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.distributed as dist
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.overrides.distributed import _sync_module_states
from lightning.pytorch.strategies import DDPStrategy
from torch.nn import Module
from torch.optim import Optimizer
from typing_extensions import override

from lightning_mqgnn.fullgraph.batch import PartitionBatch
from lightning_mqgnn.fullgraph.transport import Transport
from lightning_mqgnn.strategy.checkpoint_io import AtomicCheckpointIO
from lightning_mqgnn.strategy.process_group import destroy_process_group_at_exit

TransportFactory = Callable[..., Transport]


class FullGraphStrategyBase(DDPStrategy):
    """A DDP strategy without the DDP wrapper: every rank starts from rank 0's weights, and after
    each backward ``reduce_after_backward`` reduces the gradients itself (with whatever else the
    step needs to agree on). Point-to-point transfers run on their own gloo group whose timeout is
    ``halo_timeout_s``, so a silent peer fails a transfer instead of hanging it; ``transport``
    builds each link (benchmarks pass one that models a slower network); ``seed`` seeds whatever
    the subclass draws. ``epoch_bytes``/``epoch_losses``/``epoch_times``: per training epoch, all
    ranks together."""

    def __init__(
        self,
        halo_timeout_s: float = 60.0,
        transport: TransportFactory | None = None,
        seed: int = 0,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("checkpoint_io", AtomicCheckpointIO())
        super().__init__(**kwargs)
        self.halo_timeout_s = float(halo_timeout_s)
        self.transport_factory = transport or Transport
        self.seed = seed
        self._group: Any = None
        self._bytes_mark = 0  # bytes counted up to the last epoch
        self._epoch_start = 0.0
        self.epoch_bytes: list[int] = []
        self.epoch_losses: list[float] = []
        self.epoch_times: list[float] = []

    @override
    def setup_distributed(self) -> None:
        super().setup_distributed()
        destroy_process_group_at_exit()

    @override
    def setup(self, trainer: Trainer) -> None:
        super().setup(trainer)
        if self.world_size > 1 and self._group is None:
            self._group = dist.new_group(backend="gloo", timeout=timedelta(seconds=self.halo_timeout_s))

    @override
    def configure_ddp(self) -> None:
        assert self.model is not None
        _sync_module_states(self.model)

    def partition_batch(self, batch: Any) -> PartitionBatch:
        """``batch``, refused unless it is a rank's partition."""
        if not isinstance(batch, PartitionBatch):
            raise TypeError(
                f"{type(self).__name__} trains on PartitionBatch (FullGraphDataModule), got {type(batch).__name__}"
            )
        return batch

    def start_epoch_clock(self) -> None:
        self._epoch_start = time.perf_counter()

    def record_epoch(self, loss: float, epoch_bytes: int) -> None:
        self.epoch_losses.append(loss)
        self.epoch_bytes.append(epoch_bytes)
        self.epoch_times.append(time.perf_counter() - self._epoch_start)

    def mean_epoch_bytes(self) -> float | None:
        return sum(self.epoch_bytes) / len(self.epoch_bytes) if self.epoch_bytes else None

    def reduce_after_backward(self, optimizer: Optimizer, loss: Any) -> None:
        """Make every rank's gradients the full-graph gradient (one all-reduce)."""
        raise NotImplementedError

    @override
    def optimizer_step(
        self,
        optimizer: Optimizer,
        closure: Callable[[], Any],
        model: LightningModule | Module | None = None,
        **kwargs: Any,
    ) -> Any:
        def closure_then_reduce() -> Any:
            loss = closure()  # forward and backward with this rank's transfers: local gradients
            self.reduce_after_backward(optimizer, loss)
            return loss

        return super().optimizer_step(optimizer, closure_then_reduce, model, **kwargs)

    @override
    def __getstate__(self) -> dict:
        state = super().__getstate__()
        state["_group"] = None
        return state
