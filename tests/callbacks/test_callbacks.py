"""The paper's batch-level early stopping, trimmed batch time, and the GPU busy monitor."""

from types import SimpleNamespace

import torch
from lightning.pytorch.loggers import Logger

from lightning_mqgnn.callbacks import BatchEarlyStopping, GPUBusyMonitor, trimmed_mean


def test_trimmed_mean_drops_first_and_last_twenty():
    values = [100.0] * 20 + [1.0] * 10 + [100.0] * 20
    assert trimmed_mean(values) == 1.0
    assert trimmed_mean([2.0, 4.0]) == 3.0  # too short to trim


def run_validations(callback, steps_and_values):
    trainer = SimpleNamespace(sanity_checking=False, callback_metrics={}, global_step=0, should_stop=False)
    for step, value in steps_and_values:
        trainer.global_step = step
        trainer.callback_metrics = {"val/metric": torch.tensor(value)}
        callback.on_validation_end(trainer, None)
        if trainer.should_stop:
            return step
    return None


def test_stops_after_patience_batches_without_a_full_point_of_gain():
    cb = BatchEarlyStopping(min_delta=0.01, patience_batches=200)
    # small gains (< 0.01) do not reset the counter: stop at step 250 (200 after step 50)
    history = [(50, 0.50), (100, 0.505), (150, 0.509), (200, 0.5095), (250, 0.5099), (300, 0.6)]
    assert run_validations(cb, history) == 250
    assert cb.best == 0.50 and cb.best_step == 50


def test_real_gains_reset_the_patience():
    cb = BatchEarlyStopping(min_delta=0.01, patience_batches=200)
    history = [(s, 0.1 + 0.02 * i) for i, s in enumerate(range(50, 1000, 50))]
    assert run_validations(cb, history) is None


def test_gpu_busy_monitor_reports_nothing_for_a_cpu_run():
    """On CPU there is no GPU to measure: no thread, no samples, None rather than a made-up 0."""
    monitor = GPUBusyMonitor()
    module = SimpleNamespace(device=torch.device("cpu"))
    monitor.on_fit_start(None, module)
    monitor.on_train_epoch_start(None, module)
    monitor.on_fit_end(None, module)
    assert monitor._thread is None and monitor.busy_fraction is None


def test_one_clock_takes_validation_out_of_batch_and_epoch_times(monkeypatch):
    from lightning_mqgnn.callbacks import clock as clock_module
    from lightning_mqgnn.callbacks.clock import TrainingClock

    now = [0.0]
    monkeypatch.setattr(clock_module.time, "perf_counter", lambda: now[0])
    clock = TrainingClock()
    clock.fit_start(torch.device("cpu"))
    now[0] = 1.0
    clock.train_epoch_start()
    now[0] = 2.0
    assert clock.train_batch_end() == (2.0, 1.0)
    clock.validation_start()  # between batches (val_check_interval)
    now[0] = 12.0
    clock.validation_end()
    now[0] = 13.5
    assert clock.train_batch_end() == (13.5, 1.5)  # not 11.5: validation is not the batch's
    clock.validation_start()  # at the epoch's end
    now[0] = 20.0
    clock.validation_end()
    assert clock.train_epoch_end() == 2.5 and clock.validation_s == 16.5


def test_batch_timer_and_stage_timing_agree_and_exclude_validation():
    import time

    from helpers.pipeline import make_trainer, seeded_module, small_dataset

    from lightning_mqgnn.callbacks import BatchTimer, StageTimingCallback
    from lightning_mqgnn.data import LoaderSettings, MQGNNDataModule
    from lightning_mqgnn.sampling.neighbor import NeighborSampler

    pause = 0.5

    ds = small_dataset(800)
    model = seeded_module(ds)
    validation_step = model.validation_step

    def slow_validation(*args, **kwargs):
        time.sleep(pause)
        return validation_step(*args, **kwargs)

    model.validation_step = slow_validation
    timer, stages = BatchTimer(trim=0), StageTimingCallback(trim=0)
    dm = MQGNNDataModule(ds, NeighborSampler(ds.graph, [3, 3]), LoaderSettings(batch_size=100))
    logger = RecordingLogger()
    trainer = make_trainer(
        [timer, stages],
        max_epochs=2,
        limit_val_batches=1,
        val_check_interval=2,
        num_sanity_val_steps=0,
        logger=logger,
        log_every_n_steps=1000,
    )
    trainer.fit(model, dm)
    batches = stages.records["batch_s"]
    assert len(timer.batch_times) == len(batches) == 2 * dm.num_train_batches() >= 8
    assert max(timer.batch_times) < pause and max(batches) < pause
    assert max(stages.epoch_times) < 2 * pause  # each epoch validated at least twice
    assert timer.train_time < sum(timer.batch_times) + pause
    # at every validation, logged at its metric's step: training time so far (validation out) and
    # wall time (validation in: at least the pauses of the validations so far)
    clocks = [(step, m) for step, m in logger.rows if "time/train_s" in m]
    validations = [step for step, m in logger.rows if "val/metric" in m]
    assert [step for step, _ in clocks] == validations and len(clocks) >= 4
    for n, (_, m) in enumerate(clocks, start=1):
        assert m["time/wall_s"] - m["time/train_s"] >= n * pause
    train_s = [m["time/train_s"] for _, m in clocks]
    assert all(a < b for a, b in zip(train_s, train_s[1:])) and train_s[-1] <= timer.train_time + 0.05


class RecordingLogger(Logger):
    """Keeps every ``log_metrics`` call as ``(step, metrics)``."""

    def __init__(self):
        super().__init__()
        self.rows = []

    @property
    def name(self):
        return "recording"

    @property
    def version(self):
        return 0

    def log_hyperparams(self, params, *args, **kwargs):
        pass

    def log_metrics(self, metrics, step=None):
        self.rows.append((step, dict(metrics)))


def test_trimming_nothing_keeps_every_value():
    from lightning_mqgnn.callbacks.clock import trimmed, trimmed_mean

    assert trimmed([1.0, 2.0, 3.0], 0) == [1.0, 2.0, 3.0]
    assert trimmed([1.0, 2.0, 3.0, 4.0, 5.0], 1) == [2.0, 3.0, 4.0]
    assert trimmed_mean([1.0, 3.0], 0) == 2.0
