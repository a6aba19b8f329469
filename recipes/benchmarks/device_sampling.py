"""Device-resident sampling against host sampling, in one run on one GPU.

``speed``: a generated products-like graph (``--scale 1.0``: all 2.45M nodes, 100 features) in
SALIENT's configuration (3-layer SAGE, fan-out 15,10,5 from the output layer, batch 1024, hidden
256) and the paper's (2-layer SAGE, fan-out 5,5; ``paper_gcn``: the same with GCN), each with
  sequential (CPU sampling in the training process) | pipeline (CPU sampler workers, the
  multi-queue pipeline) | device (DeviceResidentLoader: graph and features on the GPU, sampled
  by a thread of the training process) | device_process (the same, sampled by spawned processes
  taking the batches in turn; ``device_processN``: N of them, else the loader's default).
The CPU loaders train ``--batches`` batches an epoch, the device loader ``--device-batches`` (0:
the whole epoch). Reports the epoch time over those batches (mean over epochs 2..E, the first
beside it) and the whole epoch it implies, trimmed batch time, GPU busy fraction (NVML), peak
device memory, the device loader's sample and gather time per batch (with the host syncs listed
in ``pipeline/device_loader.py``) and its placement.

``accuracy``: test metric of device-resident vs sequential CPU sampling, same epochs, several
seeds, on amazon_photo (npz from the data directory; skipped when absent) and products_like.

``census``: host syncs per batch of device-resident sampling, by call site, for node-wise,
layer-wise and GNS samplers (``_sync_census``: syncing torch calls on any device, and on a GPU
the total CUDA's sync debug mode reports beside them), and each sampler's time per batch when it
runs alone, with no training thread beside it.

Markdown to stdout, JSON and markdown under ``--out`` (default ``$OUT`` when set).

    python recipes/bench.py device_sampling                 # the GPU run (about 6 minutes)
    python recipes/bench.py device_sampling --scale 0.42 --configs paper,paper_gcn --parts speed
    python recipes/bench.py device_sampling --smoke         # tiny, on the CPU when there is no GPU
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import lightning.pytorch as pl
import torch

from benchmarks._cuda_graphs import CUDA_GRAPHS_HELP, cuda_graph_modes
from benchmarks._report import attempt, exit_status, machine_header, write_report
from benchmarks._sync_census import count_syncs, cuda_sync_count
from lightning_mqgnn.callbacks import GPUBusyMonitor
from lightning_mqgnn.callbacks.batch_timer import BatchTimer
from lightning_mqgnn.data import LoaderSettings, MQGNNDataModule
from lightning_mqgnn.graph.dataset import GraphDataset
from lightning_mqgnn.graph.generated import generate_graph
from lightning_mqgnn.models import NodeClassifier
from lightning_mqgnn.models.node_classifier import AGGREGATION_OF_CONV
from lightning_mqgnn.pipeline.device_loader import DeviceResidentLoader
from lightning_mqgnn.pipeline.placement import Placement
from lightning_mqgnn.pipeline.schedule import num_batches
from lightning_mqgnn.pipeline.source import BatchSource
from lightning_mqgnn.sampling.fastgcn import FastGCNSampler
from lightning_mqgnn.sampling.feature_cache import GNSCache
from lightning_mqgnn.sampling.gns import GNSSampler
from lightning_mqgnn.sampling.ladies import LADIESSampler
from lightning_mqgnn.sampling.neighbor import NeighborSampler

CONFIGS = {  # fan-outs input layer first: SALIENT's 15,10,5 are listed from the output layer
    "salient": dict(fanouts=[5, 10, 15], num_layers=3, batch_size=1024, hidden=256),
    "paper": dict(fanouts=[5, 5], num_layers=2, batch_size=1024, hidden=256),
    "paper_gcn": dict(fanouts=[5, 5], num_layers=2, batch_size=1024, hidden=256, conv="gcn"),
}
PARTS = ("speed", "census", "accuracy")
LOADERS = {
    "sequential": dict(mode="sequential", sample_on="cpu"),
    "pipeline": dict(mode="pipeline", sample_on="cpu", producer="workers"),
    "device": dict(mode="device", sample_on="auto", features_on="auto"),
    "device_process": dict(mode="device", sample_on="auto", features_on="auto", device_sampler="process"),
}


CENSUS = {  # samplers whose host syncs are counted (lightning_mqgnn/conf/model sizes)
    "sage 15,10,5": lambda g, t: NeighborSampler(g, [5, 10, 15], "mean"),
    "gcn 5,5": lambda g, t: NeighborSampler(g, [5, 5], "gcn"),
    "fastgcn_fd 1024,512": lambda g, t: FastGCNSampler(g, [1024, 512], flat=True, debias=True),
    "ladies_fd 1024,512": lambda g, t: LADIESSampler(g, [1024, 512], flat=True, debias=True),
    "sage_gns 5,5": lambda g, t: GNSSampler(  # as lightning_mqgnn/conf/model/sage_gns.yaml
        g,
        [5, 5],
        GNSCache(g, t, fraction=0.01, fanouts=(5, 5)),
        sampling="labor",
        importance_sampling=-1,
        estimator="hajek",
    ),
}


@dataclass
class SyncRow:
    sampler: str
    site: str
    op: str
    per_batch: float


@dataclass
class SpeedRow:
    config: str
    loader: str
    batches: int  # trained per epoch
    epoch_batches: int  # in a whole epoch
    epoch_s: float
    first_epoch_s: float
    batch_ms: float
    gpu_busy: float | None
    peak_device_mib: float | None
    sample_ms: float | None
    gather_ms: float | None
    placement: str
    cuda_graphs: bool = False
    graphs_captured: int = 0

    @property
    def whole_epoch_s(self) -> float:
        """The epoch time scaled from the batches trained to the whole epoch."""
        return self.epoch_s * self.epoch_batches / self.batches


@dataclass
class AccuracyRow:
    dataset: str
    loader: str
    seeds: list[int]
    test_metrics: list[float]

    @property
    def mean(self) -> float:
        return statistics.fmean(self.test_metrics)

    @property
    def std(self) -> float:
        return statistics.stdev(self.test_metrics) if len(self.test_metrics) > 1 else 0.0


class EpochClock(pl.Callback):
    """Wall time of every training epoch (the device synchronised at both ends) and the
    device loader's per-batch sample/gather times from ``batch.meta``."""

    def __init__(self):
        self.epochs: list[float] = []
        self.sample_s: list[float] = []
        self.gather_s: list[float] = []
        self._t0 = 0.0

    def _now(self, module: pl.LightningModule) -> float:
        if module.device.type == "cuda":
            torch.cuda.synchronize(module.device)
        return time.perf_counter()

    def on_train_epoch_start(self, trainer, pl_module):
        self._t0 = self._now(pl_module)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if batch.meta.get("producer") == "device":
            self.sample_s.append(batch.meta["sample_s"])
            self.gather_s.append(batch.meta["gather_s"])

    def on_train_epoch_end(self, trainer, pl_module):
        self.epochs.append(self._now(pl_module) - self._t0)


def accelerator() -> str:
    return "gpu" if torch.cuda.is_available() else "cpu"


def trainer_for(callbacks, epochs: int, batches: int | None, validate: bool = False) -> pl.Trainer:
    return pl.Trainer(
        accelerator=accelerator(),
        devices=1,
        max_epochs=epochs,
        limit_train_batches=batches if batches else 1.0,
        limit_val_batches=1.0 if validate else 0,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
    )


def split_loader(loader: str) -> tuple[str, int | None]:
    """A ``--loaders`` name as ``(LOADERS key, sampler processes)``: ``device_processN`` is
    ``device_process`` with N of them; any other name stands as it is, with None."""
    base = loader.rstrip("0123456789")
    if base == "device_process" and base != loader:
        return base, int(loader[len(base) :])
    return loader, None


def loader_options(loader: str) -> dict:
    """The DataModule options of a ``--loaders`` name (``split_loader``)."""
    base, processes = split_loader(loader)
    options = dict(LOADERS[base])
    if processes is not None:
        options["sampler_processes"] = processes
    return options


def datamodule(ds: GraphDataset, loader: str, config: dict, batch_size: int, seed: int, workers):
    options = loader_options(loader)
    if loader == "pipeline":
        options["num_workers"] = workers
    aggregation = AGGREGATION_OF_CONV[config.get("conv", "sage")]
    sampler = NeighborSampler(ds.graph, config["fanouts"], aggregation)
    return MQGNNDataModule(
        ds, sampler, LoaderSettings(batch_size=batch_size, seed=seed, aggregate_inputs=True, **options)
    )


def module_for(ds: GraphDataset, config: dict, seed: int, cuda_graphs: bool = False) -> NodeClassifier:
    torch.manual_seed(seed)
    return NodeClassifier(
        ds.num_features,
        ds.num_classes,
        conv=config.get("conv", "sage"),
        hidden=config["hidden"],
        num_layers=config["num_layers"],
        dropout=0.5,
        lr=1e-3,
        metric=ds.metric,
        cuda_graphs=cuda_graphs,
    )


def ms(values: list[float]) -> float | None:
    return 1000.0 * statistics.fmean(values) if values else None


def speed_run(ds: GraphDataset, config: str, loader: str, args, cuda_graphs: bool = False) -> SpeedRow:
    c = CONFIGS[config]
    batch_size = args.batch_size or c["batch_size"]
    dm = datamodule(ds, loader, c, batch_size, 0, args.num_workers)
    epoch_batches = num_batches(ds.train_idx.numel(), batch_size, 1, drop_last=False)
    batches = args.device_batches if loader.startswith("device") else args.batches
    batches = min(batches, epoch_batches) if batches else epoch_batches
    clock, timer, busy = EpochClock(), BatchTimer(trim=args.trim), GPUBusyMonitor()
    gc.collect()  # the previous run's trainer and resident graph (reference cycles)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    trainer = trainer_for([clock, timer, busy], args.epochs, batches)
    module = module_for(ds, c, 0, cuda_graphs)
    try:
        trainer.fit(module, dm)
    finally:
        dm.shutdown_pipeline()
    later = clock.epochs[1:] or clock.epochs
    placement = dm.placement().reason if dm.uses_device_loader() else "CPU sampling"
    peak = torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None
    return SpeedRow(
        config,
        loader,
        batches=batches,
        epoch_batches=epoch_batches,
        epoch_s=statistics.fmean(later),
        first_epoch_s=clock.epochs[0],
        batch_ms=1000.0 * timer.batch_time,
        gpu_busy=busy.busy_fraction,
        peak_device_mib=peak,
        sample_ms=ms(clock.sample_s),
        gather_ms=ms(clock.gather_s),
        placement=placement,
        cuda_graphs=cuda_graphs,
        graphs_captured=module._graph_steps.num_graphs if module._graph_steps is not None else 0,
    )


def sync_census(ds: GraphDataset, batches: int, batch_size: int) -> list[SyncRow]:
    """Host syncs per batch of device-resident sampling and gathering on the training device (the
    CPU without CUDA), by call site (``_sync_census``); on CUDA each sampler also gets a row with
    the total of CUDA's sync debug mode."""
    device = (
        torch.device("cuda", torch.cuda.current_device())
        if torch.cuda.is_available()
        else torch.device("cpu")
    )
    rows = []
    for name, make in CENSUS.items():
        try:
            rows += _census_of(name, make(ds.graph, ds.train_idx), ds, batches, batch_size, device)
        except Exception as exc:  # a failed count is reported, the other measurements are kept
            rows.append(SyncRow(name, f"census failed: {exc!r}"[:200], "-", float("nan")))
    return rows


def _census_of(
    name: str, sampler, ds: GraphDataset, batches: int, batch_size: int, device: torch.device
) -> list[SyncRow]:
    cache = getattr(sampler, "cache", None)
    source = BatchSource(ds, sampler, batch_size, aggregate_inputs=cache is None, feature_cache=cache)
    loader = DeviceResidentLoader(source, Placement(device, device, "census"))
    epoch, seeds, _ = loader.begin_epoch()
    n = max(1, min(batches, len(seeds) - 1))
    loader.produce(epoch, len(seeds) - 1, seeds[-1])  # warm-up: scratch arrays, allocator

    def run(i: int) -> None:
        loader.produce(epoch, i, seeds[i])

    counts = count_syncs(run, n)
    rows = [SyncRow(name, site, op, c / n) for (site, op), c in sorted(counts.items(), key=lambda kv: -kv[1])]
    rows.append(SyncRow(name, "all of the above", "sum", sum(counts.values()) / n))
    if device.type == "cuda":
        rows.append(SyncRow(name, "CUDA sync debug mode", "all", cuda_sync_count(run, n) / n))
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for i in range(n):
        run(i)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    ms = 1000.0 * (time.perf_counter() - t0) / n
    rows.append(SyncRow(name, "sampled and gathered alone (no training beside it)", "ms", ms))
    return rows


def test_metric(ds: GraphDataset, loader: str, seed: int, args) -> float:
    c = CONFIGS["paper"]
    dm = datamodule(ds, loader, c, args.accuracy_batch_size, seed, args.num_workers)
    module = module_for(ds, c, seed)
    trainer = trainer_for([], args.accuracy_epochs, None)
    try:
        trainer.fit(module, dm)
        result = trainer.test(module, datamodule=dm, verbose=False)
    finally:
        dm.shutdown_pipeline()
    return float(result[0]["test/metric"])


def seed_metrics(ds: GraphDataset, loader: str, args) -> list[float]:
    return [test_metric(ds, loader, seed, args) for seed in args.seeds]


def accuracy_datasets(args) -> dict[str, GraphDataset]:
    out = {}
    for name in args.accuracy_datasets:
        if name == "products_like":
            out[name] = generate_graph("products", scale=args.accuracy_scale, seed=0)
        else:
            from lightning_mqgnn.graph.registry import load_dataset

            try:
                out[name] = load_dataset(name)
            except FileNotFoundError as err:
                print(f"note: {name} skipped ({err})")
    return out


def fmt(x, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


def speed_table(rows: list[SpeedRow]) -> list[str]:
    lines = [
        "| config | loader | CUDA graphs (captured) | batches | epoch (s) | whole epoch (s) | first epoch (s) | batch (ms) "
        "| GPU busy | peak device (MiB) | device sample (ms) | device gather (ms) | placement |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        graphs = (
            (f"on ({r.graphs_captured})" if r.cuda_graphs else "off") if torch.cuda.is_available() else "-"
        )
        lines.append(
            f"| {r.config} | {r.loader} | {graphs} | {r.batches}/{r.epoch_batches} | {r.epoch_s:.2f} "
            f"| {r.whole_epoch_s:.2f} | {r.first_epoch_s:.2f} | {r.batch_ms:.1f} "
            f"| {fmt(r.gpu_busy, '.0%')} | {fmt(r.peak_device_mib, '.0f')} "
            f"| {fmt(r.sample_ms, '.2f')} | {fmt(r.gather_ms, '.2f')} | {r.placement} |"
        )
    return lines


def census_table(rows: list[SyncRow]) -> list[str]:
    lines = ["| sampler | host sync at | op | per batch |", "|---|---|---|---|"]
    lines += [f"| {r.sampler} | {r.site} | {r.op} | {r.per_batch:.1f} |" for r in rows]
    return lines


def accuracy_table(rows: list[AccuracyRow], epochs: int) -> list[str]:
    lines = [
        f"| dataset | loader | test metric ({epochs} epochs, mean ± std) | seeds | per seed |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        per = ", ".join(f"{m:.4f}" for m in r.test_metrics)
        lines.append(f"| {r.dataset} | {r.loader} | {r.mean:.4f} ± {r.std:.4f} | {len(r.seeds)} | {per} |")
    return lines


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench.py device_sampling", description=__doc__.splitlines()[0])
    p.add_argument("--scale", type=float, default=1.0, help="products_like scale of the speed runs")
    p.add_argument("--parts", default=",".join(PARTS), help=f"what to measure, among {','.join(PARTS)}")
    p.add_argument("--configs", default="salient,paper")
    p.add_argument("--loaders", default="sequential,pipeline,device,device_process")
    p.add_argument("--cuda-graphs", type=cuda_graph_modes, default="off", help=CUDA_GRAPHS_HELP)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batches", type=int, default=40, help="CPU loaders' batches per epoch (0: all)")
    p.add_argument("--device-batches", type=int, default=0, help="device loader's batches per epoch (0: all)")
    p.add_argument("--batch-size", type=int, default=None, help="speed runs (default: the config's, 1024)")
    p.add_argument("--trim", type=int, default=5, help="batches dropped at each end of the batch time")
    p.add_argument("--num-workers", type=int, default=None, help="pipeline workers (default: cores - 1)")
    p.add_argument("--accuracy-datasets", default="amazon_photo,products_like")
    p.add_argument(
        "--accuracy-scale", type=float, default=0.1, help="products_like scale of the accuracy runs"
    )
    p.add_argument("--accuracy-epochs", type=int, default=5)
    p.add_argument("--accuracy-batch-size", type=int, default=1024)
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument(
        "--census-batches", type=int, default=10, help="batches per sampler in the host-sync census"
    )
    p.add_argument(
        "--smoke", action="store_true", help="tiny sizes: a check that the script runs, on the CPU too"
    )
    p.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) if os.environ.get("OUT") else None)
    args = p.parse_args(argv)
    if args.smoke:
        args.scale, args.accuracy_scale = 0.002, 0.002
        args.epochs, args.batches, args.device_batches, args.trim, args.accuracy_epochs = 2, 4, 4, 0, 1
        args.batch_size, args.accuracy_batch_size = 64, 256
        args.num_workers = 1
    args.parts = [x for x in args.parts.split(",") if x]
    args.configs = [c for c in args.configs.split(",") if c]
    args.loaders = [x for x in args.loaders.split(",") if x]
    args.accuracy_datasets = [d for d in args.accuracy_datasets.split(",") if d]
    args.seeds = [int(s) for s in args.seeds.split(",") if s]
    for name, known, what in (
        (args.parts, PARTS, "part"),
        (args.configs, CONFIGS, "config"),
        ([split_loader(x)[0] for x in args.loaders], LOADERS, "loader"),
    ):
        unknown = sorted(set(name) - set(known))
        if unknown:
            p.error(f"unknown {what}(s) {unknown}; expected among {sorted(known)}")
    return args


def save_json(args, speed: list[SpeedRow], accuracy: list[AccuracyRow], census: list[SyncRow]) -> None:
    """The results so far (written after every stage: a run cut short keeps what it measured)."""
    if args.out is None:
        return
    args.out.mkdir(parents=True, exist_ok=True)
    payload = {
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "speed": [asdict(r) for r in speed],
        "accuracy": [{**asdict(r), "mean": r.mean, "std": r.std} for r in accuracy],
        "host_syncs": [asdict(r) for r in census],
    }
    (args.out / "device_sampling.json").write_text(json.dumps(payload, indent=2))


def main(argv: list[str]) -> int:
    args = parse(argv)
    t0 = time.perf_counter()
    ds = None
    if {"speed", "census"} & set(args.parts):
        ds = generate_graph("products", scale=args.scale, seed=0)
        print(
            f"speed graph: {ds.num_nodes} nodes, {ds.graph.num_edges} directed edges, generated in "
            f"{time.perf_counter() - t0:.0f} s",
            flush=True,
        )
    speed: list[SpeedRow] = []
    accuracy: list[AccuracyRow] = []
    census: list[SyncRow] = []
    for config in args.configs if "speed" in args.parts else []:
        for loader in args.loaders:
            for graphs in args.cuda_graphs:
                label = f"speed {config} {loader} cuda_graphs={graphs}"
                result = attempt(label, partial(speed_run, ds, config, loader, args, graphs))
                if result is not None:
                    speed.append(result)
                    print(speed_table(speed[-1:])[-1], flush=True)
                    save_json(args, speed, accuracy, census)
    if "census" in args.parts:
        census = sync_census(ds, args.census_batches, args.batch_size or 1024)
        save_json(args, speed, accuracy, census)
    del ds
    for name, data in accuracy_datasets(args).items() if "accuracy" in args.parts else []:
        for loader in ("sequential", "device"):
            label = f"accuracy {name} {loader}"
            metrics = attempt(label, partial(seed_metrics, data, loader, args))
            if metrics is None:
                continue
            accuracy.append(AccuracyRow(name, loader, args.seeds, metrics))
            print(accuracy_table(accuracy[-1:], args.accuracy_epochs)[-1], flush=True)
            save_json(args, speed, accuracy, census)
    header = machine_header("device_sampling", argv) + [
        f"- speed: products_like x{args.scale:g}, {args.epochs} epochs; total {time.perf_counter() - t0:.0f} s"
    ]
    table = []
    for part, lines in (
        ("speed", speed_table(speed)),
        ("accuracy", accuracy_table(accuracy, args.accuracy_epochs)),
        ("census", census_table(census)),
    ):
        if part in args.parts:
            table += [*lines, ""]
    write_report(
        "Device-resident sampling", header, table, args.out / "device_sampling.md" if args.out else None
    )
    return exit_status()
