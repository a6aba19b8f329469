"""What the other systems' training loops in the benchmarks share (DGL's, PyG's): the dataset a
name stands for, the metric on a split, and the outer loop that trains epoch by epoch, validates
after each one with exact inference and records the wall clock at every validation, so their
time-to-accuracy curves are read the same way as the recipe's ``time/wall_s``.

Nothing here imports DGL or PyG: each environment runs its own loop on top.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from torch import Tensor

from benchmarks._recipe import recipe_config
from lightning_mqgnn.graph.dataset import GraphDataset
from lightning_mqgnn.graph.generated import generate_graph
from lightning_mqgnn.graph.npz import load_npz
from lightning_mqgnn.graph.registry import dataset_file
from lightning_mqgnn.models.metrics import make_metric, metric_input
from lightning_mqgnn.recipe import CONF

REPO = Path(__file__).resolve().parents[2]
TRIM = 20  # the paper drops the first and last 20 batch timings


def trimmed_mean(times: Sequence[float], trim: int = TRIM) -> float:
    """Mean batch time without the first and last ``trim`` batches (all of them when too few)."""
    kept = list(times[trim : len(times) - trim]) if len(times) > 2 * trim else list(times)
    return sum(kept) / len(kept) if kept else float("nan")


def load_dataset(spec: str, scale: float = 1.0, seed: int = 0) -> GraphDataset:
    """``NAME`` of a Hydra data config (``lightning_mqgnn/conf/data/NAME.yaml``: the very loader call, feature
    reduction included, that ``recipes/train.py data=NAME`` makes, so every system trains on
    identical features), a path to an ``.npz`` (``load_npz`` defaults), or ``generated:PRESET``."""
    if spec.startswith("generated:"):
        return generate_graph(spec.split(":", 1)[1], scale=scale, seed=seed)
    if (CONF / "data" / f"{spec}.yaml").exists():
        return load_data_config(spec)
    path = Path(spec)
    if path.suffix != ".npz":
        path = dataset_file(spec)  # a registered dataset: the mirror, the cache or a download
    return load_npz(path)


def load_data_config(name: str) -> GraphDataset:
    from hydra.utils import instantiate

    return instantiate(recipe_config([f"data={name}"]).data)


def split_scores(logits: Tensor, dataset: GraphDataset, splits: Sequence[Tensor]) -> list[float]:
    """The dataset's metric (accuracy, micro-F1 or ROC-AUC) of full-graph ``logits`` on each split."""
    scores = []
    for idx in splits:
        metric = make_metric(dataset.metric, dataset.num_classes, dataset.multilabel)
        metric.update(metric_input(logits[idx], dataset.metric, dataset.multilabel), dataset.labels[idx])
        scores.append(float(metric.compute()))
    return scores


def peak_rss_mb() -> float:
    """This process's peak resident set size in MB (``VmHWM``), data loading included."""
    match = re.search(r"^VmHWM:\s+(\d+)\s+kB", Path("/proc/self/status").read_text(), re.MULTILINE)
    return int(match.group(1)) / 1024 if match else float("nan")


@dataclass
class Curve:
    """One fit, epoch by epoch: training seconds of each epoch (validation excluded), and at each
    validation the metric on both splits and the seconds since training started, with (``wall_s``)
    and without (``train_s``) the time validation took."""

    epoch_times: list[float] = field(default_factory=list)
    val_scores: list[float] = field(default_factory=list)
    test_scores: list[float] = field(default_factory=list)
    wall_s: list[float] = field(default_factory=list)
    train_s: list[float] = field(default_factory=list)

    def summary(self) -> dict:
        """The curve with its best-validation epoch (the first reaching the best) and that
        epoch's test metric."""
        best = max(range(len(self.val_scores)), key=lambda e: self.val_scores[e])
        return {
            **asdict(self),
            "epochs": len(self.epoch_times),
            "train_time": sum(self.epoch_times),
            "best_epoch": best,
            "best_val": self.val_scores[best],
            "test_metric": self.test_scores[best],
        }


def fit_epochs(
    train_epoch: Callable[[], None],
    validate: Callable[[], tuple[float, float]],
    epochs: int,
    max_time_s: float | None = None,
) -> Curve:
    """Train ``epochs`` epochs, or fewer when ``max_time_s`` seconds of wall time (validation
    included) have passed at an epoch's end; ``validate()`` returns (val, test) after every epoch."""
    if epochs < 1:
        raise ValueError(f"epochs must be at least 1, got {epochs}")
    curve = Curve()
    start = time.perf_counter()
    validation_s = 0.0
    for _ in range(epochs):
        t_epoch = time.perf_counter()
        train_epoch()
        t_val = time.perf_counter()
        curve.epoch_times.append(t_val - t_epoch)
        val, test = validate()
        now = time.perf_counter()
        validation_s += now - t_val
        curve.val_scores.append(val)
        curve.test_scores.append(test)
        curve.wall_s.append(now - start)
        curve.train_s.append(now - start - validation_s)
        if max_time_s is not None and now - start >= max_time_s:
            break
    return curve


def loop_arguments(parser: argparse.ArgumentParser) -> None:
    """The command-line options every baseline loop takes (``--data`` ... ``--json``)."""
    parser.add_argument("--data", default="cora", help="shared dataset name, .npz path or generated:PRESET")
    parser.add_argument("--scale", type=float, default=1.0, help="generated graphs only")
    parser.add_argument("--model", choices=("sage", "gcn"), default="sage")
    parser.add_argument("--fanouts", type=int, nargs="+", default=[5, 5])
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument(
        "--max-time-s",
        type=float,
        help="end at the first epoch's end past this many seconds (with validation)",
    )
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's choice)")
    parser.add_argument("--json", type=Path, help="write the full result (with per-batch times) here")


def report(result: dict, dataset: GraphDataset, json_path: Path | None) -> None:
    """A baseline fit's one summary line, and its full result as JSON at ``json_path`` when given."""
    epoch = sum(result["epoch_times"]) / len(result["epoch_times"])
    print(
        f"{result['system']}-{result['model']} {dataset.name}: {result['batches_per_epoch']} batches/epoch, "
        f"batch {1e3 * result['batch_time_trimmed']:.2f} ms (trimmed {TRIM}), epoch {epoch:.3f} s, train "
        f"{result['train_time']:.2f} s, best epoch {result['best_epoch']}: val {result['best_val']:.4f}, "
        f"test {dataset.metric} {result['test_metric']:.4f}",
        flush=True,
    )
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(result, indent=1))
