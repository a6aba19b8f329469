"""MQGNNStrategy: DDP with RaCoM asynchronous gradient queues and periodic model synchronisation."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from lightning.fabric.strategies import _StrategyRegistry
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.overrides.distributed import _sync_module_states
from lightning.pytorch.plugins.precision import MixedPrecision
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.rank_zero import rank_zero_info
from torch.distributed.distributed_c10d import _get_default_group
from torch.nn import Module
from torch.optim import Optimizer
from typing_extensions import override

from lightning_mqgnn.strategy.comm import AllReduce, CommStats
from lightning_mqgnn.strategy.gradient_queue import GradientQueue
from lightning_mqgnn.strategy.model_sync import average_across_ranks, sync_tensors
from lightning_mqgnn.strategy.sync_period import (
    DEFAULT_SYNC_SCALE,
    FALLBACK_SYNC_PERIOD,
    graph_size_from_datamodule,
    sync_period,
)

CHECKPOINT_KEY = "mqgnn_strategy"
_DDP_ONLY_ARGS = ("ddp_comm_state", "ddp_comm_hook", "ddp_comm_wrapper", "model_averaging_period")


class MQGNNStrategy(DDPStrategy):
    """Multi-process training whose ranks do not wait for each other's gradients (paper section IV).

    After each backward the step's gradients are all-reduced asynchronously into a gradient queue, and
    the optimiser applies the averaged gradient of the step ``staleness`` steps earlier, so communication
    overlaps the next batch. The first ``staleness`` steps of a run have no averaged gradient yet and do
    not update the weights (queue fill; every rank keeps identical weights). ``staleness=0`` is synchronous
    DDP. Every ``sync_period`` steps (eq. 23 when None) parameters, float buffers and optimiser state are
    averaged across ranks. The model is not wrapped in ``DistributedDataParallel``: the queue does the
    gradient exchange, on gloo and NCCL alike.

    Args:
        staleness: how many steps old the applied averaged gradient is (0 = synchronous DDP).
        sync_period: optimiser steps between model synchronisations; None = eq. 23 from the DataModule's
            graph (see ``graph_size_from_datamodule``), else ``FALLBACK_SYNC_PERIOD``. Ignored at staleness 0.
        sync_scale: the scale factor k of eq. 23 (see ``DEFAULT_SYNC_SCALE`` for the choice).
        sync_optimizer_state: also average the optimiser's per-parameter tensors at each sync.
        simulated_comm_delay_s: benchmarks only -- an artificial latency added to every all-reduce's completion.
        **kwargs: passed to ``DDPStrategy`` (accelerator, cluster_environment, process_group_backend, timeout,
            start_method, ...). ``broadcast_buffers`` (default True) is honoured at staleness 0.
    """

    def __init__(
        self,
        staleness: int = 1,
        sync_period: int | None = None,
        sync_scale: float = DEFAULT_SYNC_SCALE,
        sync_optimizer_state: bool = True,
        simulated_comm_delay_s: float = 0.0,
        **kwargs: Any,
    ) -> None:
        for name in _DDP_ONLY_ARGS:
            if kwargs.get(name) is not None:
                raise ValueError(
                    f"MQGNNStrategy: `{name}` is a DDP comm-hook option and is not supported here"
                )
        if isinstance(staleness, bool) or not isinstance(staleness, int) or staleness < 0:
            raise ValueError(f"MQGNNStrategy: staleness must be an integer >= 0, got {staleness!r}")
        if sync_period is not None and (
            isinstance(sync_period, bool) or not isinstance(sync_period, int) or sync_period < 1
        ):
            raise ValueError(
                f"MQGNNStrategy: sync_period must be None or an integer >= 1, got {sync_period!r}"
            )
        if not sync_scale > 0:
            raise ValueError(f"MQGNNStrategy: sync_scale must be > 0, got {sync_scale!r}")
        if simulated_comm_delay_s < 0:
            raise ValueError(
                f"MQGNNStrategy: simulated_comm_delay_s must be >= 0, got {simulated_comm_delay_s!r}"
            )
        super().__init__(**kwargs)
        self.staleness = staleness
        self.sync_scale = float(sync_scale)
        self.sync_optimizer_state = sync_optimizer_state
        self.simulated_comm_delay_s = float(simulated_comm_delay_s)
        self._requested_sync_period = sync_period
        self.sync_period: int | None = sync_period  # resolved at setup
        self.comm_stats = CommStats()
        self._reducer: AllReduce | None = None
        self._queue: GradientQueue | None = None
        self._restored: dict[str, Any] | None = None

    # ----------------------------------------------------------------- setup / teardown
    @override
    def connect(self, model: LightningModule) -> None:
        # Checked here, in every process before the process group starts, so a bad setup fails fast.
        trainer = getattr(model, "_trainer", None)
        if trainer is None or trainer.state.fn == TrainerFn.FITTING:
            self._check_supported(model)
        super().connect(model)

    @override
    def setup(self, trainer: Trainer) -> None:
        super().setup(trainer)
        if trainer.state.fn == TrainerFn.FITTING:
            self.sync_period = self._resolve_sync_period(trainer)

    def _check_supported(self, module: LightningModule) -> None:
        if not module.automatic_optimization:
            raise ValueError(
                "MQGNNStrategy: manual optimisation is not supported (gradients are exchanged inside the "
                "optimiser step of automatic optimisation); use strategy='ddp' for this LightningModule"
            )
        plugin = self.precision_plugin
        if self.staleness > 0 and isinstance(plugin, MixedPrecision) and plugin.scaler is not None:
            raise ValueError(
                f"MQGNNStrategy: precision={plugin.precision!r} uses a GradScaler, whose loss scale changes "
                "between steps, so a stale gradient would be unscaled with the wrong factor; use "
                "precision='bf16-mixed' or '32-true', or staleness=0"
            )

    def _resolve_sync_period(self, trainer: Trainer) -> int:
        if self._requested_sync_period is not None:
            return self._requested_sync_period
        size = graph_size_from_datamodule(trainer.datamodule)
        if size is None:
            rank_zero_info(
                f"MQGNNStrategy: no graph size from the DataModule; sync_period={FALLBACK_SYNC_PERIOD}"
            )
            return FALLBACK_SYNC_PERIOD
        period = sync_period(size.num_nodes, size.num_edges, self.world_size, self.sync_scale)
        rank_zero_info(
            f"MQGNNStrategy: sync_period={period} from eq. 23 (|V|={size.num_nodes}, |E|={size.num_edges}, "
            f"|G|={self.world_size}, k={self.sync_scale})"
        )
        return period

    @override
    def configure_ddp(self) -> None:
        # No DistributedDataParallel wrapper: the gradient queue exchanges gradients. Start from rank 0's
        # parameters and buffers, as DDP's constructor does.
        assert self.model is not None
        _sync_module_states(self.model)

    @override
    def teardown(self) -> None:
        if self._queue is not None:
            self._queue.clear()  # in-flight all-reduces must finish before the process group goes away
            self._queue = None
        if self._reducer is not None:
            self._reducer.close()
            self._reducer = None
        super().teardown()

    def __getstate__(self) -> dict:
        state = super().__getstate__()
        state["_reducer"] = None
        state["_queue"] = None
        return state

    # ----------------------------------------------------------------- training step
    def _get_reducer(self) -> AllReduce:
        if self._reducer is None:
            self._reducer = AllReduce(group=None, simulated_delay_s=self.simulated_comm_delay_s)
        return self._reducer

    def _get_queue(self, optimizer: Optimizer) -> GradientQueue:
        if self._queue is None:
            params = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
            self._queue = GradientQueue(params, self.staleness, self._get_reducer())
            if self._restored is not None:
                self._load_state(self._restored)
                self._restored = None
        return self._queue

    @override
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        super().on_train_batch_start(batch, batch_idx)
        # DDP broadcasts rank 0's buffers before every forward; do the same where we promise DDP's result.
        if self.staleness == 0 and self._ddp_kwargs.get("broadcast_buffers", True) and self.world_size > 1:
            assert self.lightning_module is not None
            buffers = [b for b in self.lightning_module.buffers()]
            if buffers:
                dist._broadcast_coalesced(_get_default_group(), buffers, 250 * 1024 * 1024, 0)

    @override
    def optimizer_step(
        self,
        optimizer: Optimizer,
        closure: Callable[[], Any],
        model: LightningModule | Module | None = None,
        **kwargs: Any,
    ) -> Any:
        queue = self._get_queue(optimizer)
        stats = self.comm_stats
        calls = 0

        def closure_then_exchange() -> Any:
            nonlocal calls
            calls += 1
            if calls > 1:
                raise RuntimeError(
                    f"MQGNNStrategy: {type(optimizer).__name__} evaluated the closure twice in one step; the "
                    "gradient queue needs exactly one backward per optimiser step (LBFGS-style optimisers "
                    "are not supported)"
                )
            result = closure()  # forward + backward: local gradients in .grad
            queue.push()  # start the asynchronous all-reduce of this step (eq. 20-21)
            if queue.ready():  # the step `staleness` steps ago is due: .grad <- its average
                stats.grad_wait_s += queue.apply_oldest()
            return result

        stats.steps += 1
        if len(queue) + 1 > self.staleness:
            output = super().optimizer_step(optimizer, closure_then_exchange, model, **kwargs)  # eq. 22
            stats.applied_steps += 1
        else:  # queue fill: nothing averaged to apply yet, keep the weights (identical on all ranks)
            output = closure_then_exchange()
            stats.skipped_steps += 1

        if self.staleness > 0 and self.sync_period is not None and stats.steps % self.sync_period == 0:
            self.synchronise_model()
        return output

    def synchronise_model(self) -> None:
        """Average parameters, float buffers and (optionally) optimiser state across ranks (RaCoM sync)."""
        assert self.lightning_module is not None
        start = time.perf_counter()
        tensors = sync_tensors(self.lightning_module, self.optimizers, self.sync_optimizer_state)
        with torch.no_grad():
            average_across_ranks(tensors, self._get_reducer())
        self.comm_stats.sync_s += time.perf_counter() - start
        self.comm_stats.syncs += 1

    # ----------------------------------------------------------------- checkpointing
    def state_dict(self) -> dict[str, Any]:
        """Strategy state for a checkpoint: queued averaged gradients and counters (drains in-flight work)."""
        return {
            "staleness": self.staleness,
            "sync_period": self.sync_period,
            "comm_stats": self.comm_stats.as_dict(),
            "queue": None if self._queue is None else self._queue.state_dict(),
        }

    def _load_state(self, state: dict[str, Any]) -> None:
        for key, value in state["comm_stats"].items():
            setattr(self.comm_stats, key, type(getattr(self.comm_stats, key))(value))
        if state["queue"] is not None and self._queue is not None:
            self._queue.load_state_dict(state["queue"])

    @override
    def save_checkpoint(
        self, checkpoint: dict[str, Any], filepath: _PATH, storage_options: Any = None
    ) -> None:
        if self._queue is not None:
            checkpoint[CHECKPOINT_KEY] = self.state_dict()
        super().save_checkpoint(checkpoint, filepath, storage_options=storage_options)

    @override
    def load_checkpoint(self, checkpoint_path: _PATH, weights_only: bool | None = None) -> dict[str, Any]:
        checkpoint = super().load_checkpoint(checkpoint_path, weights_only=weights_only)
        self._restored = checkpoint.get(CHECKPOINT_KEY)
        if self._restored is not None and self._queue is not None:  # restored after the first step
            self._load_state(self._restored)
            self._restored = None
        return checkpoint

    # ----------------------------------------------------------------- registry
    @classmethod
    @override
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
        for name, start_method in (("mqgnn", "popen"), ("mqgnn_spawn", "spawn")):
            if name not in strategy_registry:
                strategy_registry.register(
                    name,
                    cls,
                    description=f"MQ-GNN RaCoM gradient queue (staleness 1) with `start_method` '{start_method}'",
                    start_method=start_method,
                )
