"""Standalone multi-process run for the MQGNNStrategy tests (launched by tests/test_strategy_distributed.py).

A plain (non-GNN) LightningModule on synthetic regression data. Each rank writes ``<out>/rank<r>.pt``
with its final flattened parameters, losses, the strategy's counters and per-step cross-rank differences.
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.strategies import DDPStrategy
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.utils.data import DataLoader, TensorDataset

import lightning_mqgnn.strategy  # noqa: F401  (registers "mqgnn" / "mqgnn_spawn")
from lightning_mqgnn.callbacks import CommStatsMonitor
from lightning_mqgnn.strategy import MQGNNStrategy, QuantizeState, quantize_hook


class Regressor(pl.LightningModule):
    """Two-layer MLP (optionally with batch norm, whose running stats are rank-local) on MSE."""

    def __init__(
        self, batch_norm: bool = False, optimizer: str = "adam", lr: float = 0.01, manual: bool = False
    ):
        super().__init__()
        layers: list[nn.Module] = [nn.Linear(8, 32)]
        if batch_norm:
            layers.append(nn.BatchNorm1d(32))
        layers += [nn.Tanh(), nn.Linear(32, 1)]
        self.net = nn.Sequential(*layers)
        self.optimizer_name = optimizer
        self.lr = lr
        self.automatic_optimization = not manual
        self.losses: list[float] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x).squeeze(-1), y)
        self.losses.append(float(loss.detach()))
        return loss

    def configure_optimizers(self):
        if self.optimizer_name == "sgd":
            return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)
        return torch.optim.Adam(self.parameters(), lr=self.lr)


class Client(Regressor):
    """What a Lightning user brings: batch norm, a validation loop logging a synced metric, test and predict
    steps, a per-step LR schedule (optimiser SGD with momentum)."""

    def __init__(self, schedule: bool = True, unused: bool = False) -> None:
        super().__init__(batch_norm=True, optimizer="sgd", lr=0.05)
        self.schedule = schedule
        self.unused = nn.Linear(8, 1) if unused else None  # never called: no gradient on any rank

    def validation_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x).squeeze(-1), y)
        self.log("val_loss", loss, sync_dist=True)

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_loss", nn.functional.mse_loss(self.net(x).squeeze(-1), y), sync_dist=True)

    def predict_step(self, batch, batch_idx):
        return self.net(batch[0]).squeeze(-1)

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)
        if not self.schedule:
            return optimizer
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.9)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class ManualRegressor(Regressor):
    """Manual optimisation: zero_grad, manual_backward, step -- over one SGD or over two (one per layer)."""

    def __init__(self, two_optimizers: bool) -> None:
        super().__init__(optimizer="sgd", lr=0.05, manual=True)
        self.two_optimizers = two_optimizers

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x).squeeze(-1), y)
        self.losses.append(float(loss.detach()))
        optimizers = self.optimizers()
        optimizers = optimizers if isinstance(optimizers, list) else [optimizers]
        for optimizer in optimizers:
            optimizer.zero_grad()
        self.manual_backward(loss)
        for optimizer in optimizers:
            optimizer.step()

    def configure_optimizers(self):
        if not self.two_optimizers:
            return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)
        first, rest = list(self.net[0].parameters()), list(self.net[1:].parameters())
        return [torch.optim.SGD(p, lr=self.lr, momentum=0.9) for p in (first, rest)]


def synthetic_data(n: int = 128, seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    w = torch.randn(8, generator=g)
    y = torch.tanh(x @ w) + 0.05 * torch.randn(n, generator=g)
    return TensorDataset(x, y)


class LateEpochStart(TensorDataset):
    """On rank 1, the first sample of each epoch takes ``delay_s``: a loader that starts slowly
    there. A rank reads its share of the samples once an epoch, so every share's first read is an
    epoch's first."""

    def __init__(self, data: TensorDataset, delay_s: float) -> None:
        super().__init__(*data.tensors)
        self.delay_s = delay_s
        self.reads = 0

    def __getitem__(self, index):
        dist = torch.distributed
        if dist.is_initialized() and dist.get_rank() == 1:
            if self.reads % (len(self) // dist.get_world_size()) == 0:
                time.sleep(self.delay_s)
            self.reads += 1
        return super().__getitem__(index)


class StopsAtEpochStart(LateEpochStart):
    """On rank 1, the first sample of the second epoch stops the process (SIGSTOP): a rank that
    hangs while its loader starts an epoch."""

    def __init__(self, data: TensorDataset) -> None:
        super().__init__(data, 0.0)

    def __getitem__(self, index):
        dist = torch.distributed
        if (
            dist.is_initialized()
            and dist.get_rank() == 1
            and self.reads == len(self) // dist.get_world_size()
        ):
            os.kill(os.getpid(), signal.SIGSTOP)
        return super().__getitem__(index)


def flat_state(module: nn.Module) -> torch.Tensor:
    """Parameters and float buffers as one vector (what must agree across ranks)."""
    tensors = [p.detach().reshape(-1) for p in module.parameters()]
    tensors += [b.detach().reshape(-1).float() for b in module.buffers() if b.is_floating_point()]
    return torch.cat(tensors)


def full_data_loss(model: Regressor, data: TensorDataset) -> float:
    x, y = data.tensors
    model.eval()
    with torch.no_grad():
        loss = float(nn.functional.mse_loss(model.net(x).squeeze(-1), y))
    model.train()
    return loss


class CrossRankRecorder(pl.Callback):
    """After every step: max |rank_i - rank_0| over parameters and float buffers, and the sync count."""

    def __init__(self) -> None:
        self.records: list[tuple[int, int, float]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        gathered = trainer.strategy.all_gather(flat_state(pl_module))
        if gathered.dim() == 1:
            gathered = gathered.unsqueeze(0)
        diff = float((gathered - gathered[0]).abs().max())
        stats = getattr(trainer.strategy, "comm_stats", None)
        syncs = 0 if stats is None else stats.syncs
        self.records.append((trainer.global_step, syncs, diff))


def flat_buffers(module: nn.Module) -> torch.Tensor:
    return torch.cat([b.detach().reshape(-1).float() for b in module.buffers()])


def cross_rank_diff(trainer, tensor: torch.Tensor) -> float:
    gathered = trainer.strategy.all_gather(tensor)
    return float((gathered - gathered[0]).abs().max()) if gathered.dim() > 1 else 0.0


class ContractRecorder(pl.Callback):
    """What Lightning's DDP contracts look at: the wrapper, no_sync, a user comm hook, the synced metric,
    and the buffers' cross-rank difference wherever evaluation runs."""

    def __init__(self) -> None:
        self.record: dict = {"eval_buffer_diffs": [], "val_loss": [], "hook_calls": 0}

    def on_train_start(self, trainer, pl_module):
        model = trainer.model
        self.record["wrapper"] = type(model).__name__
        self.record["module_is_lightning_module"] = getattr(model, "module", None) is pl_module
        with trainer.strategy.block_backward_sync():
            self.record["grad_sync_inside_block"] = getattr(model, "require_backward_grad_sync", None)
        self.record["grad_sync_outside_block"] = getattr(model, "require_backward_grad_sync", None)
        if isinstance(model, torch.nn.parallel.DistributedDataParallel) and not getattr(
            trainer.strategy, "comm_hook", None
        ):
            record = self.record

            def counting_allreduce(state, bucket):  # DDP's default all-reduce, counted
                record["hook_calls"] += 1
                buffer = bucket.buffer().div_(torch.distributed.get_world_size())
                work = torch.distributed.all_reduce(buffer, async_op=True)
                return work.get_future().then(lambda fut: fut.value()[0])

            model.register_comm_hook(None, counting_allreduce)

    def _eval_batch(self, trainer, pl_module, batch_idx):
        # after the forward: DDP broadcasts rank 0's buffers inside its first forward after training
        if batch_idx == 0:
            diff = cross_rank_diff(trainer, flat_buffers(pl_module))
            self.record["eval_buffer_diffs"].append((trainer.state.fn.value, diff))

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self._eval_batch(trainer, pl_module, batch_idx)

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self._eval_batch(trainer, pl_module, batch_idx)

    def on_predict_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self._eval_batch(trainer, pl_module, batch_idx)

    def on_validation_epoch_end(self, trainer, pl_module):
        if "val_loss" in trainer.callback_metrics:
            self.record["val_loss"].append(float(trainer.callback_metrics["val_loss"]))


SCENARIOS = {
    # name: (strategy spec, fit options)
    "ddp_sgd": ("ddp", dict(optimizer="sgd", epochs=4)),
    "s0_sgd": (dict(staleness=0), dict(optimizer="sgd", epochs=4)),
    "ddp_bn": ("ddp", dict(optimizer="sgd", epochs=2, batch_norm=True)),
    "s0_bn": (dict(staleness=0), dict(optimizer="sgd", epochs=2, batch_norm=True)),
    "s1_string": ("mqgnn", dict(optimizer="adam", epochs=10)),
    "sync_bn": (dict(staleness=1, sync_period=3), dict(optimizer="adam", epochs=3, batch_norm=True)),
    "accumulate": (dict(staleness=1, sync_period=4), dict(optimizer="adam", epochs=3, accumulate=2)),
    "resume_full": (dict(staleness=1, sync_period=3), dict(optimizer="adam", epochs=4, checkpoint=True)),
    "resume_half": (dict(staleness=1, sync_period=3), dict(optimizer="adam", epochs=4, resume="epoch=1")),
    # a Lightning user's module: batch norm, validation + ModelCheckpoint(monitor), accumulation, clipping
    "client_ddp": ("ddp", dict(client=True, epochs=3, accumulate=2)),
    "client_s0": (dict(staleness=0), dict(client=True, epochs=3, accumulate=2)),
    "client_s1": (dict(staleness=1, sync_period=3), dict(client=True, epochs=3, accumulate=2)),
    "client_s1_local": (
        dict(staleness=1, sync_period=3, broadcast_buffers=False),
        dict(client=True, epochs=3, accumulate=2),
    ),
    # manual optimisation (two optimisers); the single-optimiser automatic run it must equal at staleness 1
    "manual_ddp": ("ddp", dict(manual=True, epochs=2)),
    "manual_s0": (dict(staleness=0), dict(manual=True, epochs=2)),
    "manual_ddp_static": ({"ddp": dict(static_graph=True)}, dict(manual=True, epochs=2)),
    "manual_s0_static": (dict(staleness=0, static_graph=True), dict(manual=True, epochs=2)),
    "manual_s1": (dict(staleness=1, sync_period=1000), dict(manual=True, epochs=2)),
    "auto_sgd_s1": (dict(staleness=1, sync_period=1000), dict(optimizer="sgd", lr=0.05, epochs=2)),
    # a parameter no rank uses: accepted with find_unused_parameters=True, an error without
    "unused_ok_s0": (dict(staleness=0, find_unused_parameters=True), dict(unused=True, epochs=1)),
    "unused_ok_s1": (dict(staleness=1, find_unused_parameters=True), dict(unused=True, epochs=1)),
    "unused_err_s0": (dict(staleness=0), dict(unused=True, epochs=1, expect_error=True)),
    "unused_err_s1": (dict(staleness=1), dict(unused=True, epochs=1, expect_error=True)),
}


class _Counting:
    """A hook state that counts the hook's calls; its collectives go to ``process_group``."""

    def __init__(self) -> None:
        self.process_group = None
        self.calls = 0


def _counting_hook(state, bucket):  # DDP's default all-reduce, counted
    state.calls += 1
    return default_hooks.allreduce_hook(state.process_group, bucket)


# DDP communication hooks: the gradient queue's buckets at staleness 1 (tiny buckets: several a step)
# and DDP's own at staleness 0 on the CPU; each fit against auto_sgd_s1 (or s0_sgd)
def _hooked(staleness: int, hook, state=None, **kwargs) -> dict:
    period = {"sync_period": 1000} if staleness else {}
    return dict(
        staleness=staleness,
        ddp_comm_hook=hook,
        ddp_comm_state=state,
        bucket_cap_mb=0.0005,
        **period,
        **kwargs,
    )


def _power_sgd(rank: int) -> powerSGD_hook.PowerSGDState:
    return powerSGD_hook.PowerSGDState(
        process_group=None, matrix_approximation_rank=rank, start_powerSGD_iter=2
    )


class _Late:
    """A launched all-reduce that completes ``delay_s`` after it was launched (a slow link)."""

    def __init__(self, pending, delay_s: float) -> None:
        self.pending, self.due = pending, time.perf_counter() + delay_s

    def is_completed(self) -> bool:
        return time.perf_counter() >= self.due and self.pending.is_completed()

    def wait(self) -> None:
        self.pending.wait()
        time.sleep(max(0.0, self.due - time.perf_counter()))


class SlowLinkStrategy(MQGNNStrategy):
    """The gradient queue's all-reduces complete ``delay_s`` late."""

    def __init__(self, delay_s: float, **kwargs) -> None:
        super().__init__(**kwargs)
        self.delay_s = delay_s

    def make_reducer(self):
        reducer, delay_s = super().make_reducer(), self.delay_s

        class Late:
            world_size = reducer.world_size

            def launch(self, tensors):
                return _Late(reducer.launch(tensors), delay_s)

        return Late()


HOOK_FIT = dict(optimizer="sgd", lr=0.05, epochs=2)
SCENARIOS.update(
    {
        "hook_allreduce_s1": (_hooked(1, default_hooks.allreduce_hook), HOOK_FIT),
        "hook_fp16_s1": (_hooked(1, default_hooks.fp16_compress_hook), HOOK_FIT),
        "hook_powersgd_s1": (_hooked(1, powerSGD_hook.powerSGD_hook, _power_sgd(1)), HOOK_FIT),
        "hook_fp16_powersgd_s1": (
            _hooked(
                1,
                powerSGD_hook.powerSGD_hook,
                _power_sgd(1),
                ddp_comm_wrapper=default_hooks.fp16_compress_wrapper,
            ),
            HOOK_FIT,
        ),
        "hook_quant4_s1": (_hooked(1, quantize_hook, QuantizeState(bits=4)), HOOK_FIT),
        "hook_quant4_ef_s1": (
            _hooked(1, quantize_hook, QuantizeState(bits=4, error_feedback=True)),
            HOOK_FIT,
        ),
        "hook_quant4_s0": (_hooked(0, quantize_hook, QuantizeState(bits=4)), HOOK_FIT),
        "hook_count_s0": (_hooked(0, _counting_hook, _Counting()), HOOK_FIT),
        "hook_count_s1": (_hooked(1, _counting_hook, _Counting()), HOOK_FIT),
        # staleness="auto" behind a link 400 ms slow (steps of a few to some tens of ms) and a fast one
        "auto_slow": (
            dict(staleness="auto", max_staleness=3, sync_period=6, delay_s=0.4),
            dict(HOOK_FIT, epochs=6),
        ),
        "auto_fast": (dict(staleness="auto", max_staleness=3, sync_period=6), dict(HOOK_FIT, epochs=6)),
        # each epoch's first batch 3 s late on rank 1, under a 1.5 s step timeout
        "late_epoch_start_s1": (dict(staleness=1, step_timeout=1.5), dict(HOOK_FIT, late_start_s=3.0)),
        # run on its own (the stopped rank never ends): see test_rank_failure_distributed.py
        "stopped_epoch_start_s1": (
            dict(staleness=1, step_timeout=2.0),
            dict(HOOK_FIT, stop_at_epoch_start=True, expect_error=True),
        ),
    }
)

# Resume from a mid-run checkpoint: (staleness, sync_period, accumulate_grad_batches, per-step LR schedule).
RESUME_COMBOS = [
    (s, p, a, lr) for s in (0, 1, 2) for p in (1, 3) for a in (1, 2) for lr in (False, True) if s or p == 1
]
RESUME_EPOCHS = 4  # a checkpoint after every epoch; resuming from epoch e continues to the end


def resume_name(combo: tuple, start: int | None) -> str:
    s, p, a, lr = combo
    return f"resume_s{s}_p{p}_a{a}_{'lr' if lr else 'const'}_" + ("full" if start is None else f"from{start}")


for _combo in RESUME_COMBOS:
    _spec = dict(staleness=_combo[0], sync_period=_combo[1])
    _opts = dict(client=True, schedule=_combo[3], accumulate=_combo[2], epochs=RESUME_EPOCHS, validate=False)
    SCENARIOS[resume_name(_combo, None)] = (_spec, dict(_opts, checkpoint=resume_name(_combo, None)))
    for _start in range(RESUME_EPOCHS - 1):
        SCENARIOS[resume_name(_combo, _start)] = (
            _spec,
            dict(_opts, resume=(resume_name(_combo, None), f"epoch={_start}")),
        )

# resume_s1_p3_a1_lr's run with each gradient computed at the predicted weights, whole and from epoch 1
_opts = dict(client=True, schedule=True, accumulate=1, epochs=RESUME_EPOCHS, validate=False)
_spec = dict(staleness=1, sync_period=3, predict_weights=True)
SCENARIOS["predicted_s1_full"] = (_spec, dict(_opts, checkpoint="predicted_s1_full"))
SCENARIOS["predicted_s1_from1"] = (_spec, dict(_opts, resume=("predicted_s1_full", "epoch=1")))


def _model(opts: dict) -> pl.LightningModule:
    if opts.get("client") or opts.get("unused"):
        return Client(schedule=opts.get("schedule", True), unused=opts.get("unused", False))
    if opts.get("manual"):
        return ManualRegressor(two_optimizers=True)
    return Regressor(
        opts.get("batch_norm", False), opts["optimizer"], opts.get("lr", 0.01), opts.get("manual", False)
    )


def run_scenario(name: str, strategy_spec, opts: dict, out_root: Path, devices: int, num_nodes: int) -> None:
    """One ``Trainer.fit`` in the already-running processes; writes ``out_root/name/rank<r>.pt``."""
    pl.seed_everything(0, workers=True)
    model = _model(opts)
    if isinstance(strategy_spec, dict) and "ddp" in strategy_spec:
        strategy = DDPStrategy(**strategy_spec["ddp"])
    elif isinstance(strategy_spec, dict) and "delay_s" in strategy_spec:
        spec = dict(strategy_spec)
        strategy = SlowLinkStrategy(spec.pop("delay_s"), **spec)
    elif isinstance(strategy_spec, dict):
        strategy = MQGNNStrategy(**strategy_spec)
    else:
        strategy = strategy_spec
    recorder = CrossRankRecorder()
    contracts = ContractRecorder()
    callbacks: list[pl.Callback] = [recorder, CommStatsMonitor(), contracts]
    validate = opts.get("client", False) and opts.get("validate", True)
    checkpoint = opts.get("checkpoint")
    if checkpoint is True:
        callbacks.append(ModelCheckpoint(dirpath=out_root / "checkpoints", every_n_epochs=1, save_top_k=-1))
    elif isinstance(checkpoint, str):
        callbacks.append(
            ModelCheckpoint(dirpath=out_root / f"ckpt_{checkpoint}", every_n_epochs=1, save_top_k=-1)
        )
    elif validate:
        callbacks.append(ModelCheckpoint(dirpath=out_root / f"ckpt_{name}", monitor="val_loss", save_top_k=1))
    resume = opts.get("resume")
    if isinstance(resume, tuple):
        resume = str(next((out_root / f"ckpt_{resume[0]}").glob(f"{resume[1]}-step=*.ckpt")))
    elif resume:
        resume = str(next((out_root / "checkpoints").glob(f"{resume}-step=*.ckpt")))
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=devices,
        num_nodes=num_nodes,
        strategy=strategy,
        max_epochs=opts["epochs"],
        accumulate_grad_batches=opts.get("accumulate", 1),
        gradient_clip_val=1.0 if opts.get("client") else None,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=any(isinstance(c, ModelCheckpoint) for c in callbacks),
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    data = synthetic_data()
    late = opts.get("late_start_s")
    if opts.get("stop_at_epoch_start"):
        data = StopsAtEpochStart(data)
    elif late is not None:
        data = LateEpochStart(data, late)
    loader = DataLoader(data, batch_size=16, shuffle=False)
    val_loader = DataLoader(synthetic_data(64, seed=1), batch_size=16) if validate else None
    init_loss = full_data_loss(model, data)
    error = None
    try:
        trainer.fit(model, train_dataloaders=loader, val_dataloaders=val_loader, ckpt_path=resume)
    except Exception as exc:  # noqa: BLE001  (scenarios that must fail record the message)
        if not opts.get("expect_error"):
            raise
        error = str(exc)
    after_fit = {}
    if error is None:
        after_fit["buffer_diff"] = (
            cross_rank_diff(trainer, flat_buffers(model)) if list(model.buffers()) else 0.0
        )
        after_fit["unused_grad_is_none"] = getattr(model, "unused", None) is not None and all(
            p.grad is None for p in model.unused.parameters()
        )
    if validate:
        checkpoint_cb = next(c for c in callbacks if isinstance(c, ModelCheckpoint))
        after_fit["best_score"] = float(checkpoint_cb.best_model_score)
        after_fit["best_path"] = Path(checkpoint_cb.best_model_path).name
        after_fit["validate"] = trainer.validate(model, val_loader, verbose=False)
        after_fit["test"] = trainer.test(model, val_loader, verbose=False)
        after_fit["predict"] = torch.cat(trainer.predict(model, val_loader))
    stats = getattr(trainer.strategy, "comm_stats", None)
    out = out_root / name
    out.mkdir(parents=True, exist_ok=True)
    torch.save(
        {
            "params": flat_state(model),
            "buffers": flat_buffers(model) if list(model.buffers()) else None,
            "losses": model.losses,
            "init_loss": init_loss,
            "final_loss": full_data_loss(model, data),
            "records": recorder.records,
            "contract": contracts.record,
            "after_fit": after_fit,
            "error": error,
            "stats": None if stats is None else stats.as_dict(),
            "hook_calls": getattr(getattr(trainer.strategy, "comm_hook_state", None), "calls", None),
            "logged": {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("comm/")},
            "sync_period": getattr(trainer.strategy, "sync_period", None),
            "strategy": type(trainer.strategy).__name__,
            "world_size": trainer.world_size,
            "global_step": trainer.global_step,
        },
        out / f"rank{trainer.global_rank}.pt",
    )
    if trainer.world_size > 1 and error is None:
        trainer.strategy.barrier()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--scenarios", default=",".join(SCENARIOS), help="comma-separated names, run in order"
    )
    parser.add_argument(
        "--strategy", default=None, help="override the strategy of every scenario (e.g. mqgnn_spawn)"
    )
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--num-nodes", type=int, default=1)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    for name in args.scenarios.split(","):
        spec, opts = SCENARIOS[name]
        run_scenario(name, args.strategy or spec, opts, Path(args.out), args.devices, args.num_nodes)
        if os.environ.get("MQGNN_SCRIPT_VERBOSE"):
            print(f"scenario {name} done")


if __name__ == "__main__":
    main()
