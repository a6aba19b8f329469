"""LABOR against node-wise sampling at the same fan-out, and against DGL 2.1's ``LaborSampler``.

    python recipes/bench.py labor --datasets amazon_photo,coauthor_physics_128,products_like_1m \\
        --models sage,labor_sage,labor_star_sage --seeds 0,1,2 --out bench_out/labor

Three parts (``--parts``, all by default):
- ``counts``: sampled vertices at the input layer (and edges) per batch, over the first
  ``--count-batches`` training batches of every seed, each batch seeded as the recipe's loader
  seeds it. The first model is the node-wise reference of the ratio column.
- ``train``: epoch time and test metric through the recipe, with the grid's protocol
  (``benchmarks.grid.run_ours``: ``--epochs`` epochs, early stopping off, one validation per
  epoch, test at the best epoch), in the ``--config`` configuration of the grid, every model with
  the first one's learning rate, hidden width and weight start.
- ``speed``: milliseconds per batch of this project's ``LaborSampler`` in this environment and of
  DGL's ``dgl.dataloading.LaborSampler`` (``sample_blocks``, no DataLoader) in a process of the DGL
  environment (``--dgl-python``, whose torch is older: ours is timed there too), on the same graph
  and the same seed batches, LABOR-0 and LABOR-*; the median over ``--speed-rounds`` passes, the
  systems of a process alternating pass by pass (the VM's speed drifts by up to 1.3x within
  minutes, so only systems timed side by side compare well); input vertices per batch of both, as
  a check that they sample alike.
Measures and prints; asserts nothing about timings.
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

from benchmarks._recipe import network_overrides, recipe_config
from benchmarks._report import machine_header, write_report

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve()


def sampler_config(model: str, extra: list[str]):
    """The sampler partial of ``lightning_mqgnn/conf/model/<model>.yaml`` with the ``model.*`` overrides among
    ``extra`` (e.g. ``model.sampler.fanouts=[10,10]``), as the recipe builds it."""
    from hydra.utils import instantiate

    overrides = [f"model={model}"]
    overrides += [o for o in extra if o.startswith("model.")]
    return instantiate(recipe_config(overrides).model.sampler)


def seed_batches(dataset, batch_size: int, seed: int, limit: int) -> list[tuple[int, int, torch.Tensor]]:
    """The first ``limit`` training batches of a run as ``(epoch, index, seeds)``, going on into
    later epochs when an epoch has fewer batches."""
    from lightning_mqgnn.pipeline.schedule import epoch_batches

    out: list[tuple[int, int, torch.Tensor]] = []
    epoch = 0
    while len(out) < limit:
        out += [
            (epoch, i, s) for i, s in enumerate(epoch_batches(dataset.train_idx, batch_size, epoch, seed))
        ]
        epoch += 1
    return out[:limit]


def count_sampled(sampler, dataset, batch_size: int, seed: int, limit: int) -> dict:
    """Mean input vertices and edges per batch over the first ``limit`` training batches."""
    from lightning_mqgnn.sampling.rng import batch_rng_seed

    inputs, edges = [], []
    for epoch, i, seeds in seed_batches(dataset, batch_size, seed, limit):
        torch.manual_seed(batch_rng_seed(seed, epoch, i))  # as the loader seeds this batch
        batch = sampler.sample(seeds)
        inputs.append(batch.input_nodes.numel())
        edges.append(sum(b.num_edges for b in batch.blocks))
    return {"inputs": statistics.mean(inputs), "edges": statistics.mean(edges)}


def run_counts(datasets: list[str], models: list[str], seeds: list[int], args, cache: dict) -> list[dict]:
    from benchmarks._baseline import load_dataset

    runs = []
    for name in datasets:
        dataset = cache.setdefault(name, load_dataset(name))
        for model in models:
            sampler = sampler_config(model, args.extra.split())(graph=dataset.graph)
            for seed in seeds:
                run = count_sampled(sampler, dataset, args.batch_size, seed, args.count_batches)
                run.update(dataset=name, model=model, seed=seed)
                print(f"{name} {model} seed {seed}: {run['inputs']:.0f} input vertices / batch", flush=True)
                runs.append(run)
    return runs


def run_training(datasets: list[str], models: list[str], seeds: list[int], args) -> list[dict]:
    """Every model trains the reference's network (its rate, width and start): the runs compare
    samplers."""
    from benchmarks.grid import run_ours

    network = network_overrides(models[0], extra=args.extra.split())
    args = argparse.Namespace(**{**vars(args), "extra": " ".join([*network, args.extra])})
    runs = []
    for name in datasets:
        for model in models:
            for seed in seeds:
                result = run_ours(args.config, model, name, seed, args)
                result.pop("timeline")
                result.update(dataset=name, model=model, seed=seed)
                print(
                    f"{name} {model} seed {seed}: epoch {result['epoch_time_s']:.3f} s, "
                    f"test {result['metric']:.4f}",
                    flush=True,
                )
                runs.append(result)
    return runs


def pm(values: list[float], digits: int) -> str:
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def quality_table(counts: list[dict], training: list[dict], models: list[str]) -> list[str]:
    """One row per (dataset, model); ratios and metric differences against the first model."""
    rows = [
        "| dataset | model | input vertices / batch | fewer than "
        f"{models[0]} | edges / batch | epoch time s | test metric | Δ test vs {models[0]} (points) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    keys = list(dict.fromkeys((r["dataset"], r["model"]) for r in [*counts, *training]))

    def of(runs, dataset, model, field):
        return [r[field] for r in runs if (r["dataset"], r["model"]) == (dataset, model)]

    for dataset, model in keys:
        inputs, edges = of(counts, dataset, model, "inputs"), of(counts, dataset, model, "edges")
        base_inputs = of(counts, dataset, models[0], "inputs")
        epoch, metric = of(training, dataset, model, "epoch_time_s"), of(training, dataset, model, "metric")
        base_metric = of(training, dataset, models[0], "metric")
        ratio = (
            f"{statistics.mean(base_inputs) / statistics.mean(inputs):.2f}x"
            if inputs and base_inputs
            else "-"
        )
        delta = (
            f"{100 * (statistics.mean(metric) - statistics.mean(base_metric)):+.2f}"
            if metric and base_metric
            else "-"
        )
        rows.append(
            f"| {dataset} | {model} | {pm(inputs, 0) if inputs else '-'} | {ratio} | "
            f"{pm(edges, 0) if edges else '-'} | {pm(epoch, 3) if epoch else '-'} | "
            f"{pm(metric, 4) if metric else '-'} | {delta} |"
        )
    return rows


# ---- sampling speed against DGL (runs inside the DGL environment) --------------------------------


def speed_rows(
    dataset_name: str, fanouts: list[int], seeds: list[int], args, systems: list[str]
) -> list[dict]:
    """ms per batch and input vertices per batch of each of ``systems`` ("ours" and, in the DGL
    environment, "dgl"), LABOR-0 and LABOR-*, on the same seed batches."""
    from benchmarks._baseline import load_dataset
    from lightning_mqgnn.sampling.labor import LaborSampler
    from lightning_mqgnn.sampling.rng import batch_rng_seed

    dataset = load_dataset(dataset_name)
    if "dgl" in systems:
        from lightning_mqgnn.graph.dgl_graph import import_dgl, to_dgl

        dgl = import_dgl()
        g = to_dgl(dataset)
    label = "ours" if "dgl" not in systems else f"ours (torch {torch.__version__.split('+')[0]})"
    rows = []
    for rounds in (0, -1):
        samplers = {}
        if "ours" in systems:
            ours = LaborSampler(dataset.graph, fanouts, "mean", importance_sampling=rounds)

            def sample_ours(epoch, i, s, seed, ours=ours):
                torch.manual_seed(batch_rng_seed(seed, epoch, i))
                return ours.sample(s).input_nodes.numel()

            samplers[label] = sample_ours
        if "dgl" in systems:
            theirs = dgl.dataloading.LaborSampler(fanouts, importance_sampling=rounds)

            def sample_dgl(epoch, i, s, seed, theirs=theirs):
                return theirs.sample_blocks(g, s)[0].numel()

            samplers["dgl"] = sample_dgl
        for seed in seeds:
            torch.manual_seed(seed)
            if "dgl" in systems:
                dgl.seed(seed)
            batches = seed_batches(dataset, args.batch_size, seed, args.speed_batches + args.warmup)
            for fn in samplers.values():
                for batch in batches[: args.warmup]:
                    fn(*batch, seed)
            ms: dict[str, list[float]] = {system: [] for system in samplers}
            inputs: dict[str, list[int]] = {system: [] for system in samplers}
            for round_ in range(args.speed_rounds):  # the systems alternate, first one, then the other
                order = list(samplers.items())
                for system, fn in order[::-1] if round_ % 2 else order:
                    start = time.perf_counter()
                    counts = [fn(*batch, seed) for batch in batches[args.warmup :]]
                    ms[system].append(1e3 * (time.perf_counter() - start) / len(counts))
                    if round_ == 0:
                        inputs[system] = counts
            for system in samplers:
                rows.append(
                    dict(
                        dataset=dataset_name,
                        variant="LABOR-0" if rounds == 0 else "LABOR-*",
                        system=system,
                        seed=seed,
                        ms=statistics.median(ms[system]),
                        inputs=statistics.mean(inputs[system]),
                    )
                )
                print(
                    f"{dataset_name} {rows[-1]['variant']} {system} seed {seed}: {rows[-1]['ms']:.2f} ms / batch "
                    f"(median of {args.speed_rounds} rounds), {rows[-1]['inputs']:.0f} input vertices",
                    flush=True,
                )
    return rows


def run_speed(datasets: list[str], seeds: list[int], args) -> list[dict]:
    """Per dataset, each in a fresh process: our sampler in this environment's python (its torch),
    then DGL's and ours again in the DGL environment's python (its older torch)."""
    env = dict(os.environ, DGLBACKEND="pytorch", OUTDATED_IGNORE="1")
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(REPO), str(HERE.parents[1]), env.get("PYTHONPATH")])
    )
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
    rows = []
    for name in datasets:
        for python, systems in ((sys.executable, "ours"), (args.dgl_python, "ours,dgl")):
            with tempfile.TemporaryDirectory(prefix="mqgnn-labor-") as tmp:
                out = Path(tmp) / "speed.json"
                cmd = [
                    python,
                    str(HERE),
                    f"--speed-of={systems}",
                    f"--datasets={name}",
                    f"--seeds={','.join(map(str, seeds))}",
                    f"--fanouts={','.join(map(str, args.fanouts))}",
                    f"--batch-size={args.batch_size}",
                    f"--speed-batches={args.speed_batches}",
                    f"--warmup={args.warmup}",
                    f"--speed-rounds={args.speed_rounds}",
                    f"--json={out}",
                    *([f"--threads={args.threads}"] if args.threads else []),
                ]
                proc = subprocess.run(
                    cmd, env=env, cwd=REPO, timeout=args.timeout, text=True, capture_output=True
                )
                if proc.returncode != 0:
                    tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
                    raise RuntimeError(f"speed run of {systems} on {name} failed:\n{tail}")
                print(proc.stdout, end="", flush=True)
                rows.extend(json.loads(out.read_text()))
    return rows


def speed_table(rows: list[dict]) -> list[str]:
    """One line per dataset and variant: ours in this environment, ours in the DGL environment,
    DGL's, the ratios DGL / ours in DGL's process (timed in alternating rounds) and against this
    environment's (another process, minutes apart), input vertices of ours and DGL's."""
    other = next((r["system"] for r in rows if r["system"].startswith("ours (")), "ours (DGL env)")
    table = [
        f"| dataset | variant | ours ms / batch | {other} ms / batch | DGL ms / batch | "
        f"DGL / {other} (same process) | DGL / ours | ours input vertices | DGL input vertices |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for dataset, variant in dict.fromkeys((r["dataset"], r["variant"]) for r in rows):
        group = [r for r in rows if (r["dataset"], r["variant"]) == (dataset, variant)]
        ours = [r for r in group if r["system"] == "ours"]
        there = [r for r in group if r["system"] == other]
        dgl = [r for r in group if r["system"] == "dgl"]
        dgl_ms = statistics.mean(r["ms"] for r in dgl)
        ratio = dgl_ms / statistics.mean(r["ms"] for r in ours)
        same = f"{dgl_ms / statistics.mean(r['ms'] for r in there):.2f}x" if there else "-"
        table.append(
            f"| {dataset} | {variant} | {pm([r['ms'] for r in ours], 2)} | "
            f"{pm([r['ms'] for r in there], 2) if there else '-'} | {pm([r['ms'] for r in dgl], 2)} | "
            f"{same} | {ratio:.2f}x | {pm([r['inputs'] for r in ours], 0)} | {pm([r['inputs'] for r in dgl], 0)} |"
        )
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.py labor", description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", default="amazon_photo,coauthor_physics_128,products_like_1m")
    parser.add_argument(
        "--models", default="sage,labor_sage,labor_star_sage", help="the first is the reference"
    )
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--parts", default="counts,train,speed")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--config", default="pipeline", help="grid configuration of the training runs")
    parser.add_argument("--extra", default="", help="more recipe overrides (model.* also for the counts)")
    parser.add_argument("--count-batches", type=int, default=20)
    parser.add_argument("--fanouts", default="5,5", help="speed part; the counts use the model configs'")
    parser.add_argument("--speed-batches", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument(
        "--speed-rounds", type=int, default=3, help="timed passes over the batches per system (median)"
    )
    parser.add_argument("--threads", type=int, help="intra-op threads of the speed part (both systems)")
    parser.add_argument("--dgl-python", default=str(REPO / ".venv-dgl" / "bin" / "python"))
    parser.add_argument("--timeout", type=float, default=3600)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--speed-of", help=argparse.SUPPRESS)  # one speed process: "ours" or "ours,dgl"
    parser.add_argument("--json", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    datasets, models = args.datasets.split(","), args.models.split(",")
    seeds = [int(s) for s in args.seeds.split(",")]
    args.fanouts = [int(f) for f in args.fanouts.split(",")]
    parts = args.parts.split(",")
    unknown = sorted(set(parts) - {"counts", "train", "speed"})
    if unknown:
        parser.error(f"unknown parts {unknown}; choose from counts, train, speed")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.speed_of:
        systems = args.speed_of.split(",")
        rows = [row for name in datasets for row in speed_rows(name, args.fanouts, seeds, args, systems)]
        args.json.write_text(json.dumps(rows))
        return 0

    cache: dict = {}
    counts = run_counts(datasets, models, seeds, args, cache) if "counts" in parts else []
    cache.clear()  # the training runs load their own copy
    training = run_training(datasets, models, seeds, args) if "train" in parts else []
    speed = run_speed(datasets, seeds, args) if "speed" in parts else []
    table = []
    if counts or training:
        table += quality_table(counts, training, models)
    if speed:
        table += ["", *speed_table(speed)]
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "labor.json").write_text(
            json.dumps({"counts": counts, "train": training, "speed": speed})
        )
    write_report(
        "LABOR vs node-wise sampling, and vs DGL's LaborSampler",
        machine_header("labor", argv),
        table,
        args.out / "labor.md" if args.out else None,
    )
    return 0


if __name__ == "__main__":  # the speed processes: run_speed puts recipes/ on PYTHONPATH for ``benchmarks``
    sys.exit(main())
