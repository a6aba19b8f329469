"""Preemption of one rank: a SIGTERM or SLURM's requeue signal stops a sampled fit at the end of
the step it arrived in, ``last.ckpt`` is written there, the fit exits with 128 + signal, and the
fit resumed from that checkpoint ends with parameters and buffers equal, bit for bit, to those of
a fit that was never stopped: for the sequential loader, the pipelined one (its workers, or the
producer choice) and the device-resident one (a thread or a sampler process)."""

from __future__ import annotations

import os
import signal
import stat

import lightning.pytorch as pl
import pytest
import torch
from helpers.pipeline import alive, make_trainer, seeded_module, small_dataset
from lightning.fabric.plugins.environments import SLURMEnvironment

from lightning_mqgnn.callbacks import LastCheckpoint, Preempted
from lightning_mqgnn.data import LoaderSettings, MQGNNDataModule
from lightning_mqgnn.pipeline.plan import EpochPlan, LoaderPosition
from lightning_mqgnn.pipeline.sequential import SequentialLoader
from lightning_mqgnn.sampling.neighbor import NeighborSampler

EPOCHS = 3
BATCH_SIZE = 64
SIGNAL_STEP = 12  # epoch 1, inside it


@pytest.fixture(scope="module")
def ds():
    return small_dataset(900)


LOADERS = {  # the DataModule's arguments of each loader variant
    "sequential": {"mode": "sequential"},
    "pipeline": {"mode": "pipeline", "num_workers": 1, "producer": "workers"},
    "pipeline-auto": {"mode": "pipeline", "num_workers": 1, "producer": "auto"},  # may make them itself
    "device": {"mode": "device"},
    "device-process": {"mode": "device", "device_sampler": "process", "sampler_processes": 1},
}


def datamodule(ds, loader: str) -> MQGNNDataModule:
    return MQGNNDataModule(
        ds, NeighborSampler(ds.graph, [4, 4]), LoaderSettings(batch_size=BATCH_SIZE, **LOADERS[loader])
    )


class SendSignal(pl.Callback):
    """Sends ``signum`` to this process when the step ``step`` starts (as a scheduler would)."""

    def __init__(self, step: int, signum: int):
        self.step, self.signum = step, signum
        self.worker_pids: list[int] = []
        self.sampler_pids: list[int] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step:
            dm = trainer.datamodule
            if dm.pipeline_loader is not None:
                self.worker_pids = dm.pipeline_loader.worker_pids()
            if dm.device_loader is not None and dm.device_loader.process is not None:
                self.sampler_pids = dm.device_loader.process.pids()
            os.kill(os.getpid(), self.signum)


def fit(ds, mode, root, callbacks=(), ckpt_path=None, **trainer_kw):
    module = seeded_module(ds)
    dm = datamodule(ds, mode)
    checkpoint = LastCheckpoint(root, every_s=0)
    trainer = make_trainer(
        [checkpoint, *callbacks], max_epochs=EPOCHS, enable_checkpointing=True, **trainer_kw
    )
    trainer.fit(module, datamodule=dm, ckpt_path=ckpt_path)
    return module, trainer


def state(module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def assert_equal_states(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    assert not differ, f"differ after resuming: {differ}"


@pytest.fixture(scope="module")
def through(ds, tmp_path_factory):
    """Each loader's fit that was never stopped."""
    runs = {}
    for mode in LOADERS:
        module, trainer = fit(ds, mode, tmp_path_factory.mktemp(f"through_{mode}"))
        runs[mode] = state(module)
    return runs


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1], ids=["SIGTERM", "SIGUSR1"])
@pytest.mark.parametrize("mode", list(LOADERS))
def test_a_signalled_fit_stops_at_the_step_and_resumes_exactly(ds, through, tmp_path, mode, signum):
    handler_before = signal.getsignal(signum)
    sender = SendSignal(SIGNAL_STEP, signum)
    with pytest.raises(Preempted) as stopped:
        fit(ds, mode, tmp_path, [sender])
    assert stopped.value.code == 128 + signum
    assert signal.getsignal(signum) == handler_before  # handed back
    batches = datamodule(ds, mode).num_train_batches()
    assert SIGNAL_STEP % batches  # inside an epoch
    assert stopped.value.epoch == SIGNAL_STEP // batches
    assert stopped.value.batches == SIGNAL_STEP % batches + 1
    assert str(stopped.value).startswith(f"stopped by {signal.Signals(signum).name} at epoch 1 after")
    checkpoint = torch.load(tmp_path / "last.ckpt", weights_only=True)
    assert checkpoint["global_step"] == SIGNAL_STEP + 1
    assert checkpoint["callbacks"]["LastCheckpoint"]["stopped_by"] == signum
    (loader_state,) = checkpoint["loops"]["fit_loop"]["state_dict"]["combined_loader"]
    position = LoaderPosition.from_state(loader_state)
    assert position.epoch == 1 and position.world_size == 1
    if mode == "pipeline":
        assert sender.worker_pids and not alive(sender.worker_pids)  # the workers were stopped
    if mode == "device-process":
        assert sender.sampler_pids and not alive(sender.sampler_pids)

    resumed, trainer = fit(ds, mode, tmp_path, ckpt_path=tmp_path / "last.ckpt")
    assert trainer.global_step == EPOCHS * batches
    assert_equal_states(through[mode], state(resumed))


def test_without_the_loader_position_the_resumed_fit_differs(ds, through, tmp_path):
    """The check above can fail: a loader that restarts the epoch trains on its first batches again."""
    with pytest.raises(Preempted):
        fit(ds, "sequential", tmp_path, [SendSignal(SIGNAL_STEP, signal.SIGTERM)])
    path = tmp_path / "last.ckpt"
    checkpoint = torch.load(path, weights_only=False)
    loop = checkpoint["loops"]["fit_loop"]["epoch_loop.batch_progress"]
    for tracker in ("total", "current"):  # Lightning's count of the epoch's trained batches
        loop[tracker]["completed"] = loop[tracker]["processed"] = loop[tracker]["ready"] = 0
        loop[tracker]["started"] = 0
    torch.save(checkpoint, path)
    resumed, _ = fit(ds, "sequential", tmp_path, ckpt_path=path)
    a, b = through["sequential"], state(resumed)
    assert any(not torch.equal(a[k], b[k]) for k in a)


def test_a_signal_in_an_epochs_last_step_stops_at_the_epochs_end(ds, through, tmp_path):
    batches = datamodule(ds, "sequential").num_train_batches()
    with pytest.raises(Preempted) as stopped:
        fit(ds, "sequential", tmp_path, [SendSignal(batches - 1, signal.SIGTERM)])
    assert stopped.value.batches is None and stopped.value.epoch == 0
    assert "at the end of epoch 0" in str(stopped.value)
    assert torch.load(tmp_path / "last.ckpt", weights_only=True)["global_step"] == batches
    resumed, _ = fit(ds, "sequential", tmp_path, ckpt_path=tmp_path / "last.ckpt")
    assert_equal_states(through["sequential"], state(resumed))


class SignalInSanityCheck(pl.Callback):
    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        if trainer.sanity_checking:
            os.kill(os.getpid(), signal.SIGTERM)


def test_a_signal_during_the_sanity_check_stops_after_the_first_step(ds, tmp_path):
    with pytest.raises(Preempted) as stopped:
        fit(ds, "sequential", tmp_path, [SignalInSanityCheck()], limit_val_batches=1, num_sanity_val_steps=1)
    assert stopped.value.code == 128 + signal.SIGTERM
    assert stopped.value.epoch == 0 and stopped.value.batches == 1


def test_signals_left_to_lightning(ds, tmp_path):
    """``signals=()``: Lightning's own SIGTERM handling, which ends the fit with status 0."""
    module = seeded_module(ds)
    trainer = make_trainer(
        [LastCheckpoint(tmp_path, every_s=0, signals=()), SendSignal(SIGNAL_STEP, signal.SIGTERM)],
        max_epochs=EPOCHS,
        enable_checkpointing=True,
    )
    with pytest.raises(SystemExit) as exited:
        trainer.fit(module, datamodule=datamodule(ds, "sequential"))
    assert not isinstance(exited.value, Preempted) and exited.value.code in (0, None)


def standalone_loader(ds) -> SequentialLoader:
    return SequentialLoader(datamodule(ds, "sequential").source, EpochPlan())


def test_a_loaded_position_resumes_a_standalone_loader(ds):
    loader = standalone_loader(ds)
    loader.set_epoch(1)
    epoch = list(loader)
    loader.set_epoch(0)
    first = iter(loader)
    next(first), next(first), next(first)
    assert loader.state_dict() == {"epoch": 0, "batches": 3, "world_size": 1}
    loader.set_epoch(1)
    next(iter(loader))
    state = loader.state_dict()
    resumed = standalone_loader(ds)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert [b.meta["index"] for b in rest] == list(range(1, len(epoch)))
    for a, b in zip(epoch[1:], rest):
        assert torch.equal(a.input_nodes, b.input_nodes)
    assert len(list(resumed)) == len(epoch)  # the epoch after a resumed one starts at its start


def test_a_position_of_another_world_size_is_refused(ds):
    loader = standalone_loader(ds)
    loader.load_state_dict({"epoch": 1, "batches": 3, "world_size": 2})
    with pytest.raises(ValueError, match="split over 2 ranks; this run has 1"):
        next(iter(loader))
    with pytest.raises(ValueError, match="lacks"):
        loader.load_state_dict({"epoch": 1})


def test_a_position_past_the_epoch_is_refused(ds):
    loader = standalone_loader(ds)
    loader.load_state_dict({"epoch": 0, "batches": 10_000, "world_size": 1})
    with pytest.raises(ValueError, match="at batch 10000, but the epoch has"):
        next(iter(loader))


def fake_scontrol(tmp_path, exit_status: int = 0):
    """An ``scontrol`` on PATH that writes its arguments to a file."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "scontrol"
    calls = tmp_path / "scontrol_calls"
    script.write_text(f'#!/bin/sh\necho "$@" >> {calls}\necho "no such job" >&2\nexit {exit_status}\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return bin_dir, calls


@pytest.fixture
def slurm_job(monkeypatch):
    for name, value in {
        "SLURM_NTASKS": "1",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "0",
        "SLURM_JOB_NAME": "train",
        "SLURM_JOB_ID": "4242",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("SLURM_ARRAY_JOB_ID", raising=False)


@pytest.mark.parametrize(
    "signum, requeued", [(signal.SIGUSR1, True), (signal.SIGTERM, False)], ids=["SIGUSR1", "SIGTERM"]
)
def test_slurm_requeue_signal_requeues_the_job(ds, tmp_path, monkeypatch, slurm_job, signum, requeued):
    bin_dir, calls = fake_scontrol(tmp_path)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(Preempted):
        fit(
            ds,
            "sequential",
            tmp_path,
            [SendSignal(SIGNAL_STEP, signum)],
            plugins=[SLURMEnvironment(auto_requeue=True)],
        )
    assert (tmp_path / "last.ckpt").is_file()
    if requeued:
        assert calls.read_text().split() == ["requeue", "4242"]
    else:
        assert not calls.exists()


def test_a_failing_requeue_warns_and_keeps_the_checkpoint(ds, tmp_path, monkeypatch, slurm_job):
    bin_dir, _ = fake_scontrol(tmp_path, exit_status=1)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    warned = pytest.warns(UserWarning, match="scontrol requeue 4242` failed \\(no such job\\)")
    with warned, pytest.raises(Preempted):
        fit(
            ds,
            "sequential",
            tmp_path,
            [SendSignal(SIGNAL_STEP, signal.SIGUSR1)],
            plugins=[SLURMEnvironment(auto_requeue=True)],
        )
    assert (tmp_path / "last.ckpt").is_file()
