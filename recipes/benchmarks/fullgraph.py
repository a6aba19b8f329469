"""Benchmark: full-graph training on 4 gloo ranks over a SIMULATED link: graph-parallel vs PipeGCN
vs PipeQS, same data, model, epochs and seeds.

The link is modelled here, not in the library: every halo message a rank sends costs
``latency + bytes / bandwidth`` of sleep on the thread that sends it, messages of one rank one
after the other (one network interface per rank), and the weight-gradient all-reduce costs a ring
all-reduce's time (``2 (P-1)`` steps of ``latency + bytes / (P bandwidth)``) before it runs.
Graph-parallel training waits for every message; PipeGCN and PipeQS send on the communication
thread while the next layers compute. Defaults: 1 ms and 1 Gbit/s.

Per mode it reports the median training-epoch time (epoch 3 on; validation excluded), halo bytes
per epoch (all ranks), the test metric at the best validation epoch, and the ratios to
graph-parallel; it writes a markdown table (``--out``) and a loss-vs-epoch PNG (``--plot``).
A measurement, not a test: nothing here asserts targets.

    python recipes/bench.py fullgraph --out fullgraph.md --plot fullgraph_convergence.png
    python recipes/bench.py fullgraph --datasets cora --epochs 5   # smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

from benchmarks._recipe import recipe_config
from benchmarks._report import machine_header, write_report

MODES = {  # name: FullGraphStrategy arguments
    "graph_parallel": dict(mode="sync", quantize=False),
    "pipegcn": dict(mode="stale", quantize=False),
    "pipeqs": dict(mode="stale", quantize=True),
}


def load_dataset(name: str, products_scale: float):
    """The recipe's ``lightning_mqgnn/conf/data/<name>.yaml`` (coauthor_physics: its 1,024 most frequent
    columns), products_like at ``products_scale``."""
    from hydra.utils import instantiate

    overrides = [f"data={name}"] + ([f"data.scale={products_scale}"] if name == "products_like" else [])
    return instantiate(recipe_config(overrides).data)


def simulated_link(latency_s: float, bandwidth_bytes_s: float):
    """A ``Transport`` factory whose messages take ``latency + bytes / bandwidth`` (SIMULATED)."""
    from lightning_mqgnn.fullgraph import Transport

    class SimulatedLinkTransport(Transport):
        def exchange(self, sends, recvs, tag):
            delay = sum(
                latency_s + s.numel() * s.element_size() / bandwidth_bytes_s
                for peer, s in enumerate(sends)
                if peer != self.rank and s.numel()
            )
            time.sleep(delay)
            super().exchange(sends, recvs, tag)

    return SimulatedLinkTransport


def ring_allreduce_s(numel: int, world: int, latency_s: float, bandwidth_bytes_s: float) -> float:
    """A ring all-reduce of a float64 bucket on the simulated link: 2 (P-1) steps of 1/P of it."""
    return 2 * (world - 1) * (latency_s + numel * 8 / world / bandwidth_bytes_s) if world > 1 else 0.0


def on_simulated_link(strategy_cls, latency_s: float, bandwidth_bytes_s: float):
    """``strategy_cls`` (a full-graph strategy) with the simulated link's all-reduce time slept
    before its gradient all-reduce."""

    class SimulatedLinkStrategy(strategy_cls):
        def reduce_after_backward(self, optimizer, loss):
            numel = sum(p.numel() for g in optimizer.param_groups for p in g["params"])
            time.sleep(ring_allreduce_s(numel, self.world_size, latency_s, bandwidth_bytes_s))
            super().reduce_after_backward(optimizer, loss)

    return SimulatedLinkStrategy


def make_strategy(mode: str, latency_s: float, bandwidth_bytes_s: float, seed: int, smoothing: float = 0.0):
    from lightning_mqgnn.fullgraph import FullGraphStrategy

    return on_simulated_link(FullGraphStrategy, latency_s, bandwidth_bytes_s)(
        transport=simulated_link(latency_s, bandwidth_bytes_s),
        seed=seed,
        start_method="fork",
        smoothing=smoothing if MODES[mode]["mode"] == "stale" else 0.0,
        **MODES[mode],
    )


class Recorder(pl.Callback):
    """Rank 0 writes the strategy's per-epoch figures (``figures``) and the (val, test) of each
    validation."""

    def __init__(self, path: Path):
        self.path = path
        self.scores: list[tuple[int, float, float]] = []

    def on_validation_epoch_end(self, trainer, pl_module):
        m = trainer.callback_metrics
        if "val/metric" in m and "test/metric" in m:
            self.scores.append((trainer.current_epoch, float(m["val/metric"]), float(m["test/metric"])))

    def on_train_end(self, trainer, pl_module):
        if trainer.global_rank == 0:
            self.path.write_text(json.dumps(self.figures(trainer.strategy)))

    def figures(self, s) -> dict[str, Any]:
        figures = {
            "losses": s.epoch_losses,
            "bytes": s.epoch_bytes,
            "times": s.epoch_times,
            "scores": self.scores,
        }
        if getattr(s, "exchanger", None) is not None:  # the halo exchange's bit widths and size
            figures["bits"] = {
                f"{k[0]}:{k[1]}": [h[0] for h in ch.controller.history]
                for k, ch in s.exchanger.channels.items()
            }
            figures["halo_rows"] = s.exchanger.part.num_halo
        return figures


def summarise(result: dict[str, Any]) -> dict[str, Any]:
    """A run's recorded figures plus its median epoch time (epoch 3 on), mean bytes per epoch
    (epoch 2 on) and the (epoch, val, test) of its best validation."""
    times = result["times"][2:] or result["times"]
    scores = result["scores"] or [(None, float("nan"), float("nan"))]
    best = max(scores, key=lambda s: s[1])
    result.update(
        epoch_ms=1e3 * statistics.median(times),
        bytes_per_epoch=statistics.mean(result["bytes"][1:] or result["bytes"]),
        best_epoch=best[0],
        val=best[1],
        test=best[2],
    )
    return result


def quiet_trainer(world: int, strategy, args, callbacks) -> pl.Trainer:
    """The benchmarks' Trainer: CPU ranks, ``args.epochs``, validation every ``args.val_every``."""
    return pl.Trainer(
        accelerator="cpu",
        devices=world,
        strategy=strategy,
        max_epochs=args.epochs,
        check_val_every_n_epoch=args.val_every,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )


def scoring_module(conv: str, hidden: int, layers: int, dropout: float, lr: float, dataset):
    """FullGraphNodeClassifier that scores validation and test in the same pass."""
    from lightning_mqgnn.fullgraph import FullGraphNodeClassifier

    class Scoring(FullGraphNodeClassifier):
        def validation_step(self, batch, batch_idx):
            logits = self(batch)
            for mask, metric, name in (
                (batch.val_mask, self.val_metric, "val/metric"),
                (batch.test_mask, self.test_metric, "test/metric"),
            ):
                metric.update(logits[mask], batch.labels[mask])
                self.log(name, metric, batch_size=int(mask.sum()))

    torch.manual_seed(0)
    return Scoring(
        dataset.num_features,
        dataset.num_classes,
        conv=conv,
        hidden=hidden,
        num_layers=layers,
        dropout=dropout,
        lr=lr,
        metric=dataset.metric,
    )


def run(args, dataset, mode: str, workdir: Path) -> dict[str, Any]:
    from lightning_mqgnn.fullgraph import FullGraphDataModule

    pl.seed_everything(args.seed, verbose=False)
    module = scoring_module(args.model, args.hidden, args.layers, args.dropout, args.lr, dataset)
    out = workdir / f"{dataset.name}_{mode}.json"
    strategy = make_strategy(
        mode, args.latency_ms / 1e3, args.bandwidth_gbit * 1e9 / 8, args.seed, args.smoothing
    )
    trainer = quiet_trainer(args.world, strategy, args, [Recorder(out)])
    book = workdir / f"{dataset.name}_{args.world}.book"
    trainer.fit(module, datamodule=FullGraphDataModule(dataset, module.aggregation, book_path=str(book)))
    return summarise(json.loads(out.read_text()))


def plot(results: dict[str, dict[str, dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(4.5 * len(results), 3.6), squeeze=False)
    for ax, (name, modes) in zip(axes[0], results.items()):
        for mode, r in modes.items():
            ax.plot(range(1, len(r["losses"]) + 1), r["losses"], label=mode)
        ax.set_title(name)
        ax.set_xlabel("epoch")
        ax.set_ylabel("training loss")
        ax.set_yscale("log")
        ax.legend()
    save_figure(fig, path)


def save_figure(fig, path: Path) -> None:
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def add_run_arguments(p: argparse.ArgumentParser, *, epochs: int, hidden: int) -> None:
    """The options of both full-graph benchmarks: training, the simulated link, the outputs."""
    p.add_argument("--epochs", type=int, default=epochs)
    p.add_argument("--val-every", type=int, default=5)
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--hidden", type=int, default=hidden)
    p.add_argument("--dropout", type=float, default=0.5)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--latency-ms", type=float, default=1.0)
    p.add_argument("--bandwidth-gbit", type=float, default=1.0)
    p.add_argument("--products-scale", type=float, default=0.01, help="products_like nodes: 2.45M x scale")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--plot", type=Path, default=None)


def checked_modes(p: argparse.ArgumentParser, value: str, known) -> list[str]:
    """``--modes`` as a list, every name one of ``known`` (else an argparse error)."""
    modes = value.split(",")
    unknown = [m for m in modes if m not in known]
    if unknown:
        p.error(f"unknown modes {unknown}; expected {list(known)}")
    return modes


def one_thread_per_rank() -> None:
    """Ranks share the machine's cores: one thread each, as the timing runs were made."""
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--datasets", default="cora,amazon_photo,coauthor_physics,products_like")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--model", default="gcn", choices=["gcn", "sage"])
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--smoothing", type=float, default=0.8, help="stale modes: halo smoothing factor")
    add_run_arguments(p, epochs=200, hidden=256)
    args = p.parse_args(argv)
    modes = checked_modes(p, args.modes, MODES)
    one_thread_per_rank()
    results: dict[str, dict[str, dict]] = {}
    rows = [
        "| dataset | halo rows/rank | mode | epoch ms | x faster | bytes/epoch | x fewer | test | Δ test (points) | bits (last epochs) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.datasets.split(","):
            dataset = load_dataset(name, args.products_scale)
            print(dataset.summary(), flush=True)
            results[name] = {}
            for mode in modes:
                r = run(args, dataset, mode, Path(tmp))
                results[name][mode] = r
                print(
                    f"{name} {mode}: epoch {r['epoch_ms']:.1f} ms, {r['bytes_per_epoch']:.0f} B/epoch, "
                    f"test {r['test']:.4f} (best val {r['val']:.4f} at epoch {r['best_epoch']})",
                    flush=True,
                )
            base = results[name].get("graph_parallel")
            for mode, r in results[name].items():
                speed = base["epoch_ms"] / r["epoch_ms"] if base else float("nan")
                fewer = (
                    base["bytes_per_epoch"] / r["bytes_per_epoch"]
                    if base and r["bytes_per_epoch"]
                    else float("nan")
                )
                delta = 100 * (r["test"] - base["test"]) if base else float("nan")
                bits = (
                    ", ".join(f"{k} {v[-5:]}" for k, v in sorted(r["bits"].items()))
                    if mode == "pipeqs"
                    else ""
                )
                rows.append(
                    f"| {name} | {r['halo_rows']} | {mode} | {r['epoch_ms']:.1f} | {speed:.2f} | "
                    f"{r['bytes_per_epoch']:,.0f} | {fewer:.2f} | {r['test']:.4f} | {delta:+.2f} | {bits} |"
                )
    header = machine_header("fullgraph", argv)
    header.append(
        f"- {args.world} gloo ranks, METIS partitions, {args.model} {args.layers} layers x {args.hidden}, "
        f"dropout {args.dropout}, Adam lr {args.lr}, {args.epochs} epochs, seed {args.seed}, stale-halo "
        f"smoothing {args.smoothing}; SIMULATED link "
        f"{args.latency_ms} ms + {args.bandwidth_gbit} Gbit/s per message; epoch time: median from epoch 3, "
        "validation excluded; test at the best validation epoch"
    )
    write_report("Full-graph training: graph-parallel, PipeGCN, PipeQS", header, rows, args.out)
    if args.plot is not None:
        plot(results, args.plot)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
