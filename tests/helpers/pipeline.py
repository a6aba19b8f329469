"""Shared helpers of the pipeline tests: a small dataset, samplers that fail on purpose, and
the process-table check."""

from __future__ import annotations

import contextlib
import os
import time

import lightning.pytorch as pl
import psutil
import pytest
import torch

from lightning_mqgnn.data import LoaderSettings, MQGNNDataModule
from lightning_mqgnn.graph.generated import generate_graph
from lightning_mqgnn.sampling.neighbor import NeighborSampler


def small_dataset(num_nodes: int = 1500, seed: int = 0):
    return generate_graph("arxiv", seed=seed, num_nodes=num_nodes, num_features=16, num_classes=4)


def worker_pipeline(ds, sampler=None, mode: str = "pipeline", feature_cache=None, **kw) -> MQGNNDataModule:
    """A pipelined DataModule whose every epoch comes from the sampler workers, for the tests of
    their mechanics (the default producer choice may never start them); ``mode="sequential"``
    gives its twin without a pipeline, for parity tests. ``sampler``: uniform 5,5 node-wise
    sampling unless given; ``feature_cache`` goes to the DataModule, the other ``kw`` to its
    ``LoaderSettings`` (one worker unless they say otherwise)."""
    sampler = sampler if sampler is not None else NeighborSampler(ds.graph, [5, 5])
    kw.setdefault("num_workers", 1)
    settings = LoaderSettings(mode=mode, producer="workers", **kw)
    return MQGNNDataModule(ds, sampler, settings, feature_cache=feature_cache)


class FailInWorkerSampler(NeighborSampler):
    """Raises on its ``fail_on``-th call inside a worker process (never in the parent)."""

    def __init__(self, graph, fanouts, fail_on: int = 3):
        super().__init__(graph, fanouts, "mean")
        self.parent_pid = os.getpid()
        self.fail_on = fail_on
        self.calls = 0

    def sample(self, seeds):
        if os.getpid() != self.parent_pid:
            self.calls += 1
            if self.calls >= self.fail_on:
                raise ValueError(f"injected sampler failure on call {self.calls}")
        return super().sample(seeds)


class SlowSampler(NeighborSampler):
    """Sleeps before sampling: makes the producer the slow stage."""

    def __init__(self, graph, fanouts, delay_s: float):
        super().__init__(graph, fanouts, "mean")
        self.delay_s = delay_s

    def sample(self, seeds):
        time.sleep(self.delay_s)
        return super().sample(seeds)


def alive(pids: list[int]) -> list[int]:
    """The pids among ``pids`` that are still running (zombies count as gone)."""
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def live_children() -> set[int]:
    """Live (non-zombie) descendants of this process: the process table the tests check."""
    out = set()
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                out.add(p.pid)
        except psutil.NoSuchProcess:
            pass
    return out


def assert_gone(pids: list[int], within_s: float = 5.0) -> None:
    deadline = time.monotonic() + within_s
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert alive(pids) == [], f"orphan worker processes: {alive(pids)}"


def assert_same_batches(expected, got) -> None:
    """Two loaders' batches are the same, tensor for tensor."""
    assert len(expected) == len(got) > 0
    for a, b in zip(expected, got):
        assert torch.equal(a.input_nodes, b.input_nodes)
        assert torch.equal(a.output_nodes, b.output_nodes)
        assert torch.equal(a.labels, b.labels)
        for name in ("features", "aggregated"):
            x, y = getattr(a, name), getattr(b, name)
            assert (x is None) == (y is None) and (x is None or torch.equal(x, y)), name
        assert len(a.blocks) == len(b.blocks)
        for p, q in zip(a.blocks, b.blocks):
            assert (p.num_dst, p.num_src, p.dst_in_src) == (q.num_dst, q.num_src, q.dst_in_src)
            assert torch.equal(p.indptr, q.indptr) and torch.equal(p.indices, q.indices)
            assert torch.equal(p.weights, q.weights)


def assert_epochs_agree(expected_loader, loader, epochs=(0, 1)) -> None:
    """``loader`` gives ``expected_loader``'s batches in each of ``epochs``."""
    for epoch in epochs:
        expected_loader.set_epoch(epoch)
        loader.set_epoch(epoch)
        assert_same_batches(list(expected_loader), list(loader))


def drain_raises_within(batches, seconds: float, match: str) -> pytest.ExceptionInfo:
    """Iterating ``batches`` to the end raises a RuntimeError matching ``match`` within ``seconds``."""
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=match) as info:
        for _ in batches:
            pass
    assert time.monotonic() - start < seconds
    return info


def seeded_module(ds, seed: int = 0, hidden: int = 16):
    from lightning_mqgnn.models import NodeClassifier

    torch.manual_seed(seed)
    return NodeClassifier(ds.num_features, ds.num_classes, conv="sage", hidden=hidden, dropout=0.2)


def make_trainer(callbacks=(), **kw):
    """A quiet one-device CPU Trainer without validation; ``kw`` overrides."""
    opts = dict(
        max_epochs=1,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    opts.update(kw)
    return pl.Trainer(callbacks=list(callbacks), **opts)


@contextlib.contextmanager
def cores_and_threads(monkeypatch, cores: int, threads: int):
    """The pipeline sees ``cores`` cores (worker counts and training threads follow from them) and
    torch trains on ``threads``; torch's own count comes back afterwards."""
    from lightning_mqgnn.pipeline import workers

    monkeypatch.setattr(workers.os, "sched_getaffinity", lambda pid: set(range(cores)))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class ThreadsAtValidation(pl.Callback):
    """The training threads at the start of every validation inside fit."""

    def __init__(self):
        self.at_validation: list[int] = []

    def on_validation_start(self, trainer, pl_module):
        if not trainer.sanity_checking:
            self.at_validation.append(torch.get_num_threads())
