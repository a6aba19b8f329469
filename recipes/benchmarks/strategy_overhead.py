"""Benchmark: epoch time of MQGNNStrategy(staleness=0) against Lightning's DDPStrategy, 2 gloo ranks, one run.

At staleness 0 the strategy wraps the model in DistributedDataParallel exactly as DDPStrategy does, so
the ratio should be 1 (target <= 1.05). Staleness 1 (the gradient queue) is listed for reference. The
strategies alternate within every round (order reversed every other round) so that the load of a shared
machine falls on all of them alike; each cell is the median epoch time over rounds and timed epochs, mean
over both ranks. A measurement, not a test: nothing here asserts timings.

    python recipes/bench.py strategy_overhead --out bench_out/strategy_overhead.md
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

CONFIGS = {"DDPStrategy": None, "mqgnn s=0": 0, "mqgnn s=1": 1}  # name: staleness (None: plain DDP)


# ----------------------------------------------------------------------------- worker side (2 processes)
def _run_worker(args: argparse.Namespace) -> None:
    import lightning.pytorch as pl
    from lightning.pytorch.strategies import DDPStrategy

    from lightning_mqgnn.strategy import MQGNNStrategy

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: find benchmarks/
    from benchmarks.strategy import fit_mlp

    torch.set_num_threads(1)

    class EpochClock(pl.Callback):
        def __init__(self) -> None:
            self.seconds: list[float] = []
            self.wrapper = ""
            self._start = 0.0

        def on_train_start(self, trainer, pl_module):
            self.wrapper = type(trainer.model).__name__  # Lightning unwraps it again after fit

        def on_train_epoch_start(self, trainer, pl_module):
            self._start = time.perf_counter()

        def on_train_epoch_end(self, trainer, pl_module):
            self.seconds.append(time.perf_counter() - self._start)

    world = 2
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.batches * args.batch_size * world, args.features, generator=g)
    y = torch.randint(0, 10, (x.shape[0],), generator=g)
    out_dir = Path(args.worker_out)
    names = list(CONFIGS)
    for round_ in range(args.rounds):
        for name in names if round_ % 2 == 0 else names[::-1]:
            staleness = CONFIGS[name]
            pl.seed_everything(0, verbose=False)
            strategy = (
                DDPStrategy() if staleness is None else MQGNNStrategy(staleness=staleness, sync_period=20)
            )
            clock = EpochClock()
            trainer = fit_mlp(strategy, world, clock, args, x, y, max_epochs=args.epochs)
            record = {
                "config": name,
                "round": round_,
                "rank": trainer.global_rank,
                "epoch_s": clock.seconds[1:],  # the first epoch warms up
                "wrapper": clock.wrapper,
            }
            tag = f"{name.replace(' ', '_').replace('=', '')}_r{round_}_rank{trainer.global_rank}"
            (out_dir / f"{tag}.json").write_text(json.dumps(record))
            trainer.strategy.barrier()


# ----------------------------------------------------------------------------- driver
def _table(records: list[dict]) -> list[str]:
    def median_epoch(config: str) -> float:
        per_rank: dict[int, list[float]] = {}
        for r in records:
            if r["config"] == config:
                per_rank.setdefault(r["rank"], []).extend(r["epoch_s"])
        return statistics.mean(statistics.median(v) for v in per_rank.values())

    base = median_epoch("DDPStrategy")
    wrappers = {r["config"]: r["wrapper"] for r in records}
    lines = [
        "| strategy | trainer.model | epoch time (s) | ratio to DDPStrategy |",
        "|---|---|---|---|",
    ]
    for config in CONFIGS:
        t = median_epoch(config)
        lines.append(f"| {config} | {wrappers[config]} | {t:.3f} | {t / base:.3f} |")
    return lines


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=None, help="write the markdown report here")
    parser.add_argument("--epochs", type=int, default=4, help="epochs per fit (the first is not timed)")
    parser.add_argument("--batches", type=int, default=40, help="batches per epoch and rank")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--features", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--worker-out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for field in ("batches", "batch_size", "features", "hidden", "rounds"):
        if getattr(args, field) < 1:
            parser.error(f"--{field.replace('_', '-')} must be >= 1, got {getattr(args, field)}")
    if args.epochs < 2:
        parser.error(f"--epochs must be >= 2 (the first epoch is not timed), got {args.epochs}")
    if args.worker_out is not None:  # inside the two Lightning processes
        _run_worker(args)
        return ""
    forwarded = list(argv if argv is not None else sys.argv[1:])
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, os.path.abspath(__file__), *forwarded, "--worker-out", tmp]
        subprocess.run(cmd, check=True, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=3600)
        records = [json.loads(p.read_text()) for p in sorted(Path(tmp).glob("*.json"))]
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from benchmarks._report import machine_header, write_report

    header = machine_header("strategy_overhead", argv)
    header.append(
        f"- 2 CPU processes (gloo), MLP {args.features}-{args.hidden}-{args.hidden}-10, batch "
        f"{args.batch_size}/rank, Adam, {args.batches} batches/epoch, {args.epochs - 1} timed epochs x "
        f"{args.rounds} rounds; median epoch time per rank, mean over ranks"
    )
    return write_report(
        "MQGNNStrategy(staleness=0) vs DDPStrategy: epoch time", header, _table(records), args.out
    )


if __name__ == "__main__":
    main()
