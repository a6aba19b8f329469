"""The paper's batch-level early stopping, trimmed batch time, and the GPU busy monitor."""

from types import SimpleNamespace

import torch

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
