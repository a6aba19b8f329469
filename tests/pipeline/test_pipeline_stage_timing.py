"""Stage times and queue depths reach Lightning's logger; the end-of-fit summary and the adaptive
queue-size decisions are recorded."""

import csv

from helpers.pipeline import make_trainer, seeded_module, small_dataset, worker_pipeline
from lightning.pytorch.loggers import CSVLogger

from lightning_mqgnn.callbacks import StageTimingCallback
from lightning_mqgnn.data import LoaderSettings, MQGNNDataModule
from lightning_mqgnn.sampling.neighbor import NeighborSampler


def test_stage_times_are_logged_and_summarised(tmp_path):
    ds = small_dataset(1500)
    dm = worker_pipeline(
        ds,
        batch_size=64,
        num_workers=1,
        queue_size="auto",
        warmup_batches=1,
        window_batches=3,
    )
    timing = StageTimingCallback(trim=2)
    trainer = make_trainer([timing], logger=CSVLogger(tmp_path, name="t"), log_every_n_steps=1)
    trainer.fit(seeded_module(ds), dm)
    n = dm.num_train_batches()
    s = timing.summary
    assert s["num_batches"] == n
    for stage in (
        "sample_s",
        "gather_s",
        "transfer_s",
        "wait_s",
        "forward_s",
        "backward_s",
        "optimizer_s",
        "batch_s",
    ):
        assert s[f"mean_{stage}"] >= 0 and s[f"total_{stage}"] > 0, stage
    assert s["total_epoch_s"] >= s["total_forward_s"] + s["total_backward_s"]
    history = dm.pipeline_loader.queue_size_history
    assert history and s["queue_size"] == history[-1].q >= 1
    assert history[0].t_compute_mean_s > 0 and history[0].batch_bytes > 0 and history[0].cap >= 1
    with open(trainer.logger.experiment.metrics_file_path) as f:
        rows = list(csv.DictReader(f))
    cols = set(rows[0])
    assert {"stage/forward_s", "stage/wait_s", "stage/device_queue_depth", "stage/queue_size"} <= cols
    assert "stage_summary/mean_batch_s" in cols
    assert sum(1 for r in rows if r.get("stage/forward_s")) == n


def test_stage_times_follow_the_trainers_logging_interval(tmp_path):
    # logging every step costs ~1 ms per key in the training thread: only every n-th step goes out,
    # while the summary still covers every batch; without a logger nothing is logged at all
    ds = small_dataset(1500)
    timing = StageTimingCallback(trim=0)

    def fit(logger):
        dm = MQGNNDataModule(
            ds, NeighborSampler(ds.graph, [5, 5]), LoaderSettings(batch_size=64, mode="sequential")
        )
        trainer = make_trainer([timing], logger=logger, log_every_n_steps=3)
        trainer.fit(seeded_module(ds), dm)
        assert timing.summary["num_batches"] == dm.num_train_batches() >= 6
        return trainer

    trainer = fit(CSVLogger(tmp_path, name="t"))
    with open(trainer.logger.experiment.metrics_file_path) as f:
        rows = list(csv.DictReader(f))
    steps = [int(r["step"]) for r in rows if r.get("stage/forward_s")]
    assert steps and all((s + 1) % 3 == 0 for s in steps)
    assert len(steps) == timing.summary["num_batches"] // 3
    # the model's loss is logged on exactly the steps the logger writes, never dropped
    assert [int(r["step"]) for r in rows if r.get("train/loss")] == steps
    trainer = fit(False)
    assert not any(k.startswith("stage/") for k in trainer.callback_metrics)
