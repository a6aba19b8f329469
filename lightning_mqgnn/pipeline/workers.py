"""Sampler worker processes: the producers of the CPU mini-batch queue (paper Fig. 1, stage 3).

Each worker receives small tasks (batch index + seed ids, and the number of a shared-memory slot
lent by the trainer) and writes a sampled, gathered mini-batch into that slot (``packing``).
Every worker has its own task queue, so the trainer knows which slots a worker already holds and
sends each slot's tensor to a worker only once (and again after the slot is reallocated): a
tensor in a queue travels as a file descriptor fetched from the trainer's resource-sharer thread
over a socket, a round trip that waits for the trainer's GIL. Sent with every task, it leaves
the worker idle several times longer than a slot named by number does. The graph and
the feature matrix are never copied per worker: a forked worker maps the parent's pages, a
spawned one receives shared-memory handles (``GraphDataset.share_memory_()``).

Start method (``choose_start_method``): ``fork`` on Linux for single-threaded workers, the
default: no re-import, the sampler object is inherited as is, and the workers are up in
milliseconds. Workers only sample and gather on the CPU, so a CUDA context initialised in the
parent is never touched by them (torch's DataLoader forks the same way; a worker that did call
CUDA would fail with "Cannot re-initialize CUDA in forked subprocess", not hang), whereas
*spawned* workers re-import torch and can take longer to start than an epoch lasts.
Multi-threaded workers use ``forkserver`` (OpenMP after fork can deadlock); other systems ``spawn``.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import signal
import sys
import time
import traceback
import weakref
from dataclasses import dataclass

import numpy as np
import torch
import torch.multiprocessing as mp
from torch import Tensor

from lightning_mqgnn.graph.mapped_pages import MappedArray, mapped_source, opened
from lightning_mqgnn.pipeline.child_signals import ignore_parent_signals
from lightning_mqgnn.pipeline.gather import batch_gathers
from lightning_mqgnn.pipeline.host_cache import TieredFeatures, opened_features, worker_features
from lightning_mqgnn.pipeline.packing import PackedBatch, SlotArena, pack_batch, packed_nbytes, unpack_batch
from lightning_mqgnn.pipeline.produce import sample_batch
from lightning_mqgnn.sampling.base import Sampler
from lightning_mqgnn.sampling.batch import MiniBatch

START_METHODS = ("auto", "fork", "spawn", "forkserver")
_POLL_S = 0.2


class WorkerError(RuntimeError):
    """A sampler worker raised or died; the message names the worker and carries its traceback."""


@dataclass
class WorkerResult:
    """A batch (or a worker's failure) coming back from the CPU queue."""

    generation: int
    index: int
    batch: PackedBatch | MiniBatch | None = None  # packed on the way, unpacked by ``get``
    error: str | None = None
    worker: int = -1
    slot: int = -1  # the arena slot lent with the task (-1: none)


def cores_per_rank(ranks_on_node: int = 1) -> int:
    """This rank's share of the cores it may run on."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, cores // max(1, ranks_on_node))


def default_num_workers(ranks_on_node: int = 1) -> int:
    """Cores this rank may use, less one for the training loop (at least one worker)."""
    return max(1, cores_per_rank(ranks_on_node) - 1)


def limit_training_threads(ranks_on_node: int, num_workers: int, worker_threads: int) -> int:
    """Lower the training process's intra-op threads to the cores the workers leave free.

    Oversubscribed OpenMP threads spin-wait for each other: with a core shared between a sampler
    worker and a second training thread, small kernels run several times slower than with one.
    """
    free = max(1, cores_per_rank(ranks_on_node) - num_workers * worker_threads)
    if torch.get_num_threads() > free:
        torch.set_num_threads(free)
    return torch.get_num_threads()


def check_start_method(start_method: str, worker_threads: int = 1) -> None:
    """Refuse unknown start methods, and forked workers with several threads (see below)."""
    if start_method not in START_METHODS:
        raise ValueError(f"start_method must be one of {START_METHODS}, got {start_method!r}")
    if start_method == "fork" and worker_threads > 1:
        raise ValueError(
            f"worker_threads={worker_threads} with start_method='fork': OpenMP in a forked worker can "
            "deadlock; use start_method='forkserver' or 'spawn' (or 'auto'), or worker_threads=1"
        )


def choose_start_method(start_method: str = "auto", worker_threads: int = 1) -> str:
    """``fork`` on Linux for single-threaded workers, else ``forkserver``/``spawn``.

    A forked child inherits the parent's OpenMP thread pool in a broken state: with more than one
    intra-op thread its first parallel kernel can wait forever (seen: parent at 4 threads, worker
    at 3, no batch ever came back). Multi-threaded workers therefore start from a clean process.
    """
    check_start_method(start_method, worker_threads)
    if start_method != "auto":
        return start_method
    if not sys.platform.startswith("linux"):
        return "spawn"
    return "fork" if worker_threads == 1 else "forkserver"


def _parent_gone(ppid: int) -> bool:
    """The process that started this worker is gone: the parent changed (fork, spawn: the trainer;
    forkserver: the server, which exits with the trainer), or the parent's sentinel pipe closed."""
    if os.getppid() != ppid:
        return True
    parent = multiprocessing.parent_process()
    return parent is not None and not parent.is_alive()


def _worker_main(
    worker_id: int,
    sampler: Sampler,
    features: Tensor | MappedArray | TieredFeatures,
    labels: Tensor | MappedArray,
    cache_slot: Tensor | None,
    input_aggregation: str | None,
    tasks: mp.Queue,
    results: mp.Queue,
    num_threads: int,
) -> None:
    """Worker loop: take a task, produce its batch, put it on the result queue; ``None`` stops.

    Any exception is sent back with its formatted traceback and ends the worker. A worker whose
    parent died (even by SIGKILL) notices within ``_POLL_S`` and exits: no orphans.
    """
    ignore_parent_signals()  # the parent handles them and stops us
    ppid = os.getppid()
    torch.set_num_threads(num_threads)
    features, labels = opened_features(features), opened(labels)
    # Every lent slot stays referenced here: torch then finds its mapping in the shared-storage
    # cache when the slot comes back with a later task, instead of mapping (and page-faulting)
    # it again, which would cost more than the gather itself.
    lent: dict[int, Tensor] = {}
    while True:
        try:
            task = tasks.get(timeout=_POLL_S)
        except queue.Empty:
            if _parent_gone(ppid):
                return
            continue
        if task is None:
            return
        generation, index, seeds, rng_seed, slot_id, slot = task
        if slot is not None:
            lent[slot_id] = slot
        elif slot_id >= 0:
            slot = lent[slot_id]  # sent with an earlier task
        try:
            batch = sample_batch(sampler, torch.from_numpy(seeds), rng_seed, index)
            t0 = time.perf_counter()
            # gather the rows straight into the lent slot (or a fresh segment): no extra copy
            gathers = batch_gathers(batch, features, labels, cache_slot, input_aggregation)
            batch.meta["worker"] = worker_id
            packed = pack_batch(batch, gathers, slot, slot_id)
            batch.meta["gather_s"] = time.perf_counter() - t0
            results.put(WorkerResult(generation, index, batch=packed, worker=worker_id, slot=slot_id))
        except BaseException:
            results.put(WorkerResult(generation, index, error=traceback.format_exc(), worker=worker_id))
            break
    # Failed: stay alive until told to stop. The batches this worker already sent are shared
    # by file descriptor and can only be received while it is still running.
    while True:
        try:
            if tasks.get(timeout=_POLL_S) is None:
                return
        except queue.Empty:
            if _parent_gone(ppid):
                return


def _stop_processes(procs: list, task_queues: list, timeout: float) -> None:
    """Sentinel, join with a deadline, then terminate, then kill."""
    for tasks in task_queues:
        try:
            tasks.put_nowait(None)
        except Exception:  # a closed or broken queue: the escalation below still stops them
            continue
    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.terminate()
            p.join(1.0)
        if p.is_alive():
            p.kill()
            p.join(1.0)


def describe_exit(exitcode: int | None) -> str:
    if exitcode is None:
        return "is still running"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"was killed by {name} (exit code {exitcode})"
    return f"exited with code {exitcode}"


class SamplerWorkerPool:
    """``num_workers`` processes turning tasks into gathered mini-batches.

    ``submit`` and ``get`` are called from one thread (the transfer thread); ``stop`` from any.
    ``in_flight`` counts submitted tasks whose result has not been taken yet, which is what
    bounds the CPU queue; a task goes to the worker with the fewest in flight. Up to
    ``max_slots`` reusable shared-memory slots (``SlotArena``) are lent with the tasks; size it
    to the batches alive at once (CPU queue + device queue + the ones training holds), beyond
    that batches use fresh segments. ``pin_slots``: page-lock the slots for CUDA copies.
    """

    def __init__(
        self,
        sampler: Sampler,
        features: Tensor | TieredFeatures,
        labels: Tensor,
        num_workers: int,
        cache_slot: Tensor | None = None,
        start_method: str = "auto",
        worker_threads: int = 1,
        max_slots: int = 0,
        pin_slots: bool = False,
        input_aggregation: str | None = None,
    ):
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        if worker_threads < 1:
            raise ValueError(f"worker_threads must be >= 1, got {worker_threads}")
        self.sampler = sampler
        self.features = features
        self.labels = labels
        self.cache_slot = cache_slot
        self.input_aggregation = input_aggregation
        self.num_workers = num_workers
        self.start_method = choose_start_method(start_method, worker_threads)
        self.worker_threads = worker_threads
        self.arena = SlotArena(max_slots, pin=pin_slots)  # max_slots=0: every batch in a fresh segment
        self.procs: list = []
        self._tasks: list = []  # one queue per worker
        self._results = None
        self._in_flight_per: list[int] = []
        self._slots_sent: list[dict[int, int]] = []  # per worker: slot id -> version it holds
        self._finalizer = None

    @property
    def running(self) -> bool:
        return bool(self.procs)

    @property
    def in_flight(self) -> int:
        return sum(self._in_flight_per)

    def size_slots(self, probe: MiniBatch) -> None:
        """Size the slots from ``probe``, a batch sampled here, before any result came back:
        else the first tasks (up to the CPU queue's capacity, 2K by default) each go out in a fresh
        segment, created and page-faulted per batch and unmapped on the training thread."""
        if self.arena.slot_bytes == 0:
            self.arena.observe(
                packed_nbytes(
                    probe,
                    batch_gathers(probe, self.features, self.labels, self.cache_slot, self.input_aggregation),
                )
            )

    def start(self) -> None:
        if self.procs:
            return
        ctx = mp.get_context(self.start_method)
        self._tasks = [ctx.Queue() for _ in range(self.num_workers)]
        self._results = ctx.Queue()
        self._in_flight_per = [0] * self.num_workers
        self._slots_sent = [{} for _ in range(self.num_workers)]
        # a memory-mapped array goes as its file, mapped again there: the page cache is shared
        features = worker_features(self.features)
        labels = mapped_source(self.labels) or self.labels
        disk = features.disk if isinstance(features, TieredFeatures) else features
        for t in (disk, labels, self.cache_slot):
            if isinstance(t, Tensor) and not t.is_shared():
                t.share_memory_()  # in place: a refresh of the cache slots stays visible to workers
        for i in range(self.num_workers):
            p = ctx.Process(
                target=_worker_main,
                args=(
                    i,
                    self.sampler,
                    features,
                    labels,
                    self.cache_slot,
                    self.input_aggregation,
                    self._tasks[i],
                    self._results,
                    self.worker_threads,
                ),
                name=f"mqgnn-sampler-{i}",
                daemon=True,
            )
            p.start()
            self.procs.append(p)
        # last line of defence: stop the workers when the pool is collected or at exit
        self._finalizer = weakref.finalize(self, _stop_processes, list(self.procs), list(self._tasks), 2.0)

    def submit(self, generation: int, index: int, seeds: Tensor, rng_seed: int) -> None:
        worker = min(range(self.num_workers), key=self._in_flight_per.__getitem__)
        lent = self.arena.acquire()
        slot_id, slot = -1, None  # no slot (unsized or all lent): the batch comes in a fresh segment
        if lent is not None:
            slot_id, version, slot = lent
            if self._slots_sent[worker].get(slot_id) == version:
                slot = None  # the worker holds this slot already: send its number only
            else:
                self._slots_sent[worker][slot_id] = version
        seeds_np = np.ascontiguousarray(seeds.numpy())
        self._tasks[worker].put((generation, index, seeds_np, rng_seed, slot_id, slot))
        self._in_flight_per[worker] += 1

    def get(self, timeout: float) -> WorkerResult:
        """Next result in completion order; raises ``WorkerError`` if a worker failed or died,
        ``queue.Empty`` on timeout."""
        try:
            result: WorkerResult = self._results.get(timeout=timeout)
        except queue.Empty:
            self.check_alive()
            raise
        except (ConnectionError, EOFError, OSError):
            # a tensor's sender died before we received it: report the dead worker, not the socket
            time.sleep(_POLL_S)
            self.check_alive()
            raise
        self._in_flight_per[result.worker] -= 1
        if result.error is not None:
            if result.slot >= 0:
                self.arena.release(result.slot)
            raise WorkerError(
                f"sampler worker {result.worker} raised while producing batch {result.index}:\n{result.error}"
            )
        packed: PackedBatch = result.batch
        self.arena.observe(packed.nbytes, result.slot if packed.slot < 0 else -1)
        if packed.slot >= 0:
            packed.buffer = self.arena.claim(packed.slot, packed.nbytes)
        result.batch = unpack_batch(packed)
        return result

    def check_alive(self) -> None:
        for i, p in enumerate(self.procs):
            if not p.is_alive():
                raise WorkerError(f"sampler worker {i} (pid {p.pid}) {describe_exit(p.exitcode)}")

    def drain(self, timeout: float = 30.0) -> None:
        """Wait for every in-flight task and drop its result, so the workers are idle."""
        deadline = time.monotonic() + timeout
        while self.in_flight > 0:
            if time.monotonic() > deadline:
                raise WorkerError(f"sampler workers did not finish {self.in_flight} tasks in {timeout} s")
            try:
                self.get(timeout=_POLL_S)
            except queue.Empty:
                continue

    def stop(self, timeout: float = 5.0) -> None:
        """Stop every worker (sentinel, join, terminate, kill) and release the queues."""
        if not self.procs:
            return
        if self._finalizer is not None:
            self._finalizer.detach()
        _stop_processes(self.procs, self._tasks, timeout)
        for q in [*self._tasks, self._results]:
            q.cancel_join_thread()  # never block interpreter exit on an unread queue
            q.close()
        self.procs = []
        self._tasks, self._results, self._in_flight_per = [], None, []

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]
