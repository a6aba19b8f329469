"""Benchmark of the MQ-GNN pipeline against the sequential loop, in one run on one graph.

``speed``: a generated products-like graph (default 1.03M nodes, 100 features), SAGE, fan-out
5,5, batch 1024, a fixed number of batches per epoch and configuration:
  sequential (sample → gather → compute, no overlap) | pipeline, fixed Q | pipeline, adaptive Q.
Reports epoch time, trimmed batch time (first and last 20 dropped), time the training loop
waited for data, and peak memory of the process tree (PSS: shared pages counted once). With
``--epochs E > 1`` the epoch time and the stage times are means over epochs 2..E, and the first
epoch, which also starts the workers (fork, first touch of the shared graph and features), is
shown beside them. The
trainer process runs with one torch thread and the pipeline with K workers (default 1: on two
cores one samples while the other computes). Overlap target: pipeline epoch time
<= 1.15 x max(sequential sample+gather time / K, sequential compute time).

``parity``: test metric of sequential vs pipelined training on real npz graphs from the data directory
(same seeds, same epochs). Both modes seed every batch from (seed, epoch, index), so they should
agree exactly.

    python recipes/benchmarks/pipeline.py speed --batches 80 --repeats 2 [--epochs 3]
    python recipes/benchmarks/pipeline.py parity --datasets amazon_photo dblp --epochs 10
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import threading
import time

import lightning.pytorch as pl
import numpy as np
import psutil
import torch

from lightning_mqgnn.callbacks import StageTimingCallback
from lightning_mqgnn.data import LoaderSettings, MQGNNDataModule
from lightning_mqgnn.graph.dataset import GraphDataset
from lightning_mqgnn.models import NodeClassifier
from lightning_mqgnn.sampling.neighbor import NeighborSampler


class PeakMemory:
    """Samples the memory of this process and its children while a run goes on.

    ``peak_rss``: resident set of the training process alone, every ``interval`` seconds (cheap).
    ``peak_pss``: proportional set size summed over the tree (shared memory counted once), every
    ``pss_interval`` seconds: reading it makes the kernel walk every page (~40 ms per GiB-sized
    process), which on a 2-core machine would take CPU from the pipeline being measured.
    """

    def __init__(self, interval: float = 0.2, pss_interval: float = 2.0):
        self.interval = interval
        self.pss_every = max(1, round(pss_interval / interval))
        self.peak_pss = 0
        self.peak_rss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self, pss: bool) -> None:
        me = psutil.Process()
        self.peak_rss = max(self.peak_rss, me.memory_info().rss)
        if pss:
            total = 0
            for p in [me] + me.children(recursive=True):
                with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                    total += p.memory_full_info().pss
            self.peak_pss = max(self.peak_pss, total)

    def _run(self) -> None:
        tick = 0
        while not self._stop.wait(self.interval):
            tick += 1
            self._sample(pss=tick % self.pss_every == 0)

    def __enter__(self) -> PeakMemory:
        self._sample(pss=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def trainer_for(callbacks: list, **kw) -> pl.Trainer:
    opts = dict(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    opts.update(kw)
    return pl.Trainer(callbacks=callbacks, **opts)


def sage(ds: GraphDataset, hidden: int, seed: int) -> NodeClassifier:
    torch.manual_seed(seed)
    return NodeClassifier(ds.num_features, ds.num_classes, conv="sage", hidden=hidden, metric=ds.metric)


def run_speed(args: argparse.Namespace) -> list[dict]:
    from lightning_mqgnn.graph.generated import generate_graph

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    ds = generate_graph("products", scale=args.scale, seed=args.seed)
    ds.share_memory_()
    print(f"# {ds.summary()} (generated in {time.perf_counter() - t0:.0f} s)", flush=True)
    fanouts = [int(f) for f in args.fanout.split(",")]
    configs = [
        ("sequential", dict(mode="sequential")),
        # the workers' pipeline is what is measured: never the training thread's (producer=auto)
        (
            f"pipeline K={args.workers} Q={args.fixed_q}",
            dict(mode="pipeline", queue_size=args.fixed_q, producer="workers"),
        ),
        (f"pipeline K={args.workers} Q=auto", dict(mode="pipeline", queue_size="auto", producer="workers")),
    ]
    rows = []
    for repeat in range(args.repeats):  # interleaved: slow drifts of machine load hit every config
        for name, extra in configs:
            rows.append(run_config(ds, args, fanouts, name, extra, repeat))
    return rows


def run_config(
    ds: GraphDataset, args: argparse.Namespace, fanouts: list[int], name: str, extra: dict, repeat: int
) -> dict:
    dm = MQGNNDataModule(
        ds,
        NeighborSampler(ds.graph, fanouts, "mean"),
        LoaderSettings(batch_size=args.batch_size, seed=args.seed, num_workers=args.workers, **extra),
    )
    timing = StageTimingCallback(trim=20)
    epochs = args.epochs
    trainer = trainer_for([timing], max_epochs=epochs, limit_train_batches=args.batches, limit_val_batches=0)
    with PeakMemory() as mem:
        trainer.fit(sage(ds, args.hidden, args.seed), dm)
    s = timing.summary
    skip = 1 if epochs > 1 else 0  # the epochs the figures describe: 2..E, or the only one

    def per_epoch(key: str) -> float:
        values = timing.records[key]
        return float(sum(values[len(values) * skip // epochs :])) / (epochs - skip)

    history = dm.pipeline_loader.queue_size_history if dm.pipeline_loader is not None else []
    for e in history:
        print(f"# adaptive Q estimate ({name}, repeat {repeat}): {e.as_dict()}", flush=True)
    print(f"# done: {name}, repeat {repeat}, load avg {os.getloadavg()}", flush=True)
    return dict(
        name=name,
        repeat=repeat,
        epoch_s=float(np.mean(timing.epoch_times[skip:])),
        first_epoch_s=timing.epoch_times[0],
        batch_ms=1e3 * s["mean_batch_s"],
        wait_s=per_epoch("wait_s"),
        prep_s=per_epoch("sample_s") + per_epoch("gather_s"),
        compute_s=per_epoch("batch_s") - per_epoch("wait_s"),
        peak_pss_gb=mem.peak_pss / 2**30,
        peak_rss_gb=mem.peak_rss / 2**30,
        q="→".join(str(e.q) for e in history) or str(extra.get("queue_size", "-")),
        batches=int(s["num_batches"]),
    )


def print_speed(rows: list[dict], workers: int) -> None:
    print(
        "| configuration | epoch (s) | first epoch (s) | batch (ms, trimmed) | waited for data (s) | "
        "sample+gather (s) | compute (s) | peak PSS tree (GiB) | peak RSS trainer (GiB) | Q |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['name']} (run {r['repeat'] + 1}) | {r['epoch_s']:.2f} | {r['first_epoch_s']:.2f} | "
            f"{r['batch_ms']:.0f} | {r['wait_s']:.1f} | {r['prep_s']:.1f} | "
            f"{r['compute_s']:.1f} | {r['peak_pss_gb']:.2f} | {r['peak_rss_gb']:.2f} | {r['q']} |"
        )
    names = list(dict.fromkeys(r["name"] for r in rows))

    def median(name: str, key: str) -> float:
        return float(np.median([r[key] for r in rows if r["name"] == name]))

    seq = names[0]
    bound = max(median(seq, "prep_s") / workers, median(seq, "compute_s"))
    for name in names[1:]:
        print(
            f"# {name} (medians over runs): speed-up over sequential "
            f"{median(seq, 'epoch_s') / median(name, 'epoch_s'):.2f}x; epoch / max(seq sample+gather / K, "
            f"seq compute) = {median(name, 'epoch_s') / bound:.2f} (target <= 1.15)"
        )


def load_shared(name: str) -> GraphDataset:
    """A registered dataset (graph/registry.py: the mirror, the cache, or a download) through the
    project's npz loader (bag-of-words rows normalised)."""
    from lightning_mqgnn.graph.registry import load_dataset

    return load_dataset(name)


def run_parity(args: argparse.Namespace) -> list[dict]:
    rows = []
    for name in args.datasets:
        ds = load_shared(name)
        scores = {}
        for mode in ("sequential", "pipeline"):
            dm = MQGNNDataModule(
                ds,
                NeighborSampler(ds.graph, [5, 5], "mean"),
                LoaderSettings(
                    batch_size=args.batch_size,
                    seed=args.seed,
                    mode=mode,
                    num_workers=args.workers,
                    producer="workers",
                ),
            )
            model = sage(ds, args.hidden, args.seed)
            trainer = trainer_for([], max_epochs=args.epochs, check_val_every_n_epoch=args.epochs)
            trainer.fit(model, dm)
            scores[mode] = trainer.test(model, dm, verbose=False)[0]["test/metric"]
        rows.append(dict(name=name, **scores, diff=100 * abs(scores["sequential"] - scores["pipeline"])))
        print(f"# {name}: {rows[-1]}", flush=True)
    print("| dataset | sequential test | pipeline test | |difference| (points) |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['name']} | {r['sequential']:.4f} | {r['pipeline']:.4f} | {r['diff']:.2f} |")
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sp = sub.add_parser("speed", help="sequential vs pipeline (fixed Q, adaptive Q) on a generated graph")
    sp.add_argument("--scale", type=float, default=0.42, help="products preset scale (0.42: 1.03M nodes)")
    sp.add_argument("--batches", type=int, default=80, help="batches per epoch")
    sp.add_argument("--epochs", type=int, default=1, help="epochs per fit (>1: epoch time = mean of 2..E)")
    sp.add_argument("--batch-size", type=int, default=1024)
    sp.add_argument("--fanout", default="5,5")
    sp.add_argument("--hidden", type=int, default=256)
    sp.add_argument("--workers", type=int, default=1)
    sp.add_argument("--fixed-q", type=int, default=2)
    sp.add_argument("--seed", type=int, default=0)
    sp.add_argument("--repeats", type=int, default=1, help="interleaved repetitions of the three configs")
    pp = sub.add_parser(
        "parity", help="test metric, sequential vs pipeline, on npz graphs of the data directory"
    )
    pp.add_argument("--datasets", nargs="+", default=["amazon_photo", "dblp"])
    pp.add_argument("--epochs", type=int, default=10)
    pp.add_argument("--batch-size", type=int, default=256)
    pp.add_argument("--hidden", type=int, default=256)
    pp.add_argument("--workers", type=int, default=1)
    pp.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(f"# {' '.join(['python', *sys.argv])}; cores {os.cpu_count()}; load avg {os.getloadavg()}")
    if args.command == "speed":
        rows = run_speed(args)
        print_speed(rows, args.workers)
        return rows
    return run_parity(args)


if __name__ == "__main__":
    main()
