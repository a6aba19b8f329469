"""Summarise the recipe's runs under a folder: ``mqgnn-summarize <folder> [--table test]`` (from a
clone: ``python recipes/summarize.py ...``).

Reads every ``result.json`` under the folder (a ``seeds=`` run, a ``-m`` sweep, or ``outputs/``),
pools the runs that differ only in their seed, prints one SUMMARY line per configuration (mean ±
sample std of each numeric RESULT field) and writes ``summary.csv`` and ``summary.json`` in the
folder; ``--table FIELD`` prints that field as a table of models by datasets. A ``-m`` sweep of
``mqgnn-train`` ends with the same summary of its folder (``SweepSummary``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig
from typing_extensions import override

from lightning_mqgnn.recipe.seed_runs import (
    Summary,
    find_results,
    group_by_configuration,
    summary_line,
    table,
    write_summaries,
)


def summarize_folder(folder: Path) -> list[Summary]:
    """The summaries of the runs under ``folder``, printed and written there; none without runs."""
    summaries = group_by_configuration(find_results(folder))
    if summaries:
        csv_file, json_file = write_summaries(summaries, folder)
        for summary in summaries:
            print(summary_line(summary), flush=True)
        runs, configs = sum(len(s.runs) for s in summaries), len(summaries)
        of = "1 configuration" if configs == 1 else f"{configs} configurations"
        print(f"{runs} runs of {of} summarised in {csv_file} and {json_file}", file=sys.stderr)
    return summaries


class SweepSummary(Callback):
    """At the end of a ``--multirun`` sweep, the summary of its jobs' runs in the sweep's folder."""

    @override
    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        summarize_folder(Path(config.hydra.sweep.dir))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="searched for result.json files, at any depth")
    parser.add_argument(
        "--table", action="append", default=[], metavar="FIELD", help="a RESULT field (test, val, ...)"
    )
    parser.add_argument("--decimals", type=int, help="in the tables (default: the std's two digits)")
    parser.add_argument("--out", type=Path, help="also write the tables to this file")
    args = parser.parse_args(argv)
    if not args.folder.is_dir():
        print(f"error: {args.folder}: no such folder", file=sys.stderr)
        return 2
    summaries = summarize_folder(args.folder)
    if not summaries:
        print(
            f"error: no result.json under {args.folder} (each run of mqgnn-train or recipes/train.py writes one)",
            file=sys.stderr,
        )
        return 2
    numeric = list(dict.fromkeys(name for s in summaries for name in s.spreads))
    lines = []
    for field in args.table:
        if field not in numeric:
            print(
                f"error: --table {field}: not a numeric field of these runs ({', '.join(numeric)})",
                file=sys.stderr,
            )
            return 2
        try:
            lines += ["", *table(summaries, field, args.decimals)]
        except ValueError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
    if lines:
        text = "\n".join(lines[1:]) + "\n"
        print(text, end="")
        if args.out is not None:
            args.out.write_text(text)
    return 0


def cli() -> None:
    """The ``mqgnn-summarize`` command (and ``recipes/summarize.py`` in a clone)."""
    sys.exit(main())


if __name__ == "__main__":
    cli()
