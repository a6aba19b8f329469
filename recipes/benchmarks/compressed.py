"""Benchmark: RaCoM over a slow link, with and without gradient compression.

SAGE (``NodeClassifier``'s defaults, the paper's: 2 layers, hidden 256, Adam lr 1e-3; fan-out 5,5)
on a graph, trained by ``--ranks`` CPU processes (gloo) under plain DDP (``MQGNNStrategy`` at
staleness 0, DDP bit for bit) and the gradient queue at staleness 1, 2 (``"s2"``) and ``"auto"``,
each with no comm hook, torch's fp16 and PowerSGD (rank 1 and 4) hooks and ``quantize_hook`` (4
bits; 4 and 2 with error feedback), the queue's also with each gradient computed at the predicted
weights ("s1 q4 predicted": ``predict_weights=True``), behind a SIMULATED link of a given bandwidth
and latency. The link is one wire per rank: a collective's messages are delivered once the wire has
carried the rank's bytes (a ring all-reduce of p payload bytes carries 2 (w - 1) / w * p, an
all-gather (w - 1) * p) and the latency has passed, queued behind what the wire carries already; the
real gloo collective must also have completed. Every gradient reduction and model synchronisation
goes over it (DDP's through a comm hook that DDP waits for at the end of backward). Reported per
configuration, mean over the ranks: gradient bytes a step (the payload handed to collectives,
``CommStats.grad_bytes``), time blocked on reductions a step, training time an epoch (median epoch)
and the test metric of the final weights (exact full-graph inference). A measurement: nothing here
asserts timings.

    python recipes/bench.py compressed --data amazon_computers_128 --links 1:1,10:0.1 --out docs/benchmarks/compressed
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

CONFIGS = {  # name: (staleness, hook)
    "DDP": (0, None),
    "DDP fp16": (0, "fp16"),
    "DDP q4": (0, "q4"),
    "DDP q4 ef": (0, "q4ef"),
    "DDP q2 ef": (0, "q2ef"),
    "DDP PowerSGD r4": (0, "powersgd4"),
    "s1": (1, None),
    "s1 fp16": (1, "fp16"),
    "s1 PowerSGD r1": (1, "powersgd1"),
    "s1 PowerSGD r4": (1, "powersgd4"),
    "s1 q4": (1, "q4"),
    "s1 q4 ef": (1, "q4ef"),
    "s2": (2, None),
    "auto": ("auto", None),
    "auto q4": ("auto", "q4"),
}
PREDICTED = " predicted"  # a queue configuration with this suffix: MQGNNStrategy(predict_weights=True)


def parse_config(name: str) -> tuple[int | str, str | None, bool]:
    """``(staleness, hook, predict_weights)`` of a configuration name (``CONFIGS``, optionally with
    ``PREDICTED`` after a queue's)."""
    base = name.removesuffix(PREDICTED)
    if base not in CONFIGS or (base != name and CONFIGS[base][0] == 0):
        raise ValueError(
            f"unknown configuration {name!r}; choose from {list(CONFIGS)}, those with staleness 1 or auto "
            f"also with {PREDICTED.strip()!r} after them"
        )
    staleness, hook = CONFIGS[base]
    return staleness, hook, base != name


# ----------------------------------------------------------------------------- the simulated link
class Link:
    """One rank's wire: ``bandwidth`` bits a second, ``latency`` seconds, messages in order."""

    def __init__(self, gbit_s: float, latency_ms: float) -> None:
        self.bytes_s = gbit_s * 1e9 / 8
        self.latency_s = latency_ms / 1000
        self._free_at = 0.0
        self._lock = threading.Lock()

    def delivered_at(self, sent_at: float, wire_bytes: float) -> float:
        """When a message handed over at ``sent_at`` is in: after the wire carried it, plus latency."""
        with self._lock:
            start = max(sent_at, self._free_at)
            self._free_at = start + wire_bytes / self.bytes_s
            return self._free_at + self.latency_s


def _sleep_until(deadline: float) -> None:
    left = deadline - time.perf_counter()
    if left > 0:
        time.sleep(left)


class _LinkedReduce:
    """A launched all-reduce that is complete once gloo's is and the link has delivered it."""

    def __init__(self, pending, due: float) -> None:
        self.pending, self.due = pending, due

    def is_completed(self) -> bool:
        return time.perf_counter() >= self.due and self.pending.is_completed()

    def wait(self) -> None:
        self.pending.wait()
        _sleep_until(self.due)


class LinkedAllReduce:
    """The strategy's all-reduce over ``link`` (the gradient queue without a hook, model syncs)."""

    def __init__(self, reducer, link: Link) -> None:
        self.reducer, self.link, self.world_size = reducer, link, reducer.world_size

    def launch(self, tensors):
        payload = sum(t.numel() * t.element_size() for t in tensors)
        wire = 2 * (self.world_size - 1) / self.world_size * payload
        due = self.link.delivered_at(time.perf_counter(), wire)
        return _LinkedReduce(self.reducer.launch(tensors), due)


def linked_hook(hook, link: Link, world: int, gathers: bool):
    """``hook`` whose future completes once the link has delivered what it sent (measured with
    ``comm_hook.payload_meter``; an all-gather when ``gathers``, else all-reduces). The hook runs
    where it is called, so its collectives keep their order; a thread waits for the link."""
    from lightning_mqgnn.strategy.comm_hook import payload_meter

    def over_the_link(state, bucket):
        sent_at = time.perf_counter()
        meter = payload_meter(hook, state, bucket)
        future = hook(state, bucket)
        result: torch.futures.Future = torch.futures.Future()

        def deliver() -> None:
            try:
                reduced = future.wait()
                payload = meter()
                payload = payload if payload is not None else bucket.buffer().numel() * 4
                wire = (world - 1) * payload if gathers else 2 * (world - 1) / world * payload
                _sleep_until(link.delivered_at(sent_at, wire))
                result.set_result(reduced)
            except BaseException as err:  # noqa: BLE001 - the waiter raises it
                result.set_exception(err)

        threading.Thread(target=deliver, daemon=True).start()
        return result

    over_the_link.__wrapped__ = hook  # what it sends is what the hook sends
    return over_the_link


# ----------------------------------------------------------------------------- worker side
def _hook_and_state(name: str | None):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    from lightning_mqgnn.strategy import QuantizeState, quantize_hook

    if name is None:
        return default_hooks.allreduce_hook, None, False
    if name == "fp16":
        return default_hooks.fp16_compress_hook, None, False
    if name.startswith("powersgd"):
        state = powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=int(name[len("powersgd") :]), start_powerSGD_iter=2
        )
        return powerSGD_hook.powerSGD_hook, state, False
    if name.startswith("q"):  # q<bits>, then "ef" for error feedback
        bits, feedback = name[1:].removesuffix("ef"), name.endswith("ef")
        return quantize_hook, QuantizeState(bits=int(bits), error_feedback=feedback), True
    raise ValueError(f"unknown hook {name!r}")


def _strategy(staleness, hook_name: str | None, predict: bool, link: Link, world: int, sync_period: int):
    from lightning_mqgnn.strategy import MQGNNStrategy

    class LinkedStrategy(MQGNNStrategy):
        def make_reducer(self):
            return LinkedAllReduce(super().make_reducer(), link)

    hook, state, gathers = _hook_and_state(hook_name)
    # DDP always communicates through a (linked) hook; the queue without one through its reducer
    hook = linked_hook(hook, link, world, gathers) if staleness == 0 or hook_name is not None else None
    return LinkedStrategy(
        staleness=staleness,
        sync_period=sync_period,
        ddp_comm_hook=hook,
        ddp_comm_state=state,
        max_staleness=4,
        predict_weights=predict,
    )


def _run_worker(args: argparse.Namespace) -> None:
    import lightning.pytorch as pl

    from benchmarks._baseline import load_dataset
    from lightning_mqgnn.data import LoaderSettings, MQGNNDataModule
    from lightning_mqgnn.models import NodeClassifier
    from lightning_mqgnn.sampling.neighbor import NeighborSampler

    torch.set_num_threads(1)
    dataset = load_dataset(args.data, scale=args.scale)
    out_dir = Path(args.worker_out)

    class EpochClock(pl.Callback):
        def __init__(self) -> None:
            self.epochs: list[float] = []

        def on_train_epoch_start(self, trainer, pl_module):
            self._start = time.perf_counter()

        def on_train_epoch_end(self, trainer, pl_module):
            self.epochs.append(time.perf_counter() - self._start)

    # seed by seed, every configuration back to back: a machine that slows down over the minutes
    # of a run slows every configuration alike instead of the ones that happen to run last
    for link_spec in args.links.split(","):
        gbit, latency = (float(v) for v in link_spec.split(":"))
        for seed in (int(s) for s in args.seeds.split(",")):
            for name in args.configs.split(","):
                staleness, hook_name, predict = parse_config(name)
                pl.seed_everything(seed, verbose=False)
                link = Link(gbit, latency)
                strategy = _strategy(staleness, hook_name, predict, link, args.ranks, args.sync_period)
                clock = EpochClock()
                trainer = pl.Trainer(
                    accelerator="cpu",
                    devices=args.ranks,
                    strategy=strategy,
                    max_epochs=args.epochs,
                    callbacks=[clock],
                    logger=False,
                    enable_checkpointing=False,
                    enable_progress_bar=False,
                    enable_model_summary=False,
                    num_sanity_val_steps=0,
                    limit_val_batches=0,
                )
                module = NodeClassifier(
                    dataset.num_features,
                    dataset.num_classes,
                    metric=dataset.metric,
                    multilabel=dataset.multilabel,
                )
                sampler = NeighborSampler(dataset.graph, [5, 5])
                datamodule = MQGNNDataModule(
                    dataset, sampler, LoaderSettings(batch_size=args.batch_size, seed=seed)
                )
                trainer.fit(module, datamodule=datamodule)
                test = trainer.test(module, datamodule=datamodule, verbose=False)[0]["test/metric"]
                stats = strategy.comm_stats
                record = {
                    "link": link_spec,
                    "config": name,
                    "seed": seed,
                    "rank": trainer.global_rank,
                    "bytes_per_step": stats.grad_bytes_per_step,
                    "wait_ms_per_step": 1000 * stats.grad_wait_s / max(stats.steps, 1),
                    "epoch_s": statistics.median(clock.epochs[1:] or clock.epochs),
                    "test": float(test),
                    "staleness": stats.staleness,
                }
                tag = f"{link_spec}_{name.replace(' ', '_')}_{seed}_rank{trainer.global_rank}"
                (out_dir / f"{tag}.json").write_text(json.dumps(record))
                trainer.strategy.barrier()


# ----------------------------------------------------------------------------- driver
def _mean(records: list[dict], key: str) -> float:
    values = [r[key] for r in records]
    return sum(values) / len(values)


def _table(records: list[dict], args: argparse.Namespace, command: str) -> str:
    lines = [
        f"`{command}`",
        "",
        f"{args.ranks} CPU ranks (gloo) on {os.cpu_count()} cores, data {args.data}, SAGE 5,5, batch "
        f"{args.batch_size}, {args.epochs} epochs, sync_period {args.sync_period}, seeds {args.seeds}. "
        "Link = SIMULATED bandwidth (Gbit/s) : latency (ms) per rank. Bytes = gradient payload handed to "
        "collectives per step; wait = time blocked on reductions per step (DDP: inside backward, not "
        "counted); epoch = median training epoch; test = final weights. Mean over ranks and seeds; "
        "ratio = DDP's epoch / this one's on the same link.",
        "",
        "| link | configuration | bytes/step | vs DDP | wait/step (ms) | epoch (s) | epoch vs DDP | test | staleness |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for link in args.links.split(","):
        on_link = [r for r in records if r["link"] == link]
        ddp = [r for r in on_link if r["config"] == "DDP"]
        for name in args.configs.split(","):
            rows = [r for r in on_link if r["config"] == name]
            if not rows:
                continue
            bytes_ = _mean(rows, "bytes_per_step")
            epoch = _mean(rows, "epoch_s")
            vs_bytes = f"{_mean(ddp, 'bytes_per_step') / bytes_:.1f}x fewer" if ddp else "-"
            vs_epoch = f"{_mean(ddp, 'epoch_s') / epoch:.2f}x" if ddp else "-"
            staleness = sorted({int(r["staleness"]) for r in rows})
            lines.append(
                f"| {link} | {name} | {bytes_:,.0f} | {vs_bytes} | {_mean(rows, 'wait_ms_per_step'):.2f} | "
                f"{epoch:.3f} | {vs_epoch} | {_mean(rows, 'test'):.4f} | {'/'.join(map(str, staleness))} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--data", default="amazon_computers_128", help="a data config name, or generated:PRESET"
    )
    parser.add_argument("--scale", type=float, default=1.0, help="of a generated:PRESET graph")
    parser.add_argument("--links", default="1:1,10:0.1", help="GBIT_S:LATENCY_MS,...")
    parser.add_argument("--configs", default=",".join(CONFIGS), help=f"of {list(CONFIGS)}")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--sync-period", type=int, default=20)
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--out", default=None, help="a folder for compressed.md and compressed.json")
    parser.add_argument("--worker-out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name in args.configs.split(","):
        try:
            parse_config(name)
        except ValueError as err:
            parser.error(str(err))
    if args.worker_out is not None:  # inside the ranks
        _run_worker(args)
        return ""
    given = argv if argv is not None else sys.argv[1:]
    command = shlex.join(["python", "recipes/bench.py", "compressed", *given])
    with tempfile.TemporaryDirectory() as tmp:
        here = Path(__file__).resolve().parent
        cmd = [sys.executable, str(here / "compressed.py"), *given, "--worker-out", tmp]
        env = dict(
            os.environ,
            OMP_NUM_THREADS="1",
            PYTHONPATH=os.pathsep.join([str(here.parent), str(here.parents[1])]),
        )
        subprocess.run(cmd, check=True, env=env, timeout=7200)
        records = [json.loads(p.read_text()) for p in sorted(Path(tmp).glob("*.json"))]
    table = _table(records, args, command)
    print(table)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "compressed.md").write_text(table)
        (out / "compressed.json").write_text(json.dumps(records, indent=1))
    return table


if __name__ == "__main__":
    main()
