"""Benchmark: deep full-graph GCNII on 4 gloo ranks over a SIMULATED link: single-process vs
graph-parallel vs GNNPipe (layer stages) vs the hybrid (2 graph partitions x 2 stages), at several
depths, same data, epochs and seeds.

The link is the full-graph benchmark's (``benchmarks.fullgraph.simulated_link``): every message a
rank sends costs ``latency + bytes / bandwidth`` of sleep on its sending thread, and the weight
all-reduce a ring all-reduce's time. Per run it reports the median training-epoch time (epoch 3
on; validation excluded), the bytes each mode sends per epoch (halo rows, or stage activations
and gradients; all ranks), the test metric at the best validation epoch, for GNNPipe the share of
history rows read that were a whole epoch old, and every rank's peak memory growth during training
(resident set size over its size at training start: activations, histories, messages, optimizer
state). Memory comes from a second, short run of each configuration (``--memory-epochs``,
validation every epoch) made after all timed runs, with every allocation over 64 KiB served by its
own mmap: a freed tensor then leaves the resident set at once, so the peak is one of live memory
rather than of the allocator's heap (GNNPipe's per-chunk tensors are 0.1-2 MB; left in the heap,
their freed space would count), and the mmaps' cost stays out of the timed epochs. It writes a markdown table (``--out``) and a bytes-vs-depth PNG (``--plot``). A
measurement, not a test: nothing here asserts targets.

    python recipes/bench.py gnnpipe --out gnnpipe.md --plot docs/benchmarks/fullgraph/gnnpipe_bytes.png
    python recipes/bench.py gnnpipe --datasets cora --depths 4 --epochs 3   # smoke run
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import lightning.pytorch as pl

from benchmarks._report import machine_header, write_report
from benchmarks.fullgraph import (
    Recorder,
    add_run_arguments,
    checked_modes,
    load_dataset,
    on_simulated_link,
    one_thread_per_rank,
    quiet_trainer,
    save_figure,
    scoring_module,
    simulated_link,
    summarise,
)

MODES = ("single", "graph_parallel", "gnnpipe", "hybrid")


MMAP_THRESHOLD = 64 << 10


def mmap_large_allocations(threshold: int = MMAP_THRESHOLD) -> bool:
    """Serve every allocation over ``threshold`` bytes with its own mmap (glibc ``mallopt``), so a
    freed tensor leaves the resident set at once: the peak resident set is then the peak of live
    memory, not of what the allocator keeps cached. Applies to this process and the ranks it forks."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if name is None:
        return False
    m_mmap_threshold = -3
    return bool(ctypes.CDLL(name).mallopt(m_mmap_threshold, threshold))


def make_strategy(mode: str, args) -> Any:
    """The mode's strategy on the simulated link (the single process runs on one device)."""
    from lightning_mqgnn.fullgraph import FullGraphStrategy, GNNPipeStrategy

    latency, bandwidth = args.latency_ms / 1e3, args.bandwidth_gbit * 1e9 / 8
    link = simulated_link(latency, bandwidth)
    if mode in ("single", "graph_parallel"):
        strategy = on_simulated_link(FullGraphStrategy, latency, bandwidth)
        return strategy(mode="sync", transport=link, seed=args.seed, start_method="fork")

    class Pipelined(on_simulated_link(GNNPipeStrategy, latency, bandwidth)):
        def validation_step(self, *a, **k):
            self.evaluate(a[0], ("val", "test"))  # both splits from one forward

    return Pipelined(
        stages=args.world if mode == "gnnpipe" else args.world // 2,
        num_chunks=args.chunks,
        transport=link,
        seed=args.seed,
        start_method="fork",
    )


class MemoryRecorder(Recorder):
    """``Recorder`` plus every rank's training memory and GNNPipe's stale reads. After
    ``PeakMemoryMonitor`` in the callback list (it gathers first)."""

    def __init__(self, path: Path, memory):
        super().__init__(path)
        self.memory = memory

    def figures(self, s) -> dict[str, Any]:
        stale = getattr(s, "staleness", None)
        return {
            **super().figures(s),
            "train_rss_mb": self.memory.train_rss_mb,
            "peak_rss_mb": self.memory.peak_rss_mb,
            "stale_fraction": stale.stale_fraction if stale is not None else None,
            "stale_halo_fraction": stale.halo_stale_fraction
            if stale is not None and stale.halo_reads
            else None,
        }


def run(args, dataset, mode: str, depth: int, workdir: Path) -> dict[str, Any]:
    from lightning_mqgnn.callbacks import PeakMemoryMonitor
    from lightning_mqgnn.fullgraph import FullGraphDataModule

    pl.seed_everything(args.seed, verbose=False)
    module = scoring_module("gcnii", args.hidden, depth, args.dropout, args.lr, dataset)
    out = workdir / f"{dataset.name}_{mode}_{depth}.json"
    memory = PeakMemoryMonitor()
    world = 1 if mode == "single" else args.world
    trainer = quiet_trainer(world, make_strategy(mode, args), args, [memory, MemoryRecorder(out, memory)])
    parts = world // 2 if mode == "hybrid" else (1 if mode == "gnnpipe" else world)
    book = workdir / f"{dataset.name}_{parts}.book"
    trainer.fit(module, datamodule=FullGraphDataModule(dataset, module.aggregation, book_path=str(book)))
    result = summarise(json.loads(out.read_text()))
    result["train_mb"] = max(result["train_rss_mb"])
    return result


def plot(results: dict[str, dict[tuple[str, int], dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(4.8 * len(results), 3.6), squeeze=False)
    for ax, (name, runs) in zip(axes[0], results.items()):
        for mode in MODES[1:]:
            points = sorted((d, r["bytes_per_epoch"]) for (m, d), r in runs.items() if m == mode)
            if points:
                ax.plot([d for d, _ in points], [b / 2**20 for _, b in points], marker="o", label=mode)
        ax.set_title(name)
        ax.set_xlabel("GCNII layers")
        ax.set_ylabel("MiB sent per epoch (all ranks)")
        ax.set_xscale("log", base=2)
        ax.legend()
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--datasets", default="coauthor_physics_128,products_like")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--depths", default="8,16,32")
    p.add_argument(
        "--chunks", type=int, default=None, help="GNNPipe chunks per partition (default 4 per stage)"
    )
    p.add_argument(
        "--memory-epochs", type=int, default=3, help="epochs of each memory run (validation every epoch)"
    )
    add_run_arguments(p, epochs=60, hidden=64)
    args = p.parse_args(argv)
    modes = checked_modes(p, args.modes, MODES)
    depths = [int(d) for d in args.depths.split(",")]
    one_thread_per_rank()
    results: dict[str, dict[tuple[str, int], dict]] = {}
    rows = [
        "| dataset | layers | mode | bytes/epoch | x fewer than graph-parallel | epoch ms | "
        "training memory MB (max rank) | x graph-parallel | test | Δ test vs single (points) | stale reads |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    datasets = {name: load_dataset(name, args.products_scale) for name in args.datasets.split(",")}
    configs = [(name, depth, mode) for name in datasets for depth in depths for mode in modes]
    with tempfile.TemporaryDirectory() as tmp:
        for name, depth, mode in configs:
            r = run(args, datasets[name], mode, depth, Path(tmp))
            results.setdefault(name, {})[(mode, depth)] = r
            print(
                f"{name} {depth} layers {mode}: epoch {r['epoch_ms']:.1f} ms, "
                f"{r['bytes_per_epoch']:.0f} B/epoch, "
                f"test {r['test']:.4f} (best val {r['val']:.4f} at epoch {r['best_epoch']})",
                flush=True,
            )
        exact_peaks = mmap_large_allocations()  # from here on: the memory runs
        memory_args = argparse.Namespace(**{**vars(args), "epochs": args.memory_epochs, "val_every": 1})
        for name, depth, mode in configs:
            r = run(memory_args, datasets[name], mode, depth, Path(tmp))
            results[name][(mode, depth)]["train_mb"] = r["train_mb"]
            print(
                f"{name} {depth} layers {mode}: training memory per rank "
                f"{'/'.join(f'{m:.0f}' for m in r['train_rss_mb'])} MB",
                flush=True,
            )
    for name, runs in results.items():
        for depth in depths:
            base, single = runs.get(("graph_parallel", depth)), runs.get(("single", depth))
            for mode in modes:
                r = runs[(mode, depth)]
                fewer = (  # one process sends nothing: no ratio
                    f"{base['bytes_per_epoch'] / r['bytes_per_epoch']:.2f}"
                    if base and r["bytes_per_epoch"]
                    else "–"
                )
                memory = r["train_mb"] / base["train_mb"] if base and base["train_mb"] else float("nan")
                delta = 100 * (r["test"] - single["test"]) if single else float("nan")
                stale = f"{r['stale_fraction']:.2f}" if r.get("stale_fraction") is not None else ""
                if r.get("stale_halo_fraction") is not None:
                    stale += f" (halo {r['stale_halo_fraction']:.2f})"
                rows.append(
                    f"| {name} | {depth} | {mode} | {r['bytes_per_epoch']:,.0f} | {fewer} | "
                    f"{r['epoch_ms']:.0f} | {r['train_mb']:.0f} | {memory:.2f} | {r['test']:.4f} | "
                    f"{delta:+.2f} | {stale} |"
                )
    header = machine_header("gnnpipe", argv)
    chunks = f"{args.chunks} METIS chunks per partition" if args.chunks else "4 METIS chunks per stage"
    header.append(
        f"- {args.world} gloo ranks (single: 1), GCNII {args.hidden} wide, dropout {args.dropout}, Adam lr "
        f"{args.lr}, {args.epochs} epochs, seed {args.seed}; graph-parallel on METIS partitions; GNNPipe "
        f"{args.world} stages, hybrid 2 partitions x {args.world // 2} stages, {chunks}; SIMULATED link {args.latency_ms} ms + "
        f"{args.bandwidth_gbit} Gbit/s per message; epoch time: median from epoch 3, validation excluded; "
        "test at the best validation epoch; training memory: peak resident set growth over training "
        f"start, from a separate {args.memory_epochs}-epoch run (validation every epoch)"
        + (
            f" with allocations over {MMAP_THRESHOLD >> 10} KiB mmapped (freed memory leaves the resident set)"
            if exact_peaks
            else ""
        )
    )
    write_report("Deep full-graph GCNII: graph-parallel vs GNNPipe vs hybrid", header, rows, args.out)
    if args.plot is not None:
        plot(results, args.plot)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
