"""Single-process tests of MQGNNStrategy's parts: eq. 23, the gradient queue, model averaging, setup checks."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
import torch.distributed as dist
from helpers.devices import require_cuda
from helpers.paths import CONF
from lightning.pytorch.plugins.precision import MixedPrecision
from lightning.pytorch.strategies import StrategyRegistry
from torch import nn

import lightning_mqgnn.strategy  # noqa: F401  (registers the strategy names)
from lightning_mqgnn.graph.csr import CSRGraph
from lightning_mqgnn.strategy import (
    CommStats,
    GraphSize,
    MQGNNStrategy,
    graph_size_from_datamodule,
    sync_period,
)
from lightning_mqgnn.strategy.gradient_queue import GradientQueue, UnusedParametersError
from lightning_mqgnn.strategy.model_sync import average_across_ranks, sync_tensors


class _Done:
    def wait(self) -> None:
        pass

    def is_completed(self) -> bool:
        return True


class MirrorReducer:
    """Stands in for ``world_size`` ranks that all hold the same tensors: the sum is world_size * x."""

    def __init__(self, world_size: int = 2) -> None:
        self.world_size = world_size
        self.launched = 0

    def launch(self, tensors):
        self.launched += 1
        for t in tensors:
            t.mul_(self.world_size)
        return _Done()


# ------------------------------------------------------------------ eq. 23
def test_sync_period_follows_eq_23():
    # ceil(k * sqrt(V) / sqrt(G * E))
    assert sync_period(10_000, 100, 1, k=1.0) == 10
    assert sync_period(10_000, 100, 4, k=1.0) == 5
    assert sync_period(2708, 10556, 2, k=1.0) == 1  # the paper's k = 1 gives P = 1 on real graphs (Cora)
    assert sync_period(2708, 10556, 2, k=100.0) == 36  # our default scale
    assert sync_period(2708, 10556, 2) == 36


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ((0, 10, 2), "num_nodes"),
        ((10, 0, 2), "num_edges"),
        ((10, 10, 0), "world_size"),
        ((10, 10, 1.5), "world_size"),
    ],
)
def test_sync_period_rejects_bad_sizes(args, field):
    with pytest.raises(ValueError, match=field):
        sync_period(*args)
    with pytest.raises(ValueError, match="scale factor k"):
        sync_period(10, 10, 1, k=0.0)


def test_graph_size_contract():
    class WithStats:
        def graph_stats(self):
            return {"num_nodes": 5, "num_edges": 7}

    class WithTuple:
        def graph_stats(self):
            return (17, 19)

    class WithGraph:
        graph = CSRGraph.from_edges(torch.tensor([0, 1]), torch.tensor([1, 2]), 3, symmetrize=True)

    class WithAttrs:
        num_nodes, num_edges = 11, 13

    class BadStats:
        def graph_stats(self):
            return {"nodes": 5}

    assert graph_size_from_datamodule(WithStats()) == GraphSize(5, 7)
    assert graph_size_from_datamodule(WithTuple()) == GraphSize(17, 19)
    assert graph_size_from_datamodule(WithGraph()) == GraphSize(3, 4)
    assert graph_size_from_datamodule(WithAttrs()) == GraphSize(11, 13)
    assert graph_size_from_datamodule(object()) is None
    assert graph_size_from_datamodule(None) is None
    with pytest.raises(ValueError, match="BadStats.graph_stats"):
        graph_size_from_datamodule(BadStats())


# ------------------------------------------------------------------ gradient queue
def _params():
    torch.manual_seed(0)
    return [
        nn.Parameter(torch.randn(3, 2)),
        nn.Parameter(torch.randn(4)),
        nn.Parameter(torch.randn(2, dtype=torch.float64)),
    ]


def _set_grads(params, step):
    for i, p in enumerate(params):
        p.grad = torch.full_like(p, float(10 * step + i))


@pytest.mark.parametrize("staleness", [0, 1, 2])
def test_queue_applies_the_gradient_of_step_t_minus_staleness(staleness):
    params = _params()
    reducer = MirrorReducer(world_size=2)
    queue = GradientQueue(params, staleness, reducer)
    applied = []
    for step in range(5):
        _set_grads(params, step)
        queue.push()
        if queue.ready():
            queue.apply_oldest()
            applied.append([p.grad.clone() for p in params])
    assert len(applied) == 5 - staleness
    for k, grads in enumerate(applied):
        expected_step = k  # the first application is the gradient of step 0, `staleness` steps late
        for i, (p, g) in enumerate(zip(params, grads)):
            assert g.dtype == p.dtype and g.shape == p.shape
            assert torch.equal(g, torch.full_like(p, float(10 * expected_step + i)))  # (x/2)*2: the mean
    # one all-reduce per (dtype, device) group per step: float32 and float64 here
    assert reducer.launched == 5


def test_queue_keeps_none_only_for_parameters_without_gradient():
    params = _params()
    queue = GradientQueue(params, 0, MirrorReducer())
    _set_grads(params, 1)
    params[1].grad = None
    queue.push()
    queue.apply_oldest()
    assert params[1].grad is None
    assert torch.equal(params[0].grad, torch.full_like(params[0], 10.0))


class OtherRankReducer:
    """Two ranks, the other one holding a gradient of 2 (1 after the division) for every parameter."""

    world_size = 2

    def launch(self, tensors):
        for t in tensors:
            t.add_(1.0)
        return _Done()


def test_queue_without_allow_missing_names_the_parameters_without_gradient():
    params = _params()
    queue = GradientQueue(params, 1, OtherRankReducer(), allow_missing=False, names=["a", "b", "c"])
    _set_grads(params, 1)
    params[2].grad = None  # the other rank has it: 1 of 2 ranks
    queue.push()
    _set_grads(params, 2)
    queue.push()
    # step 0's gradients, the first applied: host counts are checked as they are applied
    with pytest.raises(UnusedParametersError, match=r"c \(1/2 ranks\).*find_unused_parameters=True") as info:
        queue.apply_oldest()
    assert info.value.unused == ["c (1/2 ranks)"]
    assert str(info.value).startswith(
        "Expected to have finished reduction in the prior iteration"
    )  # DDP's words
    queue = GradientQueue(params, 0, OtherRankReducer(), allow_missing=False)
    for step in range(3):  # every rank had every gradient: no error
        _set_grads(params, step)
        queue.push()
        queue.apply_oldest()
    assert torch.equal(params[0].grad, torch.full_like(params[0], 11.0))  # (20 + 2) / 2


@pytest.mark.gpu
def test_queue_presence_check_on_cuda_reads_the_counts_a_step_late():
    """On CUDA the counts travel to the host with a non-blocking copy and an event, read at the next
    application (no device synchronisation); the error is the same, a step later."""
    require_cuda()
    params = [nn.Parameter(p.detach().cuda()) for p in _params()]
    queue = GradientQueue(params, 0, OtherRankReducer(), allow_missing=False, names=["a", "b", "c"])
    _set_grads(params, 1)
    params[0].grad = None
    queue.push()
    queue.apply_oldest()
    assert queue._presence is not None and queue._presence.ready is not None
    assert queue._presence.counts[0].device.type == "cpu"
    _set_grads(params, 2)
    queue.push()
    with pytest.raises(RuntimeError, match=r"a \(1/2 ranks\)"):
        queue.apply_oldest()


def test_queue_averages_with_a_rank_that_has_the_gradient():
    params = _params()
    queue = GradientQueue(params, 0, OtherRankReducer())
    _set_grads(params, 1)  # 10, 11, 12
    params[1].grad = None  # this rank: no gradient; the other rank: 2
    queue.push()
    queue.apply_oldest()
    assert torch.equal(params[1].grad, torch.full_like(params[1], 1.0))  # (0 + 2) / 2
    assert torch.equal(params[0].grad, torch.full_like(params[0], 6.0))  # (10 + 2) / 2


def test_queue_state_round_trip_and_mismatch():
    params = _params()
    queue = GradientQueue(params, 2, MirrorReducer())
    for step in range(2):
        _set_grads(params, step)
        queue.push()
    state = queue.state_dict()
    assert len(state["pending"]) == 2

    restored = GradientQueue(params, 2, MirrorReducer())
    restored.load_state_dict(state)
    assert len(restored) == 2 and not restored.ready()
    _set_grads(params, 2)
    restored.push()
    restored.apply_oldest()
    assert torch.equal(params[0].grad, torch.full_like(params[0], 0.0))  # step 0's gradient, as before

    other = GradientQueue([nn.Parameter(torch.randn(5))], 2, MirrorReducer())
    with pytest.raises(ValueError, match="group_numels"):
        other.load_state_dict(state)
    with pytest.raises(ValueError, match="pending"):
        GradientQueue(params, 1, MirrorReducer()).load_state_dict(state)


# ------------------------------------------------------------------ model averaging
def test_model_sync_averages_params_buffers_and_optimizer_state():
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.randn(8, 3)).sum().backward()
    opt.step()
    tensors = sync_tensors(model, [opt], with_optimizer_state=True)
    # 4 params + running_mean/var (num_batches_tracked is an integer) + exp_avg/exp_avg_sq per param
    assert len(tensors) == 4 + 2 + 8
    assert len(sync_tensors(model, [opt], with_optimizer_state=False)) == 6
    before = [t.clone() for t in tensors]
    average_across_ranks(tensors, MirrorReducer(world_size=4))
    for b, t in zip(before, tensors):
        assert torch.allclose(b, t)  # mean of 4 identical copies
    assert opt.state[model[0].weight]["step"].dim() == 0  # counters untouched


# ------------------------------------------------------------------ construction, registry, setup checks
def test_registry_names_and_defaults():
    strategy = StrategyRegistry.get("mqgnn")
    assert (
        isinstance(strategy, MQGNNStrategy) and strategy.staleness == 1 and strategy._start_method == "popen"
    )
    assert StrategyRegistry.get("mqgnn_spawn")._start_method == "spawn"
    assert isinstance(strategy.comm_stats, CommStats)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"staleness": -1}, "staleness"),
        ({"staleness": 1.5}, "staleness"),
        ({"sync_period": 0}, "sync_period"),
        ({"sync_scale": 0.0}, "sync_scale"),
        ({"static_graph": True}, "static_graph"),
        ({"gradient_as_bucket_view": True}, "gradient_as_bucket_view"),
        ({"model_averaging_period": 4}, "sync_period"),
    ],
)
def test_constructor_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MQGNNStrategy(**kwargs)


class _Tiny(pl.LightningModule):
    def __init__(self, manual: bool = False):
        super().__init__()
        self.layer = nn.Linear(2, 1)
        self.automatic_optimization = not manual

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(4, 2)), batch_size=2)


def _trainer(strategy, **kwargs):
    return pl.Trainer(
        accelerator="cpu",
        devices=1,
        strategy=strategy,
        max_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **kwargs,
    )


def test_staleness_zero_accepts_every_ddp_argument():
    """At staleness 0 the strategy is DDPStrategy: wrapper options and comm hooks pass through to it."""
    strategy = MQGNNStrategy(
        staleness=0, static_graph=True, bucket_cap_mb=5, find_unused_parameters=True, ddp_comm_hook=_hook
    )
    assert strategy._ddp_kwargs == {"static_graph": True, "bucket_cap_mb": 5, "find_unused_parameters": True}
    assert strategy.comm_hook is _hook
    queue_only = MQGNNStrategy(staleness=1, find_unused_parameters=True, broadcast_buffers=False)
    assert queue_only.find_unused_parameters and not queue_only.broadcasts_buffers


def test_staleness_one_takes_comm_hooks_buckets_and_ddp_defaults():
    """The queue applies DDP's comm hooks in buckets of ``bucket_cap_mb``; wrapper arguments that hold
    DDP's default mean nothing without the wrapper and are accepted."""
    strategy = MQGNNStrategy(
        staleness=1, ddp_comm_hook=_hook, bucket_cap_mb=5, static_graph=False, gradient_as_bucket_view=False
    )
    assert strategy.comm_hook is _hook and strategy.bucket_cap_mb == 5.0
    wrapped = MQGNNStrategy(staleness=1, ddp_comm_hook=_hook, ddp_comm_wrapper=lambda hook: (hook, "wrapped"))
    assert wrapped.comm_hook == (_hook, "wrapped")


def _hook(state, bucket):
    return bucket


def test_grad_scaler_with_staleness_is_rejected():
    scaler_plugin = MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu"))
    with pytest.raises(ValueError, match="GradScaler"):
        _trainer(MQGNNStrategy(staleness=1), plugins=[scaler_plugin]).fit(_Tiny())
    assert not dist.is_initialized()


# ------------------------------------------------------------------ Hydra configs (the library never imports Hydra)
@pytest.mark.parametrize("name", ["auto", "ddp", "mqgnn"])
def test_strategy_configs_instantiate(name):

    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate
    from lightning.pytorch.strategies import DDPStrategy

    conf_dir = CONF
    with initialize_config_dir(str(conf_dir), version_base="1.3"):
        cfg = compose(config_name=None, overrides=[f"+strategy={name}"])
    if name == "auto":  # the recipe passes a `name` config to the Trainer as the registry string
        assert cfg.strategy.name == "auto"
        return
    strategy = instantiate(cfg.strategy)
    if name == "ddp":
        assert type(strategy) is DDPStrategy
    else:
        assert isinstance(strategy, MQGNNStrategy)
        assert strategy.staleness == 1 and strategy.sync_period is None and strategy.sync_scale == 100.0


def test_comm_stats_are_logged_on_the_loggers_steps_and_at_each_epochs_last_batch():
    from types import SimpleNamespace

    from lightning_mqgnn.callbacks import CommStatsMonitor

    logged: list[int] = []
    stats = SimpleNamespace(as_dict=lambda: {"steps": 1.0})
    module = SimpleNamespace(log_dict=lambda metrics, **kw: logged.append(trainer.global_step))
    trainer = SimpleNamespace(strategy=SimpleNamespace(comm_stats=stats), log_every_n_steps=5)
    monitor = CommStatsMonitor()
    for step in range(1, 13):  # global_step after each optimiser step; epochs of 6 batches
        trainer.global_step, trainer.is_last_batch = step, step % 6 == 0
        monitor.on_train_batch_end(trainer, module, None, None, step - 1)
    assert logged == [5, 6, 10, 12]
    trainer.strategy = SimpleNamespace()  # another strategy: nothing to log
    monitor.on_train_batch_end(trainer, module, None, None, 12)
    assert logged == [5, 6, 10, 12]
