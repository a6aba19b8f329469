"""Per-batch stage times of the pipeline, logged through Lightning and summarised at the end.

Stages: sampling, gathering, transfer (from ``batch.meta``, measured where they ran), waiting
for data (training thread blocked in the loader), forward, backward, optimiser (callback hooks),
and the queue depths. Batch and epoch times come from ``TrainingClock``, as ``BatchTimer``'s do:
validation is excluded. The summary uses the paper's batch time: the first and last 20 batches
are dropped before averaging. It also counts each sampled batch's feature traffic
(``feature_traffic``), so the trade a feature cache makes is visible on every run
(``result_fields``), and logs the time at every validation (``time/train_s``, validation
excluded, and ``time/wall_s``) next to its metric, for time-to-accuracy curves.
"""

from __future__ import annotations

from collections import defaultdict

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override

from lightning_mqgnn.callbacks.clock import TrainingClock, trimmed_mean

META_STAGES = ("sample_s", "gather_s", "transfer_s", "wait_s")
META_GAUGES = ("device_queue_depth", "cpu_queue_depth", "queue_size")
TRAFFIC = ("feature_rows", "feature_bytes")  # per batch: input rows moved to the device, their bytes
HOOK_STAGES = ("forward_s", "backward_s", "optimizer_s", "batch_s")


def feature_traffic(batch: object) -> dict[str, float]:
    """The input rows a sampled batch moved to the device and their bytes: its gathered feature
    rows less those a feature cache served, or the rows of its first layer aggregated on the host
    (``aggregate_inputs``); nothing for other batches (full-graph ones)."""
    aggregated = getattr(batch, "aggregated", None)
    if aggregated is not None:
        return {"feature_rows": float(aggregated.shape[0]), "feature_bytes": float(aggregated.nbytes)}
    features, inputs = getattr(batch, "features", None), getattr(batch, "input_nodes", None)
    if features is None or inputs is None:
        return {}
    moved = inputs.numel() - int((getattr(batch, "meta", None) or {}).get("cache_hits", 0))
    return {
        "feature_rows": float(moved),
        "feature_bytes": float(moved * features.shape[1] * features.element_size()),
    }


class StageTimingCallback(pl.Callback):
    """Record and log every training batch's stage times; ``summary`` holds the end-of-fit digest.

    ``batch_s`` runs from the previous batch's end (so waiting for data counts) to this one's.
    Every batch is recorded; only every Trainer ``log_every_n_steps``-th goes to the loggers, and
    nothing without one, written to them directly: ``LightningModule.log`` has a cost per key in
    the training thread, which on a pipeline bound by compute is lost throughput.

    On CUDA every reading waits for the current stream (not the side stream) so forward/backward
    times are real, at the cost of a stall per reading; ``cuda_sync=False`` synchronises only at
    epoch and validation boundaries (the stage times are then host-side times).
    """

    def __init__(self, trim: int = 20, cuda_sync: bool = True):
        self.trim = trim
        self.clock = TrainingClock(sync_every_batch=cuda_sync)
        self.records: dict[str, list[float]] = defaultdict(list)
        self.epoch_times: list[float] = []
        self.cache_hit_rates: list[float] = []  # per epoch, when a feature cache (GNS) serves rows
        self._hits = self._rows = 0
        self._host_hits = self._host_reads = 0  # rows the host tier held, rows asked of it
        self.summary: dict[str, float] = {}
        self._marks: dict[str, float] = {}
        self._fit_start = 0.0

    @override
    def on_fit_start(self, trainer, pl_module) -> None:
        self._fit_start = self.clock.fit_start(pl_module.device)
        self.records.clear()
        self.epoch_times.clear()
        self.cache_hit_rates.clear()
        self._host_hits = self._host_reads = 0
        self.summary = {}

    @override
    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self.clock.train_epoch_start()

    @override
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._marks = {"start": self.clock.now()}

    @override
    def on_before_backward(self, trainer, pl_module, loss) -> None:
        self._marks["backward"] = self.clock.now()

    @override
    def on_after_backward(self, trainer, pl_module) -> None:
        self._marks["backward_end"] = self.clock.now()

    @override
    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self._marks["optimizer"] = self.clock.now()

    @override
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        end, batch_s = self.clock.train_batch_end()
        m = self._marks
        row: dict[str, float] = {}
        if "backward" in m:
            row["forward_s"] = m["backward"] - m["start"]
        if "backward_end" in m:
            row["backward_s"] = m["backward_end"] - m["backward"]
        if "optimizer" in m:
            row["optimizer_s"] = end - m["optimizer"]
        row["batch_s"] = batch_s
        meta = getattr(batch, "meta", {}) or {}
        if "cache_hits" in meta:
            self._hits += int(meta["cache_hits"])
            self._rows += int(batch.input_nodes.numel())
        if "host_reads" in meta:
            self._host_hits += int(meta["host_hits"])
            self._host_reads += int(meta["host_reads"])
        row.update(feature_traffic(batch))
        for key in META_STAGES + META_GAUGES:
            if key in meta:
                row[key] = float(meta[key])
        for key, value in row.items():
            self.records[key].append(value)
        if trainer.loggers and trainer.global_step % max(1, trainer.log_every_n_steps) == 0:
            # straight to the loggers, at the step the Trainer logs this batch's metrics at (the
            # optimiser has stepped): through ``LightningModule.log_dict`` each key cost a
            # millisecond of the training thread
            stage = {f"stage/{k}": v for k, v in row.items()}
            for logger in trainer.loggers:
                logger.log_metrics(stage, step=trainer.global_step - 1)

    @override
    def on_validation_start(self, trainer, pl_module) -> None:
        self.clock.validation_start()

    @override
    def on_validation_end(self, trainer, pl_module) -> None:
        self.clock.validation_end()
        if trainer.sanity_checking or not trainer.loggers:
            return
        # the clocks at every validation, logged at the step of its metric: a curve of the metric
        # against time to accuracy, with and without the time validation itself took
        wall = self.clock.now() - self._fit_start
        times = {"time/train_s": wall - self.clock.validation_s, "time/wall_s": wall}
        for logger in trainer.loggers:
            logger.log_metrics(times, step=trainer.global_step - 1)

    @override
    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.epoch_times.append(self.clock.train_epoch_end())
        if self._rows:
            rate = self._hits / self._rows
            self.cache_hit_rates.append(rate)
            pl_module.log("stage/cache_hit_rate", rate, on_epoch=True, batch_size=1)
            self._hits = self._rows = 0

    @override
    def on_fit_end(self, trainer, pl_module) -> None:
        self.summary = self.summarize()
        loader = getattr(trainer.datamodule, "pipeline_loader", None)
        history = loader.queue_size_history if loader is not None else []
        if history:
            last = history[-1]
            self.summary.update(queue_size=last.q, queue_size_estimates=len(history))
        if self.cache_hit_rates:
            self.summary["cache_hit_rate"] = self.cache_hit_rates[-1]
            rank_zero_info(
                "feature cache hit rate per epoch: " + ", ".join(f"{r:.3f}" for r in self.cache_hit_rates)
            )
        if self._host_reads:
            self.summary["host_cache_hit_rate"] = self._host_hits / self._host_reads
        if trainer.logger is not None:
            trainer.logger.log_metrics({f"stage_summary/{k}": v for k, v in self.summary.items()})
        rank_zero_info(
            "stage times (trimmed mean per batch): "
            + ", ".join(
                f"{k.removeprefix('mean_').removesuffix('_s')}_ms={1e3 * v:.2f}"
                for k, v in self.summary.items()
                if k.startswith("mean_") and k.endswith("_s")
            )
        )

    def result_fields(self) -> str:
        """`` feature_rows_per_batch=... feature_mb_per_batch=... cache_hit_rate=...
        host_cache_hit_rate=...``: what a batch moved to the device, the share of its input rows
        the device cache served, and of the rest the share the host tier held, for the recipe's
        RESULT line (empty without sampled batches)."""
        if "mean_feature_rows" not in self.summary:
            return ""
        fields = (
            f" feature_rows_per_batch={self.summary['mean_feature_rows']:.0f}"
            f" feature_mb_per_batch={self.summary['mean_feature_bytes'] / 2**20:.3f}"
        )
        for name in ("cache_hit_rate", "host_cache_hit_rate"):
            if name in self.summary:
                fields += f" {name}={self.summary[name]:.3f}"
        return fields

    def summarize(self) -> dict[str, float]:
        """Trimmed per-batch means (``mean_*``), totals (``total_*``) and epoch times."""
        out: dict[str, float] = {}
        for key, values in self.records.items():
            if key in META_GAUGES or key in TRAFFIC:
                out[f"mean_{key}"] = float(sum(values) / len(values))
                continue
            out[f"mean_{key}"] = trimmed_mean(values, self.trim)
            out[f"total_{key}"] = float(sum(values))
        if self.epoch_times:
            out["total_epoch_s"] = float(sum(self.epoch_times))
        out["num_batches"] = float(len(self.records.get("batch_s", [])))
        return out
