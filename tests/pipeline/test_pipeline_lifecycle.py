"""Pipeline lifecycle under the Lightning Trainer: workers start with fit and stop at its end, on
early stopping, on exceptions and KeyboardInterrupt; worker failures surface in the training
process with the worker's traceback; no orphan processes remain."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import lightning.pytorch as pl
import pytest
import torch
from helpers.paths import HELPERS
from helpers.pipeline import (
    FailInWorkerSampler,
    SlowSampler,
    ThreadsAtValidation,
    assert_gone,
    cores_and_threads,
    live_children,
    make_trainer,
    seeded_module,
    small_dataset,
    worker_pipeline,
)

from lightning_mqgnn.data import LoaderSettings, MQGNNDataModule
from lightning_mqgnn.pipeline.workers import WorkerError
from lightning_mqgnn.sampling.neighbor import NeighborSampler


@pytest.fixture(scope="module")
def ds():
    return small_dataset()


def pipeline_dm(ds, sampler=None, **kw):
    """Two workers make every epoch (their lifecycle is what is tested)."""
    return worker_pipeline(ds, sampler, batch_size=64, num_workers=2, **kw)


class Recorder(pl.Callback):
    """Records the batch indices per epoch and the worker pids seen while training; optionally
    acts on a given batch."""

    def __init__(self, act_at: int = -1, action=None):
        self.indices: dict[int, list[int]] = {}
        self.producers: dict[int, set[str]] = {}
        self.head_starts: set[int] = set()  # epochs that opened on a head start
        self.pids: set[int] = set()
        self.act_at = act_at
        self.action = action
        self.acted_at: float | None = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.indices.setdefault(trainer.current_epoch, []).append(batch.meta["index"])
        self.producers.setdefault(trainer.current_epoch, set()).add(batch.meta["producer"])
        if batch.meta.get("head_start"):
            self.head_starts.add(trainer.current_epoch)
        self.pids.update(trainer.datamodule.pipeline_loader.worker_pids())
        if batch_idx == self.act_at and self.action is not None and self.acted_at is None:
            self.acted_at = time.monotonic()
            self.action(trainer, self)


def test_limit_train_batches_and_epoch_boundaries(ds):
    before = live_children()
    rec = Recorder()
    trainer = make_trainer([rec], max_epochs=3, limit_train_batches=3)
    trainer.fit(seeded_module(ds), pipeline_dm(ds))
    assert rec.indices == {0: [0, 1, 2], 1: [0, 1, 2], 2: [0, 1, 2]}
    assert len(rec.pids) == 2  # persistent workers: the same two processes serve every epoch
    assert trainer.datamodule.pipeline_loader.worker_pids() == []
    assert_gone(sorted(rec.pids))
    assert live_children() - before == set()


def test_early_stopping_stops_workers(ds):
    def stop(trainer, rec):
        trainer.should_stop = True

    rec = Recorder(act_at=2, action=stop)
    make_trainer([rec], max_epochs=5).fit(seeded_module(ds), pipeline_dm(ds))
    assert list(rec.indices) == [0] and rec.indices[0] == [0, 1, 2]
    assert_gone(sorted(rec.pids))


def test_exception_in_training_stops_workers(ds):
    def boom(trainer, rec):
        raise ArithmeticError("training step failed")

    rec = Recorder(act_at=2, action=boom)
    with pytest.raises(ArithmeticError, match="training step failed"):
        make_trainer([rec]).fit(seeded_module(ds), pipeline_dm(ds))
    assert rec.pids and len(rec.pids) == 2
    assert_gone(sorted(rec.pids))


def test_keyboard_interrupt_stops_workers(ds):
    def interrupt(trainer, rec):
        raise KeyboardInterrupt

    rec = Recorder(act_at=1, action=interrupt)
    handler = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(SystemExit):  # Lightning's graceful shutdown ends with sys.exit(1)
            make_trainer([rec]).fit(seeded_module(ds), pipeline_dm(ds))
    finally:
        signal.signal(signal.SIGINT, handler)
    assert_gone(sorted(rec.pids))


def test_worker_exception_surfaces_with_its_traceback(ds):
    before = live_children()
    dm = pipeline_dm(ds, sampler=FailInWorkerSampler(ds.graph, [5, 5], fail_on=3))
    t0 = time.monotonic()
    with pytest.raises(WorkerError) as info:
        make_trainer().fit(seeded_module(ds), dm)
    assert time.monotonic() - t0 < 60
    msg = str(info.value)
    assert "sampler worker" in msg and "Traceback" in msg
    assert "injected sampler failure on call 3" in msg and "helpers/pipeline.py" in msg
    assert_gone(sorted(live_children() - before))
    assert live_children() - before == set()


def test_worker_killed_mid_epoch_surfaces_within_seconds(ds):
    before = live_children()

    def kill_worker(trainer, rec):
        os.kill(trainer.datamodule.pipeline_loader.worker_pids()[0], signal.SIGKILL)

    rec = Recorder(act_at=2, action=kill_worker)
    with pytest.raises(WorkerError, match="SIGKILL") as info:
        make_trainer([rec]).fit(seeded_module(ds), pipeline_dm(ds, cpu_queue_size=2, queue_size=1))
    assert time.monotonic() - rec.acted_at < 5.0
    assert "sampler worker 0" in str(info.value)
    assert_gone(sorted(rec.pids))
    assert live_children() - before == set()


@pytest.mark.parametrize("start_method", ["fork", "forkserver"])
def test_workers_exit_when_the_training_process_is_killed(tmp_path, start_method):
    # forkserver workers are the server's children, not the trainer's: they notice its death
    # through the server, which exits with the trainer
    script = tmp_path / "victim.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import os, signal, sys
            sys.path.insert(0, {str(HELPERS.parent)!r})
            from helpers.pipeline import small_dataset
            from lightning_mqgnn.pipeline.workers import SamplerWorkerPool
            from lightning_mqgnn.sampling.neighbor import NeighborSampler
            ds = small_dataset(300)
            pool = SamplerWorkerPool(
                NeighborSampler(ds.graph, [5]), ds.features, ds.labels, 2, start_method={start_method!r}
            )
            pool.start()
            print(" ".join(map(str, pool.pids())), flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
            """
        )
    )
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == -signal.SIGKILL
    pids = [int(p) for p in out.stdout.split()]
    assert len(pids) == 2
    assert_gone(pids, within_s=5.0)


def train_both_modes(
    ds,
    epochs: int,
    num_workers: int,
    seed: int,
    model_seed: int,
    callbacks=(),
    producer: str = "workers",
    make_sampler=lambda graph: NeighborSampler(graph, [5, 5]),
):
    """Parameters after training in each mode, and the pipelined DataModule."""
    params = {}
    for mode in ("sequential", "pipeline"):
        dm = MQGNNDataModule(
            ds,
            make_sampler(ds.graph),
            LoaderSettings(batch_size=128, mode=mode, num_workers=num_workers, seed=seed, producer=producer),
        )
        model = seeded_module(ds, seed=model_seed)
        trainer = make_trainer(
            list(callbacks) if mode == "pipeline" else [], max_epochs=epochs, limit_val_batches=1.0
        )
        trainer.fit(model, dm)
        params[mode] = (trainer, torch.cat([p.detach().flatten() for p in model.parameters()]))
    return params, dm


def test_pipeline_trains_exactly_like_the_sequential_loop(ds):
    params, _ = train_both_modes(ds, epochs=2, num_workers=2, seed=1, model_seed=7)
    (ta, pa), (tb, pb) = params["sequential"], params["pipeline"]
    for key in ("train/loss", "val/metric"):
        assert float(ta.callback_metrics[key]) == float(tb.callback_metrics[key])
    assert torch.equal(pa, pb)


def test_auto_producer_tries_the_workers_when_narrow_steps_leave_them_room(ds):
    # 7 batches an epoch, the first 2 untimed: epoch 0 and the first timed batch of epoch 1 give
    # the training thread's 6 timings, the next 2 steps of epoch 1 run on the thread the worker
    # leaves; sampling sleeps 20 ms, far above such a step, so epochs 2 and 3
    # run on the worker, then the faster is kept for good; batches stay the sequential ones
    rec = Recorder()
    params, dm = train_both_modes(
        ds,
        epochs=6,
        num_workers=1,
        seed=3,
        model_seed=4,
        callbacks=[rec],
        producer="auto",
        make_sampler=lambda graph: SlowSampler(graph, [5, 5], delay_s=0.02),
    )
    assert dm.num_train_batches() == 7
    choice = dm.pipeline_loader.producer_choice
    assert len(choice.narrow_steps) == choice.probes == 2
    # the training thread's: epoch 0's batches 2-6, epoch 1's 2, 5 and 6 (3 and 4 follow narrow
    # steps); the workers': the choice is made once 6 are in, when epoch 3's tasks are all out
    assert len(choice.times["trainer"]) == 8 and 6 <= len(choice.times["workers"]) <= 10
    assert choice.chosen in ("workers", "trainer")
    assert [rec.producers[e] for e in range(6)] == [{"trainer"}] * 2 + [{"workers"}] * 2 + [
        {choice.chosen}
    ] * 2
    assert torch.equal(params["sequential"][1], params["pipeline"][1])


class SlowOnFewThreads(ThreadsAtValidation):
    """A step that takes 50 ms more whenever the loader has narrowed the training threads (a
    compute-bound step on a machine with few cores), and the thread count of every step."""

    def __init__(self, full: int):
        super().__init__()
        self.full = full
        self.threads: dict[int, list[int]] = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        threads = torch.get_num_threads()
        self.threads.setdefault(trainer.current_epoch, []).append(threads)
        if threads < self.full:
            time.sleep(0.05)


def test_auto_producer_never_starts_workers_whose_leftover_threads_step_too_slowly(ds, monkeypatch):
    # sampling sleeps 10 ms, a major share of a batch, so the choice probes
    slow, rec = SlowOnFewThreads(full=4), Recorder()
    with cores_and_threads(monkeypatch, cores=4, threads=4):
        params, dm = train_both_modes(
            ds,
            epochs=3,
            num_workers=2,
            seed=3,
            model_seed=4,
            callbacks=[slow, rec],
            producer="auto",
            make_sampler=lambda graph: SlowSampler(graph, [5, 5], delay_s=0.01),
        )
        threads_after = torch.get_num_threads()
    choice = dm.pipeline_loader.producer_choice
    assert choice.chosen == "trainer" and choice.times["workers"] == []
    assert rec.producers == {0: {"trainer"}, 1: {"trainer"}, 2: {"trainer"}} and rec.pids == set()
    # epoch 1 steps batches 2 and 3 on the 2 threads two workers would leave; the other steps and
    # every validation get all 4
    assert slow.threads == {0: [4] * 7, 1: [4, 4, 2, 2, 4, 4, 4], 2: [4] * 7}
    assert slow.at_validation == [4, 4, 4] and threads_after == 4
    assert torch.equal(params["sequential"][1], params["pipeline"][1])


class SlowStep(SlowOnFewThreads):
    """A step that takes 30 ms on any number of threads: sampling is a minor share of a batch."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        super().on_train_batch_start(trainer, pl_module, batch, batch_idx)
        time.sleep(0.03)


def test_auto_producer_keeps_the_training_thread_at_once_where_sampling_is_minor(ds, monkeypatch):
    # the workers could save at most the sampling and gathering, well under 20% of a 30 ms step:
    # no probe narrows the threads, no worker starts, training is the sequential loop's
    slow, rec = SlowStep(full=4), Recorder()
    with cores_and_threads(monkeypatch, cores=4, threads=4):
        params, dm = train_both_modes(
            ds, epochs=2, num_workers=2, seed=3, model_seed=4, callbacks=[slow, rec], producer="auto"
        )
    choice = dm.pipeline_loader.producer_choice
    assert choice.chosen == "trainer" and choice.narrow_steps == [] and choice.times["workers"] == []
    assert len(choice.times["trainer"]) == len(choice.produce_times) == choice.samples
    assert slow.threads == {0: [4] * 7, 1: [4] * 7}
    assert rec.producers == {0: {"trainer"}, 1: {"trainer"}} and rec.pids == set()
    assert torch.equal(params["sequential"][1], params["pipeline"][1])


def test_later_epochs_open_on_a_head_start_and_train_identically(ds):
    # epoch 0 opens on tasks submitted at setup("fit"), epochs 1 and 2 on tasks submitted while
    # the epoch before ended (none after the last); batches still come in index order and
    # training matches the sequential loop bit for bit
    rec = Recorder()
    params, dm = train_both_modes(ds, epochs=3, num_workers=1, seed=2, model_seed=5, callbacks=[rec])
    assert rec.head_starts == {0, 1, 2}
    n = dm.num_train_batches()
    assert rec.indices == {e: list(range(n)) for e in range(3)}
    assert torch.equal(params["sequential"][1], params["pipeline"][1])
