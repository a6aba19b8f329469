"""The recipe's loaders against each other, their fits alternating in one process.

    python recipes/bench.py loaders --data products_like_200k --model sage --rounds 8

Each round trains the same recipe configuration once per loader (``loader=sequential``,
``loader=pipeline``, ...), in an order that rotates from round to round, by calling
``recipes/train.py``'s ``train`` in this process: early stopping off, one validation per epoch, no
progress bar, as ``bench grid`` runs them. On a VM whose speed drifts within minutes and differs
between processes by up to half, fits run in separate processes compare machines as much as
loaders; fits side by side in one process compare the loaders. Reports each loader's epoch time
(training time over epochs, validation left out), each round's ratio to the first loader, their
median and how many rounds each loader won, and who produced the pipelined batches.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import os
import statistics
import tempfile
from pathlib import Path

from benchmarks._recipe import epoch_seconds, fixed_epochs_overrides, recipe_config, result_fields
from benchmarks._report import machine_header, write_report


def fit_once(data: str, model: str, loader: str, seed: int, epochs: int, extra: list[str], root: str) -> dict:
    """One ``train`` of the recipe with ``loader``; its RESULT fields, printed output swallowed."""
    from lightning_mqgnn.recipe.train import train

    overrides = [
        f"data={data}",
        f"model={model}",
        f"loader={loader}",
        f"seed={seed}",
        *fixed_epochs_overrides(epochs),
        f"trainer.default_root_dir={root}",
        *extra,
    ]
    cfg = recipe_config(overrides)
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            train(cfg)
    finally:
        # train() freezes the heap before fitting, for a process that fits once; here the next fit
        # would otherwise run beside every earlier fit's dataset, model and trainer, never collected
        gc.unfreeze()
        gc.collect()
    fields = result_fields(printed.getvalue())
    if fields is None:
        raise RuntimeError(f"loader={loader}: the fit printed no RESULT line")
    fields["epoch_time_s"] = epoch_seconds(fields)
    return fields


def rotated(items: list[str], shift: int) -> list[str]:
    shift %= len(items)
    return items[shift:] + items[:shift]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.py loaders", description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="products_like_200k")
    parser.add_argument("--model", default="sage")
    parser.add_argument("--loaders", default="sequential,pipeline", help="the first is the reference")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--extra", default="", help="more recipe overrides, space separated")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    loaders = args.loaders.split(",")
    if len(loaders) < 2:
        parser.error("--loaders needs two loaders or more")
    runs: dict[str, list[dict]] = {name: [] for name in loaders}
    with tempfile.TemporaryDirectory() as root:
        for r in range(args.rounds):
            for name in rotated(loaders, r):
                fit_root = os.path.join(root, f"round{r}_{name}")  # a checkpoint folder of its own
                runs[name].append(
                    fit_once(
                        args.data, args.model, name, args.seed, args.epochs, args.extra.split(), fit_root
                    )
                )
    reference = loaders[0]
    table = [
        f"| loader | epoch s (median of {args.rounds}) | epoch s, round by round | "
        f"{reference} / loader (median) | rounds faster than {reference} | producer |",
        "|---|---|---|---|---|---|",
    ]
    for name in loaders:
        times = [run["epoch_time_s"] for run in runs[name]]
        ratios = [ref["epoch_time_s"] / run["epoch_time_s"] for ref, run in zip(runs[reference], runs[name])]
        producers = sorted({run.get("producer", "-") for run in runs[name]})
        table.append(
            f"| {name} | {statistics.median(times):.3f} | {', '.join(f'{t:.3f}' for t in times)} | "
            f"{statistics.median(ratios):.3f}x | {sum(x > 1 for x in ratios)} of {len(ratios)} | "
            f"{', '.join(producers)} |"
        )
    header = machine_header("loaders", argv)
    header.insert(1, f"- data {args.data}, model {args.model}, {args.epochs} epochs a fit, seed {args.seed}")
    write_report("The recipe's loaders, fits alternating in one process", header, table, args.out)
    return 0
