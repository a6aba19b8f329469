"""MQGNNStrategy: DDP with RaCoM asynchronous gradient queues and periodic model synchronisation."""

from __future__ import annotations

import functools
import inspect
import math
import sys
import time
import weakref
from collections.abc import Callable, Mapping
from datetime import timedelta
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
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn
from torch import Tensor
from torch.distributed.constants import default_pg_timeout
from torch.nn import Module
from torch.nn.parallel import DistributedDataParallel
from torch.optim import Optimizer
from typing_extensions import override

from lightning_mqgnn.strategy.checkpoint_io import AtomicCheckpointIO
from lightning_mqgnn.strategy.comm import AllReduce, CommStats, Reducer
from lightning_mqgnn.strategy.comm_hook import (
    DEFAULT_BUCKET_CAP_MB,
    CommHook,
    HookedBuckets,
    new_hook_group,
    payload_meter,
    with_process_group,
)
from lightning_mqgnn.strategy.epoch_meeting import Meeting, agree_on_fit, meet
from lightning_mqgnn.strategy.gradient_queue import GradientQueue, UnusedParametersError
from lightning_mqgnn.strategy.model_sync import (
    average_across_ranks,
    broadcast_buffers,
    gather_buffers,
    sync_tensors,
)
from lightning_mqgnn.strategy.process_group import can_set_timeout, destroy_process_group_at_exit, set_timeout
from lightning_mqgnn.strategy.rank_failure import RankFailure, collective_phase, remember_peers
from lightning_mqgnn.strategy.sync_period import (
    DEFAULT_SYNC_SCALE,
    FALLBACK_SYNC_PERIOD,
    graph_size_from_datamodule,
    sync_period,
)
from lightning_mqgnn.strategy.weight_prediction import WeightPrediction

CHECKPOINT_KEY = "mqgnn_strategy"
# how long a collective of the training loop waits for the other ranks: a rank that hangs ends the
# others this soon, while setup, the sanity check and test keep the process group's own timeout
# (Lightning's 30 minutes: a rank loading a large dataset is not a hung one)
DEFAULT_STEP_TIMEOUT_S = 30.0
# DistributedDataParallel keyword arguments that keep a meaning without the wrapper.
_QUEUE_DDP_KWARGS = frozenset({"find_unused_parameters", "broadcast_buffers", "bucket_cap_mb"})
# the others, accepted at staleness > 0 only where they hold DistributedDataParallel's default
_DDP_DEFAULTS = {
    name: parameter.default
    for name, parameter in inspect.signature(DistributedDataParallel.__init__).parameters.items()
    if parameter.default is not inspect.Parameter.empty
}


class MQGNNStrategy(DDPStrategy):
    """Multi-process training whose ranks do not wait for each other's gradients (paper section IV).

    ``staleness=0`` is Lightning's ``DDPStrategy`` unchanged: the model is wrapped in
    ``DistributedDataParallel`` (bucketed all-reduce overlapping backward, ``no_sync``, comm hooks,
    ``static_graph``, ``find_unused_parameters``, buffer broadcast, manual optimisation).

    ``staleness > 0`` replaces the wrapper by a gradient queue per optimiser: after each backward the
    step's gradients are all-reduced asynchronously, and the optimiser applies the averaged gradient of
    the step ``staleness`` steps earlier, so communication overlaps the next batch. DDP's
    communication hooks (``ddp_comm_hook``, ``ddp_comm_state``, ``ddp_comm_wrapper``: torch's fp16
    and bf16 compression, PowerSGD, ``quantize_hook``, a user's own) reduce the queue's buckets
    (``bucket_cap_mb``) instead, on a thread and a process group of their own
    (``comm_hook.HookedBuckets``); a hook state whose process group is None gets that group. At
    staleness 0 the hooks are DDP's, registered on the CPU too (Lightning registers them on CUDA
    only). The first
    ``staleness`` steps of a run have no averaged gradient yet and do not update the weights (queue fill;
    every rank keeps identical weights). Every ``sync_period`` optimiser steps (eq. 23 when None)
    parameters, float buffers and optimiser state are averaged across ranks.

    Buffer policy at ``staleness > 0``: during training buffers (e.g. batch-norm running statistics) are
    rank-local and averaged at every model sync; with ``broadcast_buffers=True`` (the default, as in DDP)
    rank 0's buffers are broadcast before every validation, test and predict loop and at the end of fit,
    so evaluation and the fitted model are identical on every rank. Checkpoints carry every rank's
    buffers, so resuming reproduces the uninterrupted run bit for bit. Checkpoints are written with
    ``AtomicCheckpointIO`` unless ``checkpoint_io`` says otherwise: whole or not at all.

    ``staleness="auto"`` adapts it (from 1, at most ``max_staleness``): every gradient queue records,
    for each applied step, the smallest staleness that would have hidden its reduction (the steps
    after its own by which it was seen complete; one more than the staleness in force when the
    step waited for it), and at each model synchronisation the ranks agree (an all-reduce of the
    maximum, so every rank computes rank 0's decision from all ranks' figures) on the 90th
    percentile of those figures. A higher staleness fills the queue (steps without an update); a
    lower one drains it, each queued average applied as its own optimiser step, so no gradient is
    lost or applied twice. Checkpoints carry the staleness in force.

    ``predict_weights=True`` computes each gradient at the weights it will be applied to: the
    forward and backward of step ``t`` run at ``w_t + s (w_t - w_{t-1})``, the last update taken as
    the velocity of the ``s`` updates before its average is applied (``weight_prediction``), and
    the optimiser then updates ``w_t`` itself. Every rank applies the same averages, so every rank
    predicts the same weights. It needs automatic optimisation and ``accumulate_grad_batches=1``
    (the forward of a batch that does not step runs outside the optimiser step). At staleness 0
    the weights a gradient is applied to are those it was computed at: nothing to predict.

    Manual optimisation works at every staleness; at ``staleness > 0`` each ``optimizer.step()`` pushes the
    gradients ``manual_backward`` left in ``.grad`` into that optimiser's queue and applies the averaged
    gradient ``staleness`` steps older (nothing else to call). A parameter without a gradient on some rank
    is an error naming it unless ``find_unused_parameters=True``, as under DDP. ``trainer.model`` is the
    LightningModule itself at ``staleness > 0``: DDP's reducer writes the average of the current backward
    into ``.grad`` and cannot skip the optimiser step while the queue fills, so there is no DDP wrapper
    (and no ``no_sync``, comm hook or ``static_graph``) to offer there.

    Args:
        staleness: how many steps old the applied averaged gradient is (0 = DDP), or ``"auto"``.
        max_staleness: the largest staleness ``"auto"`` may choose.
        sync_period: optimiser steps between model synchronisations; None = eq. 23 from the DataModule's
            graph (see ``graph_size_from_datamodule``), else ``FALLBACK_SYNC_PERIOD``. Unused at staleness 0.
        sync_scale: the scale factor k of eq. 23 (see ``DEFAULT_SYNC_SCALE`` for the choice).
        sync_optimizer_state: also average the optimiser's per-parameter tensors at each sync.
        step_timeout: seconds a collective waits for the other ranks from the training loop's
            start to its end (the gradient queue's reductions and its hooks', DDP's all-reduce,
            the model synchronisation, Lightning's per-step broadcast, validation metrics,
            checkpoint barriers) before it fails (``RankFailure``), so a rank that hangs ends the
            others this soon. Outside the loop (the rendezvous, setup, the sanity check, test) the
            process group's ``timeout`` holds (Lightning's 30 minutes). Once each epoch's first
            batch is in, where the ranks may arrive far apart for good reasons (a loader that
            takes long to start), they meet in the group's store (``epoch_meeting.meet``): a slow
            rank is waited for up to ``timeout``, a stopped or ended one on the same host for
            ``step_timeout``. A checkpoint must be written within it. None: ``timeout``
            throughout, and the ranks meet at no epoch's start. Needs torch >= 2.3.
        predict_weights: at staleness > 0, run each step's forward and backward at the predicted
            weights its gradient will be applied to (refused there under manual optimisation and
            with gradient accumulation; no effect at staleness 0).
        **kwargs: passed to ``DDPStrategy`` (accelerator, cluster_environment, process_group_backend, timeout,
            start_method, DDP keyword arguments, comm hooks). At staleness > 0 ``find_unused_parameters``,
            ``broadcast_buffers`` and ``bucket_cap_mb`` of the DDP keyword arguments apply; the others are
            accepted at DDP's default and rejected otherwise, as is ``model_averaging_period``
            (post-local SGD: the periodic model synchronisation, ``sync_period``, is the queue's).
    """

    def __init__(
        self,
        staleness: int | str = 1,
        max_staleness: int = 4,
        sync_period: int | None = None,
        sync_scale: float = DEFAULT_SYNC_SCALE,
        sync_optimizer_state: bool = True,
        step_timeout: float | None = DEFAULT_STEP_TIMEOUT_S,
        predict_weights: bool = False,
        **kwargs: Any,
    ) -> None:
        if step_timeout is not None and (
            isinstance(step_timeout, bool)
            or not isinstance(step_timeout, (int, float))
            or not step_timeout > 0
        ):
            raise ValueError(
                f"MQGNNStrategy: step_timeout must be None or a number of seconds > 0, got {step_timeout!r}"
            )
        self.adaptive = staleness == "auto"
        if self.adaptive:
            if isinstance(max_staleness, bool) or not isinstance(max_staleness, int) or max_staleness < 1:
                raise ValueError(
                    f"MQGNNStrategy: max_staleness must be an integer >= 1, got {max_staleness!r}"
                )
            staleness = 1
        if isinstance(staleness, bool) or not isinstance(staleness, int) or staleness < 0:
            raise ValueError(f"MQGNNStrategy: staleness must be an integer >= 0 or 'auto', got {staleness!r}")
        if staleness > 0 and kwargs.get("model_averaging_period") is not None:
            raise ValueError(
                "MQGNNStrategy: `model_averaging_period` (post-local SGD) averages the models of a "
                f"DistributedDataParallel wrapper, which staleness={staleness} has not; the gradient queue "
                "averages the models every `sync_period` steps"
            )
        if sync_period is not None and (
            isinstance(sync_period, bool) or not isinstance(sync_period, int) or sync_period < 1
        ):
            raise ValueError(
                f"MQGNNStrategy: sync_period must be None or an integer >= 1, got {sync_period!r}"
            )
        if not sync_scale > 0:
            raise ValueError(f"MQGNNStrategy: sync_scale must be > 0, got {sync_scale!r}")
        kwargs.setdefault("checkpoint_io", AtomicCheckpointIO())
        hook, wrapper = kwargs.get("ddp_comm_hook"), kwargs.get("ddp_comm_wrapper")
        hook_state = kwargs.get("ddp_comm_state")
        if kwargs.get("model_averaging_period") is None:
            # the strategy registers the hook itself, on every device, and counts its bytes; post-local
            # SGD's hook and optimiser stay Lightning's
            for name in ("ddp_comm_hook", "ddp_comm_wrapper", "ddp_comm_state"):
                kwargs.pop(name, None)
        super().__init__(**kwargs)
        unsupported = sorted(
            name
            for name, value in self._ddp_kwargs.items()
            if name not in _QUEUE_DDP_KWARGS and (name not in _DDP_DEFAULTS or value != _DDP_DEFAULTS[name])
        )
        if staleness > 0 and unsupported:
            raise ValueError(
                f"MQGNNStrategy: DistributedDataParallel argument(s) {unsupported} configure the DDP wrapper, "
                f"which exists only at staleness 0 (got staleness={staleness}); at staleness > 0 only "
                f"{sorted(_QUEUE_DDP_KWARGS)} apply, and the others at DDP's defaults"
            )
        cap = self._ddp_kwargs.get("bucket_cap_mb")
        self.bucket_cap_mb = float(cap) if cap is not None else DEFAULT_BUCKET_CAP_MB
        self._lightning_registers_hook = kwargs.get("ddp_comm_hook") is not None
        self.comm_hook: CommHook | None = wrapper(hook) if hook is not None and wrapper is not None else hook
        self.comm_hook_state = hook_state
        self._ddp_hook_bytes: int | None = 0
        self._hooked: HookedBuckets | None = None
        self._hook_group: Any = None
        # the default group the hook group was made in: a fit in a new default group needs its own
        self._hook_world: weakref.ref | None = None
        # a hook state without a process group takes the hook group, of each fit anew
        self._hook_state_takes_group = getattr(hook_state, "process_group", False) is None
        if step_timeout is not None and not can_set_timeout():
            rank_zero_warn(
                f"MQGNNStrategy: step_timeout={step_timeout} needs torch >= 2.3, which can change a "
                f"process group's timeout; torch {torch.__version__} cannot, so the group's `timeout` "
                "bounds every collective and a hung rank holds the others that long"
            )
            step_timeout = None
        self.step_timeout = None if step_timeout is None else timedelta(seconds=float(step_timeout))
        self.group_timeout: timedelta = kwargs.get("timeout") or default_pg_timeout
        self._epoch_met: int | None = None  # the epoch whose first batch the ranks last met at
        self._fit_id: str | None = None  # the fit's identifier every rank agreed on (its meetings')
        self.staleness = staleness
        self.max_staleness = max_staleness
        self.sync_scale = float(sync_scale)
        self.sync_optimizer_state = sync_optimizer_state
        self._requested_sync_period = sync_period
        self.sync_period: int | None = sync_period  # resolved at setup
        self.comm_stats = CommStats()
        self._reducer: AllReduce | None = None
        self._queues: dict[int, GradientQueue] = {}  # by optimiser index in self.optimizers
        self._restored_queues: dict[int, dict[str, Any]] = {}
        self.predict_weights = predict_weights
        self._predictions: dict[int, WeightPrediction] = {}  # by optimiser index, as the queues
        self._restored_predictions: dict[int, dict[str, Any]] = {}
        self._restored_rank_buffers: list[list[Tensor]] | None = None

    @property
    def find_unused_parameters(self) -> bool:
        return bool(self._ddp_kwargs.get("find_unused_parameters", False))

    @property
    def broadcasts_buffers(self) -> bool:
        return bool(self._ddp_kwargs.get("broadcast_buffers", True))

    # ----------------------------------------------------------------- setup / teardown
    @override
    def connect(self, model: LightningModule) -> None:
        # Checked here, in every process before the process group starts, so a bad setup fails fast.
        plugin = self.precision_plugin
        if self.staleness > 0 and isinstance(plugin, MixedPrecision) and plugin.scaler is not None:
            raise ValueError(
                f"MQGNNStrategy: precision={plugin.precision!r} uses a GradScaler, whose loss scale changes "
                "between steps, so a stale gradient would be unscaled with the wrong factor; use "
                "precision='bf16-mixed' or '32-true', or staleness=0"
            )
        if self.predict_weights and self.staleness != 0:
            self.check_prediction_applies(model.automatic_optimization, model.trainer.accumulate_grad_batches)
        super().connect(model)

    def check_prediction_applies(self, automatic_optimization: bool, accumulate_grad_batches: int) -> None:
        """Raise ``ValueError`` where ``predict_weights=True`` cannot hold at staleness > 0. The predicted
        weights hold for the forward and backward inside the optimiser step's closure: every batch's,
        unless the forward ran before it (manual optimisation) or outside it (accumulation)."""
        if not self.predict_weights or self.staleness == 0:
            return
        if not automatic_optimization:
            raise ValueError(
                "MQGNNStrategy: predict_weights=True runs the forward and backward inside the optimiser "
                "step's closure at the predicted weights; under manual optimisation the forward has run "
                "before optimizer.step(), so use automatic optimisation or predict_weights=False"
            )
        if accumulate_grad_batches != 1:
            raise ValueError(
                f"MQGNNStrategy: predict_weights=True with accumulate_grad_batches={accumulate_grad_batches}: "
                "Lightning runs the forward and backward of the batches that do not step outside the "
                "optimiser step, so they would see the weights, not the prediction; use "
                "accumulate_grad_batches=1 or predict_weights=False"
            )

    @override
    def setup_distributed(self) -> None:
        super().setup_distributed()
        destroy_process_group_at_exit()
        if self.world_size > 1:  # to name a failed rank on this host, and to watch it at a meeting
            remember_peers()
        world = dist.group.WORLD
        made_in = None if self._hook_world is None else self._hook_world()
        if self.staleness > 0 and self.comm_hook is not None and made_in is not world:
            self._hook_group = new_hook_group(dist.get_backend())
            self._hook_world = weakref.ref(world)

    @override
    def setup(self, trainer: Trainer) -> None:
        super().setup(trainer)
        if trainer.state.fn == TrainerFn.FITTING and self.staleness > 0:
            self.sync_period = self._resolve_sync_period(trainer)

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
        if self.staleness == 0:
            super().configure_ddp()
            if self.comm_hook is not None and not self._lightning_registers_hook:
                # on every device (Lightning registers hooks on CUDA only; DDP runs them on any backend)
                assert isinstance(self.model, DistributedDataParallel)
                self.model.register_comm_hook(self.comm_hook_state, self._counted(self.comm_hook))
            return
        # No wrapper: the gradient queue exchanges gradients. Start from rank 0's parameters and buffers,
        # as DDP's constructor does.
        assert self.model is not None
        _sync_module_states(self.model)
        self._restore_rank_buffers()

    @override
    def teardown(self) -> None:
        # in-flight all-reduces must finish before the process group goes away; when a rank has
        # failed and Lightning tears down on that error, theirs fail too: the first error stands
        failing = sys.exc_info()[1] is not None
        try:
            with collective_phase("gradient-queue reduction"):
                for queue in self._queues.values():
                    queue.clear()
        except RankFailure:
            if not failing:
                raise
        finally:
            if self._hooked is not None:
                self._hooked.close(timeout=None if not failing else 5.0)
                self._hooked = None
        self._queues = {}
        self._predictions = {}
        self._reducer = None
        self._set_timeout(self.group_timeout)  # a fit that failed never reached on_train_end
        super().teardown()

    @override
    def __getstate__(self) -> dict:
        state = super().__getstate__()
        state["_reducer"] = None
        state["_queues"] = {}
        state["_hooked"] = None
        state["_hook_group"] = None
        state["_hook_world"] = None
        return state

    # ----------------------------------------------------------------- Lightning's collectives
    def _loop_phase(self) -> str:
        trainer = None if self.lightning_module is None else self.lightning_module._trainer
        if trainer is None:
            return "collective"
        if trainer.sanity_checking or trainer.validating:
            return "validation"
        return {"test": "test", "predict": "prediction"}.get(str(trainer.state.stage), "training")

    @override
    def barrier(self, *args: Any, **kwargs: Any) -> None:
        name = args[0] if args else kwargs.get("name")
        phase = "checkpoint" if name is not None and "checkpoint" in str(name) else self._loop_phase()
        with collective_phase(phase):
            super().barrier(*args, **kwargs)

    @override
    def broadcast(self, obj: Any, src: int = 0) -> Any:
        with collective_phase(self._loop_phase()):
            return super().broadcast(obj, src)

    @override
    def reduce(self, tensor: Any, group: Any | None = None, reduce_op: Any = "mean") -> Any:
        with collective_phase(self._loop_phase()):
            return super().reduce(tensor, group=group, reduce_op=reduce_op)

    @override
    def all_gather(self, tensor: Tensor, group: Any | None = None, sync_grads: bool = False) -> Tensor:
        with collective_phase(self._loop_phase()):
            return super().all_gather(tensor, group=group, sync_grads=sync_grads)

    # ----------------------------------------------------------------- buffer policy (staleness > 0)
    def _broadcast_buffers_from_rank_zero(self) -> None:
        if self.staleness == 0 or not self.broadcasts_buffers or not dist.is_initialized():
            return
        if self.world_size > 1 and self.lightning_module is not None:
            with torch.no_grad():
                broadcast_buffers(self.lightning_module, src=0)

    @override
    def on_validation_start(self) -> None:
        super().on_validation_start()
        self._broadcast_buffers_from_rank_zero()

    @override
    def on_test_start(self) -> None:
        super().on_test_start()
        self._broadcast_buffers_from_rank_zero()

    @override
    def on_predict_start(self) -> None:
        super().on_predict_start()
        self._broadcast_buffers_from_rank_zero()

    @override
    def on_train_end(self) -> None:
        super().on_train_end()
        self._broadcast_buffers_from_rank_zero()
        self._set_timeout(self.group_timeout)

    # ----------------------------------------------------------------- timeouts
    def _set_timeout(self, timeout: timedelta | None) -> None:
        """Let every later collective of this rank's process groups wait at most ``timeout``."""
        if timeout is None or not dist.is_initialized():
            return
        for group in [None] + ([self._hook_group] if self._hook_group is not None else []):
            set_timeout(timeout, group)

    @override
    def on_train_start(self) -> None:
        super().on_train_start()
        self._epoch_met = None
        if self.step_timeout is not None and self.world_size > 1:  # under the group's own timeout
            self._fit_id = agree_on_fit()
        self._set_timeout(self.step_timeout)

    @override
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        super().on_train_batch_start(batch, batch_idx)
        epoch = self.lightning_module.trainer.current_epoch  # called by the fit loop: a trainer is there
        if self.step_timeout is None or epoch == self._epoch_met:
            return
        # an epoch's first batch may take each rank a different while (its loader's start, a GNS
        # cache refilled from the disk): the ranks meet once it is in, waiting for slow ranks up
        # to the group's own timeout and for a stopped one step_timeout, as in a step
        self._epoch_met = epoch
        if self.world_size > 1:
            assert self._fit_id is not None  # agreed on at the training's start
            meeting = Meeting(self._fit_id, epoch)
            meet(meeting, "training", self.step_timeout.total_seconds(), self.group_timeout.total_seconds())

    # ----------------------------------------------------------------- training step
    def make_reducer(self) -> Reducer:
        """The all-reduce the gradient queues and model syncs use (a subclass may wrap it)."""
        return AllReduce(group=None)

    def _get_reducer(self) -> Reducer:
        if self._reducer is None:
            self._reducer = self.make_reducer()
        return self._reducer

    def _get_hooked(self) -> HookedBuckets | None:
        """The thread that runs the comm hook on every queue's buckets (one for all, in push order)."""
        if self.comm_hook is None:
            return None
        if self._hooked is None:
            group = self._hook_group if self._hook_group is not None else dist.group.WORLD
            if self._hook_state_takes_group:
                self.comm_hook_state.process_group = group
            self._hooked = HookedBuckets(self.comm_hook, with_process_group(self.comm_hook_state, group))
        return self._hooked

    def _optimizer_index(self, optimizer: Optimizer) -> int:
        index = next((i for i, opt in enumerate(self.optimizers) if opt is optimizer), None)
        if index is None:
            raise ValueError(
                f"MQGNNStrategy: {type(optimizer).__name__} is not one of the optimisers returned by "
                "configure_optimizers, so it has no gradient queue"
            )
        return index

    def _get_prediction(self, optimizer: Optimizer) -> WeightPrediction:
        index = self._optimizer_index(optimizer)
        if index not in self._predictions:
            prediction = WeightPrediction(self._get_queue(optimizer).params)
            if index in self._restored_predictions:
                prediction.load_state_dict(self._restored_predictions.pop(index))
            self._predictions[index] = prediction
        return self._predictions[index]

    def _get_queue(self, optimizer: Optimizer) -> GradientQueue:
        index = self._optimizer_index(optimizer)
        if index not in self._queues:
            assert self.lightning_module is not None
            names = {id(p): name for name, p in self.lightning_module.named_parameters()}
            params = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
            queue = GradientQueue(
                params,
                self.staleness,
                self._get_reducer(),
                allow_missing=self.find_unused_parameters,
                names=[names.get(id(p), f"optimizer {index} parameter {i}") for i, p in enumerate(params)],
                hook=self._get_hooked(),
                bucket_cap_mb=self.bucket_cap_mb,
            )
            if index in self._restored_queues:
                queue.load_state_dict(self._restored_queues.pop(index))
            self._queues[index] = queue
        return self._queues[index]

    @override
    def optimizer_step(
        self,
        optimizer: Optimizer,
        closure: Callable[[], Any],
        model: LightningModule | Module | None = None,
        **kwargs: Any,
    ) -> Any:
        stats = self.comm_stats
        stats.steps += 1
        if self.staleness == 0:  # DDP's reducer has averaged the gradients during backward
            stats.applied_steps += 1
            with collective_phase("gradient all-reduce"):
                output = super().optimizer_step(optimizer, closure, model, **kwargs)
            stats.add_grad_bytes(self._ddp_step_bytes(optimizer), 1)
            return output

        queue = self._get_queue(optimizer)
        prediction = self._get_prediction(optimizer) if self.predict_weights else None
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
            # automatic optimisation: forward + backward; manual: the user's manual_backward already ran
            if prediction is None:
                result = closure()
            else:  # at the weights this gradient will be applied to, `staleness` updates on
                with prediction.predicted(self.staleness):
                    result = closure()
            with collective_phase("gradient-queue reduction"):
                queue.push()  # start the asynchronous all-reduce of this step (eq. 20-21)
                if queue.ready():  # the step `staleness` steps ago is due: .grad <- its average
                    stats.grad_wait_s += queue.apply_oldest()
            return result

        def apply_next() -> None:
            with collective_phase("gradient-queue reduction"):
                stats.grad_wait_s += queue.apply_oldest()

        updates = 0
        if len(queue) + 1 > self.staleness:
            output = super().optimizer_step(optimizer, closure_then_exchange, model, **kwargs)  # eq. 22
            updates += 1
            while queue.ready():  # a lowered staleness drains: each older average its own update
                super().optimizer_step(optimizer, apply_next, model, **kwargs)
                updates += 1
        else:  # queue fill: nothing averaged to apply yet, keep the weights (identical on all ranks)
            output = closure_then_exchange()
            stats.skipped_steps += 1
        stats.applied_steps += updates
        if prediction is not None:
            prediction.record(updates)

        stats.add_grad_bytes(*queue.take_sent())
        if self.sync_period is not None and stats.steps % self.sync_period == 0:
            self.synchronise_model()
            if self.adaptive:
                self.adapt_staleness()
        stats.staleness = self.staleness
        return output

    def adapt_staleness(self) -> None:
        """``staleness="auto"``: the staleness every rank's recent steps needed (a collective)."""
        needed = [k for queue in self._queues.values() for k in queue.needed_staleness()]
        # the 90th percentile by nearest rank: one slow step in ten (a collection, a page fault) does not count
        mine = float(sorted(needed)[math.ceil(0.9 * len(needed)) - 1]) if needed else float(self.staleness)
        with collective_phase("model synchronisation"):
            agreed = self.reduce(torch.tensor(mine, device=self.root_device), reduce_op="max")
        chosen = min(max(int(agreed), 1), self.max_staleness)
        if chosen != self.staleness:
            self.comm_stats.staleness_changes += 1
            self.set_staleness(chosen)

    def set_staleness(self, staleness: int) -> None:
        """Apply averages ``staleness`` steps old from the next step on (every queue)."""
        self.staleness = staleness
        self.comm_stats.staleness = staleness
        for queue in self._queues.values():
            queue.staleness = staleness

    def _counted(self, hook: CommHook) -> CommHook:
        """``hook`` for DDP, adding what it sent to the bytes of the step (``payload_meter``)."""

        @functools.wraps(hook)  # DDP's logging data names the user's hook
        def counted_hook(state, bucket):  # no annotations: DDP checks them against its own classes
            meter = payload_meter(hook, state, bucket)

            def count(future: torch.futures.Future) -> Tensor:
                sent = meter()
                if sent is None or self._ddp_hook_bytes is None:
                    self._ddp_hook_bytes = None
                else:
                    self._ddp_hook_bytes += sent
                return future.value()

            return hook(state, bucket).then(count)

        return counted_hook

    def _ddp_step_bytes(self, optimizer: Optimizer) -> int | None:
        """The gradient bytes of a DDP step: every trainable parameter's gradient once, or what
        the comm hook sent (None where its traffic is not known)."""
        if self.comm_hook is None:
            params = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
            return sum(p.numel() * p.element_size() for p in params)
        sent, self._ddp_hook_bytes = self._ddp_hook_bytes, 0
        return sent

    def result_fields(self) -> str:
        """RESULT fields of a fit: the staleness in force, gradient bytes and wait per step."""
        stats = self.comm_stats
        return (
            f" staleness={'auto:' if self.adaptive else ''}{self.staleness}"
            f" grad_mb_per_step={stats.grad_bytes_per_step / 2**20:.4f}"
            f" grad_wait_ms_per_step={1000 * stats.grad_wait_s / max(stats.steps, 1):.3f}"
        )

    def synchronise_model(self) -> None:
        """Average parameters, float buffers and (optionally) optimiser state across ranks (RaCoM sync)."""
        assert self.lightning_module is not None
        start = time.perf_counter()
        tensors = sync_tensors(self.lightning_module, self.optimizers, self.sync_optimizer_state)
        with torch.no_grad(), collective_phase("model synchronisation"):
            average_across_ranks(tensors, self._get_reducer())
        self.comm_stats.sync_s += time.perf_counter() - start
        self.comm_stats.syncs += 1

    @override
    def on_exception(self, exception: BaseException) -> None:
        super().on_exception(exception)  # DDP's unused-parameter message becomes Lightning's
        if isinstance(exception, UnusedParametersError) and exception.args:
            unused = ", ".join(exception.unused)
            exception.args = (
                f"{exception.args[0]} Without a gradient on some ranks: {unused}.",
                *exception.args[1:],
            )

    # ----------------------------------------------------------------- checkpointing
    def state_dict(self) -> dict[str, Any]:
        """Strategy state for a checkpoint: queued averaged gradients and counters (drains in-flight work)."""
        return {
            "staleness": self.staleness,
            "sync_period": self.sync_period,
            "comm_stats": self.comm_stats.as_dict(),
            "queues": {index: queue.state_dict() for index, queue in self._queues.items()},
            "predictions": {
                index: prediction.state_dict() for index, prediction in self._predictions.items()
            },
        }

    def _load_state(self, state: dict[str, Any]) -> None:
        for key, value in state["comm_stats"].items():
            setattr(self.comm_stats, key, type(getattr(self.comm_stats, key))(value))
        if self.adaptive:  # the staleness in force when it was written: the queued steps follow it
            self.set_staleness(min(int(state["staleness"]), self.max_staleness))
        self._restored_queues = dict(state["queues"])
        for index, queue in self._queues.items():  # queues that already exist load at once
            if index in self._restored_queues:
                queue.load_state_dict(self._restored_queues.pop(index))
        # a checkpoint written without prediction resumes with the last update unknown (zero)
        self._restored_predictions = dict(state.get("predictions", {})) if self.predict_weights else {}
        for index, prediction in self._predictions.items():
            if index in self._restored_predictions:
                prediction.load_state_dict(self._restored_predictions.pop(index))

    @override
    def save_checkpoint(
        self, checkpoint: dict[str, Any], filepath: _PATH, storage_options: Any = None
    ) -> None:
        # Called on every rank (Trainer.save_checkpoint's contract): gather the rank-local buffers here.
        module = self.lightning_module
        trainer = None if module is None else module._trainer
        with collective_phase("checkpoint"):
            if self.staleness > 0 and trainer is not None and trainer.state.fn == TrainerFn.FITTING:
                state = self.state_dict()
                if self.world_size > 1 and dist.is_initialized():
                    state["rank_buffers"] = gather_buffers(module)
                checkpoint[CHECKPOINT_KEY] = state
            super().save_checkpoint(checkpoint, filepath, storage_options=storage_options)

    @override
    def load_checkpoint(self, checkpoint_path: _PATH, weights_only: bool | None = None) -> dict[str, Any]:
        checkpoint = super().load_checkpoint(checkpoint_path, weights_only=weights_only)
        state = checkpoint.get(CHECKPOINT_KEY)
        if state is not None and self.staleness > 0:
            self._load_state(state)
        return checkpoint

    @override
    def load_model_state_dict(self, checkpoint: Mapping[str, Any], strict: bool = True) -> None:
        super().load_model_state_dict(checkpoint, strict=strict)
        state = checkpoint.get(CHECKPOINT_KEY) or {}
        # applied after the rank-0 broadcast of setup (Lightning restores the model before setting up)
        self._restored_rank_buffers = state.get("rank_buffers") if self.staleness > 0 else None

    def _restore_rank_buffers(self) -> None:
        rank_buffers, self._restored_rank_buffers = self._restored_rank_buffers, None
        if rank_buffers is None or self.lightning_module is None:
            return
        buffers = list(self.lightning_module.buffers())
        if len(rank_buffers) != self.world_size or len(rank_buffers[self.global_rank]) != len(buffers):
            rank_zero_warn(
                f"MQGNNStrategy: the checkpoint holds the buffers of {len(rank_buffers)} ranks "
                f"({len(rank_buffers[0])} each); this run has {self.world_size} ranks and {len(buffers)} "
                "buffers, so every rank starts from rank 0's buffers"
            )
            return
        with torch.no_grad():
            for buffer, saved in zip(buffers, rank_buffers[self.global_rank]):
                buffer.copy_(saved.to(device=buffer.device, dtype=buffer.dtype))

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
