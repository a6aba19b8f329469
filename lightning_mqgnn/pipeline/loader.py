"""The pipelined training loader: workers → CPU queue → transfer thread → device queue → training.

The loader stands alone: it makes the batches of a ``BatchSource`` with ``PipelineSettings``,
and learns each epoch's number, ranks, device and whether another epoch follows from an
``EpochPlan`` (a fixed one, advanced with ``set_epoch``, or a function that returns the current
one: ``MQGNNDataModule`` reads it from the Trainer). Without Lightning::

    loader = PipelinedLoader(BatchSource(dataset, sampler, batch_size=512), PipelineSettings())
    for epoch in range(3):
        loader.set_epoch(epoch)
        for batch in loader:
            ...
    loader.shutdown()

Lifecycle (chosen: persistent workers per fit). The worker pool starts at ``prime()`` (the
DataModule's ``setup("fit")``: with the first epoch's first tasks) or else at the first epoch's
``iter()``, and lives until ``shutdown()`` (DataModule ``teardown``/``on_exception``, or garbage
collection). Each epoch runs its own transfer thread; an epoch abandoned early
(``limit_train_batches``, early stopping) is stopped at the next ``iter()`` or at shutdown, and
the workers are drained before the next epoch starts, so the feature cache is refreshed while
they are idle. Batches reach the training loop in index order, whatever worker made them.

Head start: once an epoch has handed all its tasks to the workers, its transfer thread submits
the next epoch's first tasks (up to the CPU queue's capacity), so the next epoch does not open
on empty queues while the last batches train and validation runs. Not with a feature cache
(redrawn per epoch while the workers are idle) nor after the last epoch; an unused head start is
drained like any abandoned task.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch import Tensor

from lightning_mqgnn.pipeline.device_queue import DeviceQueue, QueuedLoader, await_entry, hand_over_batch
from lightning_mqgnn.pipeline.plan import EpochPlan
from lightning_mqgnn.pipeline.produce import sample_batch
from lightning_mqgnn.pipeline.producer_choice import ProducerChoice
from lightning_mqgnn.pipeline.queue_size import AdaptiveQueueSize, QueueSizeEstimate
from lightning_mqgnn.pipeline.settings import PipelineSettings
from lightning_mqgnn.pipeline.source import BatchSource
from lightning_mqgnn.pipeline.transfer import DeviceMover, batch_nbytes
from lightning_mqgnn.pipeline.workers import SamplerWorkerPool, WorkerError, limit_training_threads
from lightning_mqgnn.sampling.batch import MiniBatch
from lightning_mqgnn.sampling.feature_cache import resident_rows

_POLL_S = 0.1
SLOTS_FOR_AUTO_Q = 8  # adaptive Q beyond this uses fresh segments for the surplus batches


@dataclass
class _HeadStart:
    """The next epoch's first tasks, submitted while the current epoch ends."""

    epoch: int
    generation: int
    batches: list[Tensor]
    submitted: int = 0
    results: dict[int, MiniBatch] = field(default_factory=dict)


class PipelinedLoader(QueuedLoader):
    """The training batches of ``source`` through the multi-queue pipeline run by ``settings``.

    ``plan``: the coming epoch's ``EpochPlan``, or a function returning it (asked at every epoch
    start and when a head start for the next epoch is considered).
    """

    def __init__(
        self,
        source: BatchSource,
        settings: PipelineSettings | None = None,
        plan: EpochPlan | Callable[[], EpochPlan] | None = None,
    ):
        settings = settings if settings is not None else PipelineSettings()
        sizer = AdaptiveQueueSize(
            warmup=settings.warmup_batches, window=settings.window_batches, margin=settings.memory_margin
        )
        super().__init__(source, plan, settings.fixed_queue_size, sizer)
        self.settings = settings
        self.num_workers = settings.workers(self.plan().ranks_on_node)
        self.cpu_capacity = settings.cpu_capacity(self.num_workers)
        self.producer_choice = ProducerChoice(settings.producer)
        self.pool: SamplerWorkerPool | None = None
        self.mover: DeviceMover | None = None
        self.generation = 0
        self._head: _HeadStart | None = None
        self._run: _EpochRun | None = None

    @property
    def queue_size_history(self) -> list[QueueSizeEstimate]:
        return self.sizer.history

    def _ensure_mover(self) -> DeviceMover:
        if self.mover is None:
            self.mover = DeviceMover(self.plan().device)
            self.sizer.device = self.mover.device
        return self.mover

    def _ensure_started(self) -> SamplerWorkerPool:
        self._ensure_mover()
        if self.pool is None or not self.pool.running:
            source, settings = self.source, self.settings
            self.pool = SamplerWorkerPool(
                source.sampler,
                source.features,
                source.dataset.labels,
                self.num_workers,
                cache_slot=source.cache_slot,
                start_method=settings.start_method,
                worker_threads=settings.worker_threads,
                # batches alive at once: CPU queue, device queue, and a few held by the trainer
                max_slots=self.cpu_capacity + (self.fixed_q or SLOTS_FOR_AUTO_Q) + 4,
                pin_slots=self.mover.cuda,  # the CPU queue in page-locked memory
                input_aggregation=source.input_aggregation,
            )
            if self.pool.start_method != "fork":
                # once: spawned workers then map the graph instead of unpickling copies
                source.dataset.share_memory_()
            if (
                source.feature_cache is None
            ):  # (with a cache, the rows to gather depend on the draw of each epoch)
                self._size_slots()
            self.pool.start()
        return self.pool

    def _seeds(self, plan: EpochPlan, epoch: int) -> list[Tensor]:
        return self.source.epoch_seeds(epoch, plan.rank, plan.world_size)

    def _size_slots(self) -> None:
        """Sample the coming epoch's first batch here, once, so the first tasks already get slots."""
        plan = self.plan()
        seeds = self._seeds(plan, plan.epoch)
        if not seeds:
            return
        with torch.random.fork_rng(devices=[]):  # the model's random stream stays untouched
            probe = sample_batch(self.source.sampler, seeds[0], self.source.rng_seed(plan.epoch, 0), 0)
        self.pool.size_slots(probe)

    def __iter__(self) -> Iterator[MiniBatch]:
        """A new epoch; it starts at its first ``next()`` (Lightning also calls ``iter()`` once
        just to check that the loader is iterable)."""
        self.close_epoch()
        self._run = _EpochRun(self, self._next_generation())
        return self._run

    def _next_generation(self) -> int:
        """A tag no other epoch run or head start has: results carry it, stale ones are dropped."""
        self.generation += 1
        return self.generation

    def prime(self) -> None:
        """Start the workers and a head start for the coming epoch now (``setup("fit")``), so the
        first epoch's first batches are made while Lightning sets up and runs its sanity check.
        Called from the training thread before any epoch runs: it submits the tasks itself.
        Nothing to do while the training thread is to produce the first epoch."""
        if self.producer_choice.producer() != "workers":
            return
        self._ensure_started()
        plan = self.plan()
        head = self._open_head_start(plan, plan.epoch)
        if head is not None:
            self._submit_head(head)

    def _submit_head(self, head: _HeadStart, held: int = 0) -> None:
        """Submit ``head``'s next tasks while the CPU queue has room; ``held``: results of the
        running epoch not yet handed on. A head start never exceeds the CPU queue's capacity."""
        last = min(len(head.batches), self.cpu_capacity)
        while head.submitted < last and self.pool.in_flight + held + len(head.results) < self.cpu_capacity:
            rng = self.source.rng_seed(head.epoch, head.submitted)
            self.pool.submit(head.generation, head.submitted, head.batches[head.submitted], rng)
            head.submitted += 1

    def _begin_epoch(self) -> tuple[EpochPlan, list[Tensor], int, _HeadStart | None, str]:
        """The epoch's plan, seeds and first batch, the head start it opens on (if any), and who
        makes its batches."""
        plan = self.plan()
        epoch = plan.epoch
        producer = self.producer_choice.producer()
        head, self._head = self._head, None
        seeds = head.batches if head is not None and head.epoch == epoch else self._seeds(plan, epoch)
        first = self.first_batch(plan, len(seeds))
        if producer == "workers":
            self._ensure_started()
            if head is not None and head.epoch == epoch and first == 0:
                return plan, head.batches, first, head, producer
        else:
            self._ensure_mover()
            if self.producer_choice.chosen == "trainer" and self.pool is not None:
                self.pool.stop()  # chosen for good: the workers would only hold memory
                self.pool = None
        if self.pool is not None:
            self.pool.drain()  # workers idle: safe to refresh the shared cache slots
        cache = self.source.feature_cache
        if cache is not None:
            cache.refresh_(epoch)
            self.mover.set_cache(resident_rows(cache, self.source.dataset.features, self.mover.device))
        return plan, seeds, first, None, producer

    def _open_head_start(self, plan: EpochPlan, epoch: int) -> _HeadStart | None:
        """A head start for ``epoch`` if one is worth it (by the ending epoch's thread, or ``prime``)."""
        if self.source.feature_cache is not None or not plan.will_run(epoch):
            return None
        if self.producer_choice.producer() != "workers":
            return None
        self._head = _HeadStart(epoch, self._next_generation(), self._seeds(plan, epoch))
        return self._head

    def close_epoch(self) -> None:
        """Stop the current epoch's transfer thread (its in-flight tasks are drained later)."""
        if self._run is not None:
            self._run.stop()
            self._run = None

    def shutdown(self, timeout: float = 5.0) -> None:
        """Stop the transfer thread and every worker; safe to call repeatedly."""
        self.close_epoch()
        self._head = None
        if self.pool is not None:
            self.pool.stop(timeout)
            self.pool = None

    def worker_pids(self) -> list[int]:
        return self.pool.pids() if self.pool is not None else []

    def __del__(self):
        with contextlib.suppress(Exception):
            self.shutdown(timeout=1.0)


class _EpochRun:
    """One epoch: a transfer thread feeding the device queue, and the iterator the trainer reads."""

    def __init__(self, loader: PipelinedLoader, generation: int):
        self.loader = loader
        self.generation = generation
        self.epoch = -1
        self.ranks_on_node = 1
        self.batches: list[Tensor] = []
        self.queue = DeviceQueue(loader.queue_size)
        self.stop_event = threading.Event()
        self.done = False
        self._last_return: float | None = None
        self._thread: threading.Thread | None = None
        self._threads_before: int | None = None
        self._opened_by: _HeadStart | None = None
        self.producer: str | None = None  # "workers" or "trainer", fixed at the epoch's start
        self.first = 0  # the epoch's first batch (after a resume inside it, not 0)
        self._next_index = 0  # the next batch the training thread makes itself

    def _start(self) -> None:
        plan, self.batches, self.first, self._opened_by, self.producer = self.loader._begin_epoch()
        self.epoch, self.ranks_on_node = plan.epoch, plan.ranks_on_node
        self._next_index = self.first
        if self.producer == "trainer":
            return  # the training thread makes every batch, on every core: no transfer thread
        if self._opened_by is not None:
            self.generation = self._opened_by.generation  # its tasks' results carry that tag
        # while the workers run, train on the cores they leave free; validation and test after
        # the epoch get every thread back
        self._narrow_threads()
        self._thread = threading.Thread(target=self._produce, name="mqgnn-transfer", daemon=True)
        self._thread.start()

    # ----- producer: the transfer thread
    def _produce(self) -> None:
        loader, pool, mover = self.loader, self.loader.pool, self.loader.mover
        source = loader.source
        n = len(self.batches)
        opened_by = self._opened_by
        # reorder buffer: results arrive in completion order (a head start's are already in)
        pending: dict[int, MiniBatch] = opened_by.results if opened_by is not None else {}
        submitted = opened_by.submitted if opened_by is not None else self.first
        head: _HeadStart | None = None  # the next epoch's, once this one's tasks are all out
        head_asked = False
        out = self.first

        def top_up_head() -> None:
            nonlocal head, head_asked
            if not head_asked:
                head, head_asked = loader._open_head_start(loader.plan(), self.epoch + 1), True
            if head is not None:
                loader._submit_head(head, held=len(pending))

        try:
            while out < n:
                if self.stop_event.is_set():
                    return
                while submitted < n and pool.in_flight + len(pending) < loader.cpu_capacity:
                    rng = source.rng_seed(self.epoch, submitted)
                    pool.submit(self.generation, submitted, self.batches[submitted], rng)
                    submitted += 1
                if submitted == n:
                    top_up_head()
                batch = pending.pop(out, None)
                if batch is None:
                    try:
                        result = pool.get(timeout=_POLL_S)
                    except queue.Empty:
                        continue
                    if result.generation == self.generation:
                        pending[result.index] = result.batch
                    elif head is not None and result.generation == head.generation:
                        head.results[result.index] = result.batch
                    continue
                cpu_depth = pool.in_flight + len(pending) + 1
                t0 = time.perf_counter()
                dev, event = mover.to_device(batch)
                if event is not None:
                    # only this thread waits (to time the copy); compute never does. The copy reads
                    # a page-locked slot in place, and the slot is lent again once `batch` is gone
                    event.synchronize()
                transfer_s = time.perf_counter() - t0
                dev.meta.update(
                    transfer_s=transfer_s, cpu_queue_depth=cpu_depth, batch_bytes=batch_nbytes(dev)
                )
                loader.sizer.observe_prep(dev.meta["sample_s"] + dev.meta["gather_s"] + transfer_s)
                if not self.queue.put((dev, event), self.stop_event):
                    return
                out += 1
            if n > self.first:
                top_up_head()  # the budget this epoch's last batches held
            self.queue.finish()
        except BaseException as exc:  # surfaces in the training thread at its next batch request
            self.queue.fail(exc)

    # ----- consumer: the training thread
    def __iter__(self) -> _EpochRun:
        return self

    def __len__(self) -> int:
        return len(self.loader)

    def __next__(self) -> MiniBatch:
        if self.done:
            raise StopIteration
        loader = self.loader
        if self.producer is None:
            self._start()
        if self.producer == "trainer":
            return self._produce_here()
        request, kind, payload = await_entry(
            loader, self.queue, self._thread, "mini-batch transfer", self._last_return, self.stop
        )
        if kind == "end":
            self.done = True
            self._restore_threads()
            raise StopIteration
        if kind == "error":
            self.done = True
            loader.shutdown(timeout=1.0)
            if isinstance(payload, WorkerError):
                raise WorkerError(str(payload)) from None
            raise RuntimeError(f"the mini-batch pipeline failed: {payload!r}") from payload
        batch = hand_over_batch(
            loader,
            self.queue,
            payload,
            request,
            epoch=self.epoch,
            producer="workers",
            head_start=self._opened_by is not None,  # the epoch opened on a head start
        )
        index = batch.meta["index"]
        if index == len(self.batches) - 1:
            # the workers have nothing left to sample: the last step, and the validation Lightning
            # runs before it ever asks past a sized loader's end, get every thread back
            self._restore_threads()
        self._returned(index)
        loader.handed_out(index)
        return batch

    def _produce_here(self) -> MiniBatch:
        """The next batch, sampled and gathered in the training thread (the sequential loop's way).
        While the producer choice probes, the step after it runs on the threads the workers would
        leave, and is timed at the next request."""
        index = self._next_index
        if index >= len(self.batches):
            self.done = True
            self._restore_threads()
            raise StopIteration
        loader = self.loader
        choice = loader.producer_choice
        start = time.perf_counter()
        after_narrow_step = self._threads_before is not None  # the probe's narrowing, in this mode
        if after_narrow_step:
            choice.observe_narrow_step(start - self._last_return)
            self._restore_threads()
        batch = loader.source.produce_here(self.epoch, index, self.batches[index])
        batch = loader.mover.hand_over(*loader.mover.to_device(batch))
        batch.meta.update(wait_s=time.perf_counter() - start, epoch=self.epoch, producer="trainer")
        self._next_index += 1
        self._returned(index, timed=not after_narrow_step, produce_s=batch.meta["wait_s"])
        loader.handed_out(index)
        # never the epoch's last step: validation may follow it, on every thread
        if choice.probing() and index < len(self.batches) - 1:
            self._narrow_threads()
        return batch

    def _returned(self, index: int, timed: bool = True, produce_s: float | None = None) -> None:
        """Batch ``index`` goes to the training loop: time it since the previous one (step + wait),
        unless that step ran on fewer threads than the producer's epochs train on; ``produce_s``:
        the training thread's sampling and gathering of it."""
        now = time.perf_counter()
        if self._last_return is not None and timed:
            self.loader.producer_choice.observe(self.producer, index, now - self._last_return, produce_s)
        self._last_return = now

    def _narrow_threads(self) -> None:
        """Train on the threads the workers leave (``_restore_threads`` gives the rest back)."""
        self._threads_before = torch.get_num_threads()
        loader = self.loader
        limit_training_threads(self.ranks_on_node, loader.num_workers, loader.settings.worker_threads)

    def _restore_threads(self) -> None:
        if self._threads_before is not None:
            torch.set_num_threads(self._threads_before)
            self._threads_before = None

    def stop(self) -> None:
        self.stop_event.set()
        self.done = True
        self._restore_threads()
        thread = self._thread
        if thread is not None and thread.is_alive() and threading.current_thread() is not thread:
            thread.join(5.0)

    def __del__(self):
        self.stop_event.set()
