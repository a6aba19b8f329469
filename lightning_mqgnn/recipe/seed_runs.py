"""Runs of the recipe that differ only in their seed: the seeds ``seeds=`` asks for, each run's
``result.json``, and the summary of runs of one configuration (``summary.csv``, ``summary.json``,
the ``SUMMARY`` line, a table of models by datasets). Plain Python, without Hydra:
``mqgnn-train`` writes these files and ``mqgnn-summarize`` reads them back."""

from __future__ import annotations

import csv
import json
import math
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from lightning_mqgnn.recipe.seed_stats import Spread, format_spread, spread

RESULT_FILE = "result.json"
SUMMARY_CSV = "summary.csv"
SUMMARY_JSON = "summary.json"
MAX_SEED = 2**32 - 1  # the largest seed numpy (and so Lightning's seed_everything) takes
# overrides that say where a run writes and what it shows, not what it trains: runs that differ
# only in these (and hydra.*) are runs of one configuration
NOT_CONFIGURATION = ("seed", "seeds", "ckpt_path", "trainer.default_root_dir", "trainer.enable_progress_bar")

Value = int | float | str


def seed_folder(seed: int) -> str:
    """The folder of a seed's run inside the folder of a ``seeds=`` run."""
    return f"seed_{seed}"


def seeds_as_list(argv: Sequence[str]) -> list[str]:
    """``seeds=0,1,2`` and ``seeds=range(3)`` written as the list ``seeds=[0,1,2]``: Hydra takes a
    comma or ``range`` for a sweep, which it refuses without ``--multirun`` and with it would make
    one job per seed. ``seeds=`` is always one job that runs every seed (``-m seed=0,1,2`` sweeps)."""
    out = []
    for arg in argv:
        key, _, value = arg.partition("=")
        if key.lstrip("+") == "seeds":
            bounds = re.fullmatch(r"range\(\s*(-?\d+)\s*(?:,\s*(-?\d+)\s*)?(?:,\s*(-?\d+)\s*)?\)", value)
            if bounds and bounds.group(3) != "0":
                seeds = range(*(int(b) for b in bounds.groups() if b is not None))
                arg = f"{key}=[{','.join(str(s) for s in seeds)}]"
            elif "," in value and not value.startswith(("[", "'", '"')):
                arg = f"{key}=[{value}]"
        out.append(arg)
    return out


def seed_list(value: object) -> list[int] | None:
    """The seeds of ``seeds=`` (None: not given, one run of ``seed``), each a whole number numpy
    takes and none twice (their runs would share a folder); a ``ValueError`` names a bad value."""
    if value is None:
        return None
    if isinstance(value, str):
        value = [int(v) if re.fullmatch(r"\s*\d+\s*", v) else v.strip() for v in value.split(",")]
    if not isinstance(value, (list, tuple)):
        raise ValueError(
            f"seeds={value}: give a list of seeds (seeds=0,1,2 or 'seeds=range(10)'); seed={value} runs one seed"
        )
    given = ",".join(str(v) for v in value)
    if not value:
        raise ValueError("seeds=[]: give at least one seed (seeds=0,1,2 or 'seeds=range(10)')")
    for v in value:
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_SEED:
            raise ValueError(f"seeds={given}: a seed is a whole number from 0 to {MAX_SEED}, not {v!r}")
    twice = next((v for i, v in enumerate(value) if v in value[:i]), None)
    if twice is not None:
        raise ValueError(f"seeds={given}: seed {twice} is given twice (its runs would share a folder)")
    return list(value)


def configuration(overrides: Iterable[str]) -> tuple[str, ...]:
    """The command-line overrides that decide what a run trains, sorted: those of every run of
    one configuration, whatever its seed, folder or the order the overrides were given in."""
    kept = []
    for override in overrides:
        key = override.split("=", 1)[0].lstrip("+~")
        if key not in NOT_CONFIGURATION and key != "hydra" and not key.startswith("hydra."):
            kept.append(override)
    return tuple(sorted(kept))


def typed(text: str) -> Value:
    """A RESULT value as a number where it is one (``nan`` too), else the text (``sage``,
    ``auto:2``, one figure per rank ``521/518``)."""
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    try:
        return float(text)
    except ValueError:
        return text


def result_fields(line: str) -> dict[str, Value]:
    """The ``key=value`` fields of a ``RESULT ...`` line, numbers as numbers."""
    return {key: typed(value) for key, _, value in (item.partition("=") for item in line.split()[1:])}


@dataclass(frozen=True)
class RunResult:
    """One run: its seed, configuration (``configuration``), RESULT fields (numbers at the
    precision the recipe computed them) and the folder it wrote its checkpoints and logs to."""

    seed: int
    config: tuple[str, ...]
    fields: dict[str, Value]
    folder: Path


def _json_value(value: Value) -> Value | None:
    """NaN and infinities as JSON's null: strict JSON has no NaN."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def write_result(run: RunResult) -> Path:
    """``<folder>/result.json``, whole or not at all (a summary or a resumed ``seeds=`` run reads it)."""
    path = run.folder / RESULT_FILE
    text = json.dumps(
        {
            "seed": run.seed,
            "config": list(run.config),
            "result": {k: _json_value(v) for k, v in run.fields.items()},
        },
        indent=2,
        allow_nan=False,
    )
    run.folder.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text + "\n")
    os.replace(partial, path)
    return path


def read_result(path: Path) -> RunResult:
    """A ``result.json`` as ``write_result`` wrote it (null read back as NaN)."""
    data = json.loads(path.read_text())
    fields = {k: math.nan if v is None else v for k, v in data["result"].items()}
    return RunResult(int(data["seed"]), tuple(data["config"]), fields, path.parent)


def find_results(root: Path) -> list[RunResult]:
    """Every run under ``root`` (each ``result.json``), in the order of their folders."""
    return [read_result(path) for path in sorted(root.rglob(RESULT_FILE))]


@dataclass(frozen=True)
class Summary:
    """Runs of one configuration: the spread of each numeric field that every run has, and the
    text fields that every run shares (``model``, ``data``)."""

    config: tuple[str, ...]
    runs: tuple[RunResult, ...]
    spreads: dict[str, Spread]
    shared: dict[str, str]

    @property
    def seeds(self) -> list[int]:
        return [run.seed for run in self.runs]


def field_names(runs: Iterable[RunResult]) -> list[str]:
    """Every field of ``runs``, in the order they first appear (the RESULT line's)."""
    return list(dict.fromkeys(name for run in runs for name in run.fields))


def summarize(runs: Sequence[RunResult]) -> Summary:
    """The summary of ``runs``, which must share one configuration."""
    configs = {run.config for run in runs}
    if len(configs) != 1:
        raise ValueError(f"runs of {len(configs)} configurations cannot be summarised together")
    spreads: dict[str, Spread] = {}
    shared: dict[str, str] = {}
    for name in field_names(runs):
        values = [run.fields.get(name) for run in runs]
        if all(isinstance(v, (int, float)) for v in values):
            spreads[name] = spread([float(v) for v in values])  # type: ignore[arg-type]
        elif all(isinstance(v, str) for v in values) and len(set(values)) == 1:
            shared[name] = str(values[0])
    return Summary(configs.pop(), tuple(runs), spreads, shared)


def group_by_configuration(runs: Iterable[RunResult]) -> list[Summary]:
    """One summary per configuration, in the order each first appears."""
    groups: dict[tuple[str, ...], list[RunResult]] = {}
    for run in runs:
        groups.setdefault(run.config, []).append(run)
    return [summarize(group) for group in groups.values()]


def summary_line(summary: Summary) -> str:
    """``SUMMARY n=3 seeds=0,1,2 model=sage ... val=0.9211 ± 0.0021 ...``: the fields of the
    RESULT line, each numeric one as mean ± sample std."""
    fields = [f"n={len(summary.runs)}", f"seeds={','.join(str(s) for s in summary.seeds)}"]
    for name in field_names(summary.runs):
        if name in summary.shared:
            fields.append(f"{name}={summary.shared[name]}")
        elif name in summary.spreads:
            fields.append(f"{name}={format_spread(summary.spreads[name])}")
    return "SUMMARY " + " ".join(fields)


def _folder_name(folder: Path, root: Path) -> str:
    return os.path.relpath(folder, root) if folder.is_absolute() == root.is_absolute() else str(folder)


def _csv_value(value: Value | None) -> str | int | float:
    return "" if value is None else value


def write_summaries(summaries: Sequence[Summary], root: Path) -> tuple[Path, Path]:
    """``<root>/summary.csv`` and ``<root>/summary.json``: for each configuration, every run (its
    seed, folder relative to ``root`` and fields), then the mean and the sample std of each
    numeric field (in the csv, rows ``mean`` and ``std``; the text fields the runs share stand in
    the ``mean`` row)."""
    root.mkdir(parents=True, exist_ok=True)
    names = field_names(run for s in summaries for run in s.runs)
    csv_path = root / SUMMARY_CSV
    with csv_path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["row", "config", "seed", "folder", "n", *names])
        for s in summaries:
            config, n = " ".join(s.config), len(s.runs)
            for run in s.runs:
                cells = [_csv_value(run.fields.get(name)) for name in names]
                writer.writerow(["run", config, run.seed, _folder_name(run.folder, root), "", *cells])
            mean = [s.spreads[k].mean if k in s.spreads else s.shared.get(k, "") for k in names]
            writer.writerow(["mean", config, "", "", n, *mean])
            writer.writerow(
                ["std", config, "", "", n, *(s.spreads[k].std if k in s.spreads else "" for k in names)]
            )
    groups = [
        {
            "config": list(s.config),
            "n": len(s.runs),
            "seeds": s.seeds,
            "shared": s.shared,
            "mean": {k: _json_value(v.mean) for k, v in s.spreads.items()},
            "std": {k: _json_value(v.std) for k, v in s.spreads.items()},
            "text": {k: format_spread(v) for k, v in s.spreads.items()},
            "runs": [
                {
                    "seed": run.seed,
                    "folder": _folder_name(run.folder, root),
                    "result": {k: _json_value(v) for k, v in run.fields.items()},
                }
                for run in s.runs
            ],
        }
        for s in summaries
    ]
    json_path = root / SUMMARY_JSON
    json_path.write_text(json.dumps({"groups": groups}, indent=2, allow_nan=False) + "\n")
    return csv_path, json_path


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def table(summaries: Sequence[Summary], field: str, decimals: int | None = None) -> list[str]:
    """A markdown table of ``field`` as papers give accuracy: a row per model (with whatever else
    its configuration sets besides the dataset), a column per dataset, mean ± sample std in each
    cell, and the number of runs below (in a cell where it differs)."""
    rows: list[str] = []
    columns: list[str] = []
    cells: dict[tuple[str, str], tuple[Summary, Spread | None]] = {}
    for s in summaries:
        beside = [o for o in s.config if _key(o) not in ("model", "data") and not _key(o).startswith("data.")]
        row, column = " ".join([s.shared.get("model", "?"), *beside]), s.shared.get("data", "?")
        if (row, column) in cells:
            other = cells[row, column][0]
            raise ValueError(
                f"two configurations fall in one cell ({row} on {column}): "
                f"{' '.join(other.config) or '(defaults)'} and {' '.join(s.config) or '(defaults)'}"
            )
        cells[row, column] = (s, s.spreads.get(field))
        rows += [row] if row not in rows else []
        columns += [column] if column not in columns else []
    counts = {len(s.runs) for s, _ in cells.values()}
    usual = max(counts, key=lambda n: sum(len(s.runs) == n for s, _ in cells.values()))

    def cell(row: str, column: str) -> str:
        if (row, column) not in cells:
            return ""
        s, value = cells[row, column]
        text = "-" if value is None else format_spread(value, decimals)
        return text if len(s.runs) == usual else f"{text} (n={len(s.runs)})"

    lines = [
        f"| {field} | {' | '.join(columns)} |",
        f"|---|{'---|' * len(columns)}",
        *(f"| {row} | {' | '.join(cell(row, c) for c in columns)} |" for row in rows),
        "",
        f"Mean ± sample standard deviation over {usual} runs (seeds) per cell.",
    ]
    return lines
