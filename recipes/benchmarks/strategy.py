"""Benchmark: plain DDP vs MQGNNStrategy (RaCoM gradient queue), 2 CPU processes, same data and seeds.

Measures time per step and time blocked on gradient communication, with the all-reduce as it is and
with a SIMULATED network delay added to every all-reduce (a background thread completes the all-reduce
`delay` ms late; the training thread only waits if it needs the result). Prints a markdown table and
writes it to --out. A measurement, not a test: nothing here asserts timings.

    python recipes/benchmarks/strategy.py --out BENCH_strategy.md
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

CONFIGS = {  # name: (strategy kind, staleness)
    "DDPStrategy": ("ddp", None),
    "mqgnn s=0": ("mqgnn", 0),
    "mqgnn s=1": ("mqgnn", 1),
    "mqgnn s=2": ("mqgnn", 2),
}


# ----------------------------------------------------------------------------- worker side (2 processes)
class _DelayedHookState:
    """State of the DDP comm hook: simulated delay and the time the last bucket was handed over."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.last_hook_call = 0.0
        self.comm_wait_s = 0.0
        self._executor: ThreadPoolExecutor | None = None

    def executor(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="simulated-delay")
        return self._executor


def _delayed_allreduce_hook(state, bucket):  # no annotations: torch checks them against real classes
    """DDP's default all-reduce (divide by world size, then sum), completed `delay_s` late (SIMULATED)."""
    state.last_hook_call = time.perf_counter()
    buffer = bucket.buffer().div_(dist.get_world_size())
    work = dist.all_reduce(buffer, async_op=True)
    if state.delay_s == 0:
        return work.get_future().then(lambda fut: fut.value()[0])
    result: torch.futures.Future = torch.futures.Future()

    def complete_late() -> None:
        work.wait()
        time.sleep(state.delay_s)
        result.set_result(buffer)

    state.executor().submit(complete_late)
    return result


class _DelayedReduce:
    """A launched all-reduce completed `delay_s` late by a background thread (SIMULATED latency)."""

    def __init__(self, future) -> None:
        self._future = future

    def wait(self) -> None:
        self._future.result()

    def is_completed(self) -> bool:
        return self._future.done()


class DelayedAllReduce:
    """The strategy's all-reduce with a SIMULATED network latency: a background thread waits for the real
    all-reduce, sleeps, then marks it complete, so the training thread is only blocked by the delay if it
    waits for the result. Delays are serialised, like messages on one link."""

    def __init__(self, reducer, delay_s: float) -> None:
        self.reducer = reducer
        self.world_size = reducer.world_size
        self.delay_s = delay_s
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="simulated-delay")

    def launch(self, tensors):
        pending = self.reducer.launch(tensors)

        def complete_late() -> None:
            pending.wait()
            time.sleep(self.delay_s)

        return _DelayedReduce(self._executor.submit(complete_late))


def _make_strategies():
    from lightning.pytorch.strategies import DDPStrategy

    from lightning_mqgnn.strategy import MQGNNStrategy

    class TimedDDPStrategy(DDPStrategy):
        """Lightning's DDPStrategy with the comm hook above registered on CPU too (Lightning only does it
        on CUDA); comm wait = end of backward - last bucket hand-over (DDP blocks there for the all-reduce)."""

        def __init__(self, delay_s: float, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.hook_state = _DelayedHookState(delay_s)

        def _register_ddp_hooks(self) -> None:
            self.model.register_comm_hook(self.hook_state, _delayed_allreduce_hook)

        def backward(self, closure_loss, optimizer, *args, **kwargs):
            out = super().backward(closure_loss, optimizer, *args, **kwargs)
            self.hook_state.comm_wait_s += max(0.0, time.perf_counter() - self.hook_state.last_hook_call)
            return out

    class TimedMQGNNStrategy(MQGNNStrategy):
        """MQGNNStrategy with the same SIMULATED delay: at staleness 0 (the DDP wrapper) through the comm hook
        above, at staleness > 0 by wrapping the all-reduce of the gradient queue and the model sync."""

        def __init__(self, delay_s: float, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.hook_state = _DelayedHookState(delay_s)

        def _register_ddp_hooks(self) -> None:
            self.model.register_comm_hook(self.hook_state, _delayed_allreduce_hook)

        def make_reducer(self):
            reducer = super().make_reducer()
            return (
                reducer
                if self.hook_state.delay_s == 0
                else DelayedAllReduce(reducer, self.hook_state.delay_s)
            )

        def backward(self, closure_loss, optimizer, *args, **kwargs):
            out = super().backward(closure_loss, optimizer, *args, **kwargs)
            if self.staleness == 0:
                self.hook_state.comm_wait_s += max(0.0, time.perf_counter() - self.hook_state.last_hook_call)
            return out

    return TimedDDPStrategy, TimedMQGNNStrategy


def mlp_module(features: int, hidden: int):
    """The strategy benchmarks' model: an MLP classifier (features -> hidden -> hidden -> 10) as a
    LightningModule with Adam 1e-3, big enough that its gradient all-reduce is worth hiding."""
    import lightning.pytorch as pl
    from torch import nn

    class MLP(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(
                nn.Linear(features, hidden),
                nn.ReLU(),
                nn.Linear(hidden, hidden),
                nn.ReLU(),
                nn.Linear(hidden, 10),
            )

        def training_step(self, batch, batch_idx):
            return nn.functional.cross_entropy(self.net(batch[0]), batch[1])

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-3)

    return MLP()


def fit_mlp(strategy, world: int, clock, args: argparse.Namespace, x, y, **limit):
    """One quiet fit of ``mlp_module`` on ``(x, y)`` with ``world`` CPU ranks under ``strategy``,
    ``clock`` its only callback and ``limit`` its length (``max_steps`` or ``max_epochs``)."""
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader, TensorDataset

    trainer = pl.Trainer(
        accelerator="cpu",
        devices=world,
        strategy=strategy,
        callbacks=[clock],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **limit,
    )
    trainer.fit(
        mlp_module(args.features, args.hidden), DataLoader(TensorDataset(x, y), batch_size=args.batch_size)
    )
    return trainer


def _run_worker(args: argparse.Namespace) -> None:
    import lightning.pytorch as pl

    torch.set_num_threads(1)
    timed_ddp, timed_mqgnn = _make_strategies()

    class StepClock(pl.Callback):
        def __init__(self) -> None:
            self.ends: list[float] = []
            self.waits: list[float] = []

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.ends.append(time.perf_counter())
            strategy = trainer.strategy
            wait = strategy.hook_state.comm_wait_s
            if hasattr(strategy, "comm_stats"):
                wait += strategy.comm_stats.grad_wait_s + strategy.comm_stats.sync_s
            self.waits.append(wait)

    n_steps = args.warmup + args.steps
    g = torch.Generator().manual_seed(0)
    world = 2
    x = torch.randn(n_steps * args.batch_size * world, args.features, generator=g)
    y = torch.randint(0, 10, (x.shape[0],), generator=g)
    out_dir = Path(args.worker_out)
    for round_ in range(args.rounds):  # repeated rounds, median per cell: the box is shared and noisy
        for name, (kind, staleness) in CONFIGS.items():
            for delay_ms in args.delays:  # delays back to back, so step(d) - step(0) sees the same load
                pl.seed_everything(0, verbose=False)
                if kind == "ddp":
                    strategy = timed_ddp(delay_ms / 1000)
                else:
                    strategy = timed_mqgnn(delay_ms / 1000, staleness=staleness, sync_period=args.sync_period)
                clock = StepClock()
                trainer = fit_mlp(strategy, world, clock, args, x, y, max_steps=n_steps)
                w, steps = args.warmup, len(clock.ends) - args.warmup
                record = {
                    "config": name,
                    "delay_ms": delay_ms,
                    "rank": trainer.global_rank,
                    "round": round_,
                    # median step interval: robust to the preemptions of a shared machine
                    "step_s": statistics.median(b - a for a, b in zip(clock.ends[w - 1 :], clock.ends[w:])),
                    "wait_s": (clock.waits[-1] - clock.waits[w - 1]) / steps,
                }
                tag = f"{name.replace(' ', '_')}_{delay_ms}_r{round_}_rank{trainer.global_rank}"
                (out_dir / f"{tag}.json").write_text(json.dumps(record))
                trainer.strategy.barrier()


# ----------------------------------------------------------------------------- driver
def _table(records: list[dict], args: argparse.Namespace) -> str:
    def mean(config: str, delay: float, key: str) -> float:
        """Median over rounds of the mean over ranks."""
        per_round = {}
        for r in records:
            if r["config"] == config and r["delay_ms"] == delay:
                per_round.setdefault(r["round"], []).append(r[key])
        return statistics.median(sum(v) / len(v) for v in per_round.values())

    lines = [
        f"2 CPU processes (gloo), MLP {args.features}-{args.hidden}-{args.hidden}-10, batch {args.batch_size}/rank, "
        f"Adam, {args.steps} timed steps after {args.warmup} warm-up, mqgnn sync_period={args.sync_period}. "
        "Delay = SIMULATED extra latency per all-reduce. Comm wait: mqgnn s>0 = time blocked in work.wait() "
        "(gradient queue + periodic sync); DDP and mqgnn s=0 (the DDP wrapper) = end of backward - last "
        "bucket hook call. "
        "Hidden (step) = 1 - (step(d) - step(0)) / d; hidden (wait) = 1 - (wait(d) - wait(0)) / d. "
        "Time/step = median step interval; comm wait/step = total wait / steps (includes syncs). "
        f"Mean over both ranks, median over {args.rounds} rounds.",
        "",
        "| strategy | simulated delay (ms) | time/step (ms) | comm wait/step (ms) | delay hidden (step) "
        "| delay hidden (wait) |",
        "|---|---|---|---|---|---|",
    ]
    for delay in args.delays:
        for config in CONFIGS:
            step, wait = mean(config, delay, "step_s"), mean(config, delay, "wait_s")
            if delay == 0:
                hidden_step = hidden_wait = "-"
            else:
                hidden_step = f"{100 * (1 - (step - mean(config, 0, 'step_s')) / (delay / 1000)):.0f}%"
                hidden_wait = f"{100 * (1 - (wait - mean(config, 0, 'wait_s')) / (delay / 1000)):.0f}%"
            lines.append(
                f"| {config} | {delay:g} | {1000 * step:.1f} | {1000 * wait:.2f} | {hidden_step} | {hidden_wait} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default=None, help="write the markdown table here")
    parser.add_argument("--delays", type=float, nargs="+", default=[0.0, 5.0, 20.0], help="simulated ms")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--features", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--sync-period", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--worker-out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.warmup < 1 or args.steps < 1:
        parser.error(f"--warmup and --steps must be >= 1, got {args.warmup} and {args.steps}")
    if 0.0 not in args.delays:
        args.delays = [0.0, *args.delays]
    if args.worker_out is not None:  # inside the two Lightning processes
        _run_worker(args)
        return ""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            *(argv if argv is not None else sys.argv[1:]),
            "--worker-out",
            tmp,
        ]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        subprocess.run(cmd, check=True, env=env, timeout=1800)
        records = [json.loads(p.read_text()) for p in sorted(Path(tmp).glob("*.json"))]
    table = _table(records, args)
    print(table)
    if args.out:
        Path(args.out).write_text(table)
    return table


if __name__ == "__main__":
    main()
