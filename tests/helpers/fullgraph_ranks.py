"""Rank bodies of the full-graph distributed tests (4 gloo processes), their launcher and the
fail-fast check on a dying rank."""

from __future__ import annotations

import io
import os
import queue as queue_module
import socket
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from lightning_mqgnn.fullgraph import (
    FullGraphNodeClassifier,
    HaloExchanger,
    PartitionBook,
    Transport,
    partition_batch,
)
from lightning_mqgnn.graph.generated import generate_graph
from lightning_mqgnn.sampling.exact import exact_operator, full_block

WORLD = 4


def small_dataset():
    return generate_graph("arxiv", num_nodes=240, mean_degree=6.0, num_features=12, num_classes=4, seed=3)


def quiet_trainer(strategy, epochs: int, **kwargs):
    """A Lightning Trainer on ``WORLD`` CPU ranks without logger, checkpoints, bars or sanity
    validation: the full-graph tests' fits."""
    import lightning.pytorch as pl

    return pl.Trainer(
        accelerator="cpu",
        devices=WORLD,
        strategy=strategy,
        max_epochs=epochs,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        **kwargs,
    )


def make_model(conv: str, in_dim: int, num_classes: int) -> FullGraphNodeClassifier:
    torch.manual_seed(0)
    return FullGraphNodeClassifier(
        in_dim, num_classes, conv=conv, hidden=16, num_layers=3, dropout=0.0, lr=1e-2
    )


def reference_run(conv: str, steps: int) -> list[tuple[float, list[torch.Tensor]]]:
    """Single-process full-graph training: losses and weight gradients of the first steps."""
    ds = small_dataset()
    model = make_model(conv, ds.num_features, ds.num_classes)
    block, _ = full_block(ds.graph, torch.arange(ds.num_nodes), exact_operator(ds.graph, model.aggregation))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    out = []
    for _ in range(steps):
        h = ds.features
        for i, layer in enumerate(model.layers):
            h = layer(block, h, h) if conv == "sage" else layer(block, h)
            if i < len(model.layers) - 1:
                h = torch.relu(h)
        loss = torch.nn.functional.cross_entropy(h[ds.train_idx], ds.labels[ds.train_idx])
        opt.zero_grad()
        loss.backward()
        out.append((float(loss.detach()), [p.grad.clone() for p in model.parameters()]))
        opt.step()
    return out


def distributed_run(
    rank: int, conv: str, mode: str, quantize: bool, steps: int, rule=None, smoothing: float = 0.0
):
    """The same training on 4 partitions with halo exchange; gradients averaged as DDP does."""
    ds = small_dataset()
    book = PartitionBook.build(ds.graph, WORLD, "metis", seed=0)
    model = make_model(conv, ds.num_features, ds.num_classes)
    batch = partition_batch(ds, book, rank, model.aggregation)
    ex = HaloExchanger(
        batch.partition,
        Transport(rank, WORLD),
        mode=mode,
        quantize=quantize,
        rule=rule,
        seed=rank,
        smoothing=smoothing,
    )
    batch.halo = ex.with_halo
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    out = []
    best = float("inf")
    for epoch in range(steps):
        ex.begin_epoch(epoch)
        logits = model(batch)
        m = batch.train_mask
        loss = (
            torch.nn.functional.cross_entropy(logits[m], batch.labels[m], reduction="sum") * batch.loss_scale
        )
        opt.zero_grad()
        loss.backward()
        flat = torch.cat([p.grad.reshape(-1) for p in model.parameters()] + [loss.detach().reshape(1)])
        dist.all_reduce(flat)
        flat /= WORLD
        offset = 0
        for p in model.parameters():
            p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
        signals = ex.signals()
        dist.all_reduce(signals)
        first = out[0][0] if out else float(flat[-1])
        ex.end_epoch(signals, float(flat[-1]), best, first)
        best = min(best, float(flat[-1]))
        out.append((float(flat[-1]), [p.grad.clone() for p in model.parameters()]))
        opt.step()
    ages = {k: list(ch.ages) for k, ch in ex.channels.items()}
    history = {k: list(ch.controller.history) for k, ch in ex.channels.items()}
    ex.close()
    return out, ages, history, ex.bytes_sent


def _init(rank: int, port: int) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=WORLD,
        timeout=timedelta(seconds=20),
    )


def equivalence_rank(rank: int, port: int, queue) -> None:
    """Sync mode against the single-process reference, then stale and quantised runs."""
    try:
        _init(rank, port)
        report = {}
        for conv in ("gcn", "sage"):
            report[("sync", conv)] = distributed_run(rank, conv, "sync", False, steps=3)
        report["stale"] = distributed_run(rank, "gcn", "stale", False, steps=4)
        report["smoothed"] = distributed_run(rank, "gcn", "stale", False, steps=4, smoothing=0.8)
        report["pipeqs"] = distributed_run(rank, "gcn", "stale", True, steps=4)
        buffer = io.BytesIO()
        torch.save(report, buffer)  # bytes, not shared-memory tensors: this process exits next
        queue.put((rank, "ok", buffer.getvalue()))
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - reported to the test, which fails with it
        queue.put((rank, "error", traceback.format_exc()))


def dying_rank(rank: int, port: int, queue) -> None:
    """Rank 3 dies in the middle of epoch 2; the others must fail fast with a clear error."""
    try:
        _init(rank, port)
        ds = small_dataset()
        book = PartitionBook.build(ds.graph, WORLD, "metis", seed=0)
        model = make_model("gcn", ds.num_features, ds.num_classes)
        batch = partition_batch(ds, book, rank, model.aggregation)
        group = dist.new_group(backend="gloo", timeout=timedelta(seconds=15))
        ex = HaloExchanger(batch.partition, Transport(rank, WORLD, group), mode="stale")
        batch.halo = ex.with_halo
        start = None
        for epoch in range(4):
            ex.begin_epoch(epoch)
            if epoch == 2:
                start = time.perf_counter()
                if rank == 3:
                    os._exit(1)
            model(batch).sum().backward()
        queue.put((rank, "finished", None))
    except BaseException as err:  # noqa: BLE001
        elapsed = time.perf_counter() - start if start is not None else -1.0
        queue.put((rank, type(err).__name__, f"{err} [after {elapsed:.1f} s]"))


def dying_stage(rank: int, port: int, queue, stages: int = WORLD) -> None:
    """GNNPipe over ``stages`` stages (fewer: the hybrid, ``WORLD // stages`` graph partitions):
    rank 2 dies at the start of epoch 2; the others must fail fast."""
    from lightning_mqgnn.fullgraph import LayerPipeline, PipelineLayout

    try:
        _init(rank, port)
        ds = small_dataset()
        torch.manual_seed(0)
        model = FullGraphNodeClassifier(ds.num_features, ds.num_classes, conv="gcnii", hidden=8, num_layers=4)
        layout = PipelineLayout(WORLD, stages, model.stack.num_convs)
        book = PartitionBook.build(ds.graph, layout.ways, "random", seed=0)
        batch = partition_batch(ds, book, layout.way_of(rank), model.aggregation)
        group = dist.new_group(backend="gloo", timeout=timedelta(seconds=15))
        pipeline = LayerPipeline(batch, model.stack.widths, layout, rank, Transport, group, num_chunks=3)
        start = None
        for epoch in range(4):
            if epoch == 2:
                start = time.perf_counter()
                if rank == 2:
                    os._exit(1)
            pipeline.forward_phase(model.stack, batch, epoch)
            pipeline.backward_phase(model.stack, batch)
        queue.put((rank, "finished", None))
    except BaseException as err:  # noqa: BLE001
        elapsed = time.perf_counter() - start if start is not None else -1.0
        queue.put((rank, type(err).__name__, f"{err} [after {elapsed:.1f} s]"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(target, timeout: float) -> dict[int, tuple[str, object]]:
    """Start the 4 ranks, collect one report from each (or from those alive), kill leftovers."""
    ctx = mp.get_context("fork")  # the ranks inherit the imported modules: no 4x import on 2 cores
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=target, args=(r, port, q), daemon=True) for r in range(WORLD)]
    for p in procs:
        p.start()
    reports: dict[int, tuple[str, object]] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(reports) < WORLD and time.monotonic() < deadline:
            try:
                rank, status, payload = q.get(timeout=0.5)
                reports[rank] = (status, payload)
            except queue_module.Empty:
                if all(not p.is_alive() for p in procs) and q.empty():
                    break
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()
    return reports


def assert_peers_fail_fast(target, dead: int) -> None:
    """Run ``target`` on the ranks, rank ``dead`` dies: every other rank must report a
    HaloExchangeError naming the cause, within 20 s of the death (45 s for the whole launch)."""
    start = time.monotonic()
    reports = launch(target, timeout=60)
    assert time.monotonic() - start < 45
    survivors = {r: v for r, v in reports.items() if r != dead}
    assert sorted(survivors) == [r for r in range(WORLD) if r != dead], reports
    for rank, (status, message) in survivors.items():
        assert status == "HaloExchangeError", f"rank {rank}: {status} {message}"
        assert "peer rank probably died" in message
        elapsed = float(message.rsplit("after ", 1)[1].split(" s]")[0])
        assert 0 <= elapsed < 20, message
