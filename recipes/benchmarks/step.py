"""The training step against its GEMM floor, in a bare loop and in the recipe's Lightning loop.

    python recipes/bench.py step --data products_like_200k --model sage --batch-size 1024 --steps 40
    python recipes/bench.py step --data products_like_200k --model gcn --device cuda

Batches are sampled and gathered once, before timing, with the recipe's own data and model
configs (``lightning_mqgnn/conf/data``, ``lightning_mqgnn/conf/model``), so the step (forward, backward, optimiser, per-step
overhead) is all that is measured. Two loops train on the same batches:
- ``bare``: ``zero_grad``, ``training_step``, ``backward``, ``step`` in a Python loop;
- ``trainer``: ``lightning.Trainer.fit`` with the recipe's callbacks, logger and progress bar.
Each loop runs twice, on a heap frozen as ``train.py`` freezes it before its fit: once timed
(median wall time per step), once under ``torch.profiler``, whose
per-operator self time (CPU time on CPU, kernel time on CUDA; the scopes named ``mqgnn::`` of the
compiled CPU loops count as operators) is sorted into GEMM (``mm``, ``addmm``, ``bmm``: the
floor), aggregation, elementwise, RNG, copies and the optimiser; on CPU
"rest" is the wall time no operator accounts for (Python, hooks, logging), on CUDA "host" is the
wall time the GPU is not running a kernel, beside the share of the step it is ("kernels / step")
and the host syncs a step makes (CUDA's sync debug mode). ``step / floor`` is the timed step over
GEMM time. On CUDA the kernels are counted by themselves (GEMM: the kernels named so), so steps
replayed from CUDA graphs (``--cuda-graphs``), whose kernels no operator launches, count too; the
per-operator columns are then empty.
Steps are timed start to start without a synchronisation each, so on CUDA a step's time is the
pace of the slower of host and device, as in training.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Iterable
from functools import partial
from pathlib import Path

import lightning.pytorch as pl
import torch
from hydra.utils import instantiate
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

from benchmarks._cuda_graphs import CUDA_GRAPHS_HELP, cuda_graph_modes
from benchmarks._recipe import recipe_config
from benchmarks._report import attempt, exit_status, machine_header, write_report
from benchmarks._sync_census import cuda_sync_count
from lightning_mqgnn.pipeline.produce import produce_batch
from lightning_mqgnn.pipeline.schedule import epoch_batches
from lightning_mqgnn.sampling.rng import batch_rng_seed

REPO = Path(__file__).resolve().parents[2]
TRAINING_STEP = "training_step"
OPTIMISER_SCOPE = "bench::optimizer."  # the scopes scoped_training_step opens around the optimiser
CATEGORIES = ("gemm", "aggregation", "elementwise", "rng", "copy", "optimiser")
GEMM = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addmv", "aten::mv"}
AGGREGATION = (
    "embedding_bag",
    "argsort",
    "aten::sort",
    "bincount",
    "repeat_interleave",
    "cumsum",
    "aggregation",
)
RNG = ("random_", "uniform_", "bernoulli", "normal_", "randint", "rand")
COPY = ("copy_", "aten::to", "_to_copy", "contiguous", "clone", "aten::cat", "index_select")
GEMM_KERNELS = ("gemm", "cutlass", "cublas")  # how GEMM kernels are named (cuBLAS, CUTLASS)


def category(name: str, under_optimiser: bool) -> str:
    if under_optimiser:
        return "optimiser"
    if name in GEMM:
        return "gemm"
    if any(key in name for key in AGGREGATION):
        return "aggregation"
    if any(key in name for key in RNG):
        return "rng"
    if any(key in name for key in COPY):
        return "copy"
    return "elementwise"


def under_optimiser(event) -> bool:
    """Whether the nearest enclosing scope of ``event`` is the optimiser's own work: Lightning runs
    the forward and backward inside ``optimizer.step(closure)``, so those scopes are closer."""
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith(("Optimizer.step", "Optimizer.zero_grad", OPTIMISER_SCOPE)):
            return True
        if parent.name.startswith(("autograd::engine", TRAINING_STEP)):
            return False
        parent = parent.cpu_parent
    return False


def split_by_category(events: Iterable, cuda: bool) -> dict[str, float]:
    """Seconds of operator self time per category, over ``events`` of one profile."""
    totals: dict[str, float] = defaultdict(float)
    for event in events:
        if not event.name.startswith(("aten::", "mqgnn::")):  # operators, and our compiled loops
            continue
        self_us = event.self_device_time_total if cuda else event.self_cpu_time_total
        totals[category(event.name, under_optimiser(event))] += self_us * 1e-6
    return totals


def kernel_seconds(events: Iterable) -> tuple[float, float]:
    """Seconds of every device kernel and copy, and of the GEMM kernels, over ``events`` of a CUDA
    profile, read from the kernels themselves: those a CUDA graph replays have no operator."""
    total = gemm = 0.0
    for event in events:
        # user annotations (``record_function`` scopes) have a device span too: not kernels
        if event.device_type != DeviceType.CUDA or event.is_user_annotation:
            continue
        seconds = event.self_device_time_total * 1e-6
        total += seconds
        if any(key in event.name.lower() for key in GEMM_KERNELS):
            gemm += seconds
    return total, gemm


def scoped_training_step(module):
    """``module`` with its ``training_step`` inside a profiler scope of that name, and its
    optimiser's ``step`` and ``zero_grad`` inside scopes of theirs (``FusedAdam`` opens none, to
    spare a step the cost of one)."""
    configure = module.configure_optimizers

    def configure_optimizers():
        optimizer = configure()
        for name in ("step", "zero_grad"):
            setattr(optimizer, name, _scoped(getattr(optimizer, name), f"{OPTIMISER_SCOPE}{name}"))
        return optimizer

    module.training_step = _scoped(module.training_step, TRAINING_STEP)
    module.configure_optimizers = configure_optimizers
    return module


def _scoped(method, name: str):
    def scoped(*args, **kwargs):
        with record_function(name):
            return method(*args, **kwargs)

    return scoped


def recipe_objects(data: str, model: str, extra: list[str], dataset=None):
    """Dataset, sampler, LightningModule factory and loader config, exactly as ``recipes/train.py``
    builds them (``dataset``: one already built from the same data config, reused; the factory's
    ``cuda_graphs``: the module's steps replayed from CUDA graphs)."""
    from lightning_mqgnn.recipe.train import build_sampler

    cfg = recipe_config([f"data={data}", f"model={model}", *extra])
    if dataset is None:
        dataset = instantiate(cfg.data)
    sampler = build_sampler(instantiate(cfg.model.sampler), dataset)

    def make_module(cuda_graphs: bool = False):
        pl.seed_everything(cfg.seed)
        return instantiate(cfg.model.module)(
            in_dim=dataset.num_features,
            num_classes=dataset.num_classes,
            metric=dataset.metric,
            multilabel=dataset.multilabel,
            **({"cuda_graphs": True} if cuda_graphs else {}),
        )

    return dataset, sampler, make_module, cfg


def sample_batches(dataset, sampler, cfg, batch_size: int, steps: int, device: torch.device) -> list:
    """``steps`` batches made as the recipe's loader config makes them."""
    seed = cfg.seed
    aggregation = sampler.aggregation if cfg.loader.get("aggregate_inputs") else None
    seeds = epoch_batches(dataset.train_idx, batch_size, 0, seed=seed)
    while len(seeds) < steps:
        seeds = seeds + seeds
    out = []
    for i, s in enumerate(seeds[:steps]):
        with torch.random.fork_rng(devices=[]):
            batch = produce_batch(
                sampler, s, dataset.features, dataset.labels, batch_rng_seed(seed, 0, i), i, None, aggregation
            )
        out.append(batch.to(device))
    return out


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bare_loop(module, batches: list, device: torch.device) -> list[float]:
    """Time between the starts of consecutive steps of a plain PyTorch loop over ``batches``.

    No synchronisation per step: on CUDA the host runs ahead until the device's queue pushes
    back, so in steady state these intervals are the pace of whichever side is slower."""
    module.to(device).train()
    opt = module.configure_optimizers()
    sync(device)
    starts = []
    for i, batch in enumerate(batches):
        starts.append(time.perf_counter())
        opt.zero_grad(set_to_none=True)
        loss = module.training_step(batch, i)
        loss.backward()
        opt.step()
    sync(device)
    starts.append(time.perf_counter())
    return [b - a for a, b in zip(starts, starts[1:])]


class _StepClock(pl.Callback):
    """Time from one training batch's start to the next one's (the trainer's whole step), with no
    synchronisation per step, as in ``bare_loop``."""

    def __init__(self):
        self.starts: list[float] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if not self.starts:
            sync(pl_module.device)
        self.starts.append(time.perf_counter())

    def on_train_end(self, trainer, pl_module) -> None:
        sync(pl_module.device)
        self.starts.append(time.perf_counter())

    def times(self) -> list[float]:
        return [b - a for a, b in zip(self.starts, self.starts[1:])]


def trainer_loop(module, batches: list, device: torch.device, cfg) -> list[float]:
    """Wall time of each step of ``Trainer.fit`` with the recipe's trainer config and callbacks."""
    from lightning_mqgnn.recipe.train import recipe_callbacks

    clock = _StepClock()
    strategy = instantiate(cfg.strategy) if "_target_" in cfg.strategy else cfg.strategy.name
    trainer = instantiate(
        cfg.trainer,
        accelerator=device.type,
        max_epochs=1,
        max_steps=-1,
        limit_val_batches=0,
        default_root_dir=str(REPO / "bench_out" / "step_trainer"),
        callbacks=[clock, *recipe_callbacks(cfg, strategy)],
        strategy=strategy,
    )
    trainer.fit(module, train_dataloaders=_Batches(batches))
    return clock.times()


class _Batches:
    def __init__(self, batches: list):
        self.batches = batches

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self):
        for batch in self.batches:
            batch.meta.setdefault("wait_s", 0.0)
            yield batch


def measure(
    loop: str, make_module, batches: list, device: torch.device, cfg, warmup: int, repeats: int = 1
) -> dict:
    """``repeats`` pairs of a timed and a profiled run (``measure_pair``): each figure is the
    median over the pairs, and ``ratios`` holds each pair's step / floor. On a machine whose speed
    drifts, a pair's two runs are seconds apart, and the median pair is the one to quote."""
    pairs = [measure_pair(loop, make_module, batches, device, cfg, warmup) for _ in range(repeats)]
    out = {key: statistics.median(p[key] for p in pairs) for key in pairs[0]}
    out["ratios"] = [step_over_floor(p) for p in pairs]
    return out


def step_over_floor(figures: dict) -> float:
    """The step's time over its GEMM time (the floor), of one pair's or the medians' figures."""
    return figures["step"] / max(figures["gemm"], 1e-9)


@contextlib.contextmanager
def frozen_heap():
    """The heap as ``train.py`` leaves it for the fit: every object built before it frozen
    (``gc.freeze``), so that the cyclic collector does not scan the dataset's, config's and
    imports' objects inside training steps; collected after."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.collect()


def measure_pair(loop: str, make_module, batches: list, device: torch.device, cfg, warmup: int) -> dict:
    """The median step of a timed run, then the same run under the profiler, split by category;
    each run on a frozen heap, as the recipe fits (``frozen_heap``)."""
    loop_run = (
        (lambda m: bare_loop(m, batches, device))
        if loop == "bare"
        else (lambda m: trainer_loop(m, batches, device, cfg))
    )

    def run(module) -> list[float]:
        with frozen_heap():
            return loop_run(module)

    step_s = statistics.median(run(make_module())[warmup:])
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    steps: list[int] = []

    def profiled_run(_: int) -> None:
        steps.append(len(run(scoped_training_step(make_module()))))

    with profile(activities=activities) as prof:
        # on CUDA the same run counts the host syncs (CUDA's sync debug mode)
        syncs = cuda_sync_count(profiled_run, 1) if cuda else profiled_run(0)
    split = split_by_category(prof.events(), cuda)
    per_step = {k: split.get(k, 0.0) / steps[0] for k in CATEGORIES}
    busy = sum(per_step.values())
    extra = {}
    if cuda:
        kernels, gemm = kernel_seconds(prof.events())
        busy, per_step["gemm"] = kernels / steps[0], gemm / steps[0]
        extra = {"kernel_share": busy / step_s, "syncs": syncs / steps[0]}
    per_step["rest"] = max(step_s - busy, 0.0)
    return {"step": step_s, **per_step, **extra}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.py step", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="products_like_200k", help="a lightning_mqgnn/conf/data config")
    parser.add_argument(
        "--models", default="sage,gcn", help="lightning_mqgnn/conf/model configs, comma separated"
    )
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5, help="steps left out of the timed median")
    parser.add_argument(
        "--repeats", type=int, default=3, help="pairs of a timed and a profiled run per row (medians)"
    )
    parser.add_argument("--loops", default="bare,trainer")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--extra", default="", help="more recipe overrides, space separated")
    parser.add_argument("--cuda-graphs", type=cuda_graph_modes, default="off", help=CUDA_GRAPHS_HELP)
    parser.add_argument("--out", type=Path, default=REPO / "bench_out" / "step.md")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    rows = [
        "| model | loop |"
        + (" CUDA graphs |" if cuda else "")
        + " step ms | GEMM ms | aggregation ms | elementwise ms | RNG ms | copies ms | "
        f"optimiser ms | {'host (GPU idle)' if cuda else 'rest'} ms | step / floor | each pair's step / floor |"
        + (" kernels / step | host syncs / step |" if cuda else ""),
        "|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|---|" if cuda else ""),
    ]
    dataset = None
    for model in args.models.split(","):
        dataset, sampler, make_module, cfg = recipe_objects(args.data, model, args.extra.split(), dataset)
        batches = sample_batches(dataset, sampler, cfg, args.batch_size, args.steps, device)
        for graphs in args.cuda_graphs if cuda else [False]:
            for loop in args.loops.split(","):
                label = f"{model} {loop} cuda_graphs={graphs}"
                result = attempt(
                    label,
                    partial(
                        measure,
                        loop,
                        partial(make_module, graphs),
                        batches,
                        device,
                        cfg,
                        args.warmup,
                        args.repeats,
                    ),
                )
                rows.append(row(model, loop, graphs, cuda, result) if result else f"| {label}: failed |")
                print(rows[-1], flush=True)
    header = machine_header("step", argv)
    header.insert(2, f"- data {args.data}, batch {args.batch_size}, {torch.get_num_threads()} torch threads")
    write_report("Training step vs its GEMM floor", header, rows, args.out)
    return exit_status()


def row(model: str, loop: str, graphs: bool, cuda: bool, r: dict) -> str:
    """One table row of ``measure``'s result ``r``."""
    ms = {k: 1e3 * v for k, v in r.items() if k != "ratios"}
    graph_cell = (" on |" if graphs else " off |") if cuda else ""
    return (
        f"| {model} | {loop} |{graph_cell} {ms['step']:.2f} | {ms['gemm']:.2f} | {ms['aggregation']:.2f} | "
        f"{ms['elementwise']:.2f} | {ms['rng']:.2f} | {ms['copy']:.2f} | {ms['optimiser']:.2f} | "
        f"{ms['rest']:.2f} | {step_over_floor(r):.2f}x | "
        + ", ".join(f"{x:.2f}x" for x in r["ratios"])
        + " |"
        + (f" {r['kernel_share']:.0%} | {r['syncs']:.1f} |" if cuda else "")
    )


if __name__ == "__main__":
    sys.exit(main())
