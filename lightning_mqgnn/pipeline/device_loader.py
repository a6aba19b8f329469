"""The device-resident loader: sample and gather where the model trains, no host in the loop.

The graph (CSR and sampler state, ``residency.to_device``) is moved to the training device once;
the feature matrix too when the placement allows (``placement.Placement``), else rows are
gathered in host memory and copied over, a GNS cache's rows kept on the device. Each epoch a
producer thread samples and gathers every batch on a dedicated stream (CUDA: a
``torch.cuda.Stream``; CPU: no stream, the same code) into a bounded ``DeviceQueue`` of Q batches,
recording an event after each; the training thread makes its stream wait on that event
(``DeviceMover.hand_over``) instead of synchronising the host. Q is fixed or eq. 24-25
(``AdaptiveQueueSize``) as in the multi-queue pipeline. With ``device_sampler="process"`` the
thread relays batches that sampler processes make from the same resident graph
(``sampler_process.py``), so sampling no longer shares the training loop's interpreter.

Batches are seeded per (seed, epoch, batch index) and drawn from a generator on the sampling
device (``rng.drawing_from``), never the default one the training thread's dropout uses: on the
CPU the batches are exactly ``SequentialLoader``'s; on a GPU they follow the same law from the
device's own random stream (Philox), so they are other draws.

Host syncs left on the sampling path: each is a wait of the producer thread for the device, not of
the compute stream, for a value or an output size torch must know on the host. Counted per batch by
call site with ``recipes/bench.py device_sampling`` (its census; on a GPU also CUDA's sync debug
mode), they are, per node-wise layer on a GPU: the layer's edge total and one ``unique`` of the new
sources (on the CPU none: the draws and the relabelling are compiled passes, ``cpu_kernels``); per
layer-wise layer: ``row_positions`` of ``L[prev, :]``, the distinct draws (``_first_occurrences``),
the kept entries' ``nonzero``, FastGCN's guide-table ``nonzero`` or LADIES' ``total > 0`` check;
for GNS also the cache ``version`` and the cached sub-CSR's empty rows; with host features the
cache ``lookup``'s hit count and the copy of the input ids to the host. SAGE with fan-outs 15,10,5:
6 a batch on a GPU.
``device_sampling`` reports the sampling and gathering time per batch they cost.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator

import torch
from torch import Tensor

from lightning_mqgnn.pipeline.device_queue import DeviceQueue, QueuedLoader, await_entry, hand_over_batch
from lightning_mqgnn.pipeline.placement import Placement, decide_placement, free_device_memory
from lightning_mqgnn.pipeline.plan import EpochPlan
from lightning_mqgnn.pipeline.queue_size import AdaptiveQueueSize
from lightning_mqgnn.pipeline.resident import ResidentGraph, produce_resident
from lightning_mqgnn.pipeline.sampler_process import SamplerProcesses
from lightning_mqgnn.pipeline.settings import check_device_sampler, check_queue_size
from lightning_mqgnn.pipeline.source import BatchSource
from lightning_mqgnn.pipeline.transfer import DeviceMover, batch_nbytes
from lightning_mqgnn.sampling.batch import MiniBatch
from lightning_mqgnn.sampling.feature_cache import resident_rows
from lightning_mqgnn.sampling.residency import copy_state_, state_nbytes

log = logging.getLogger(__name__)
SCRATCH_BYTES_PER_NODE = 24  # the samplers' [N] scratch arrays (relabel slots, bitmaps, sums)


def resident_sizes(source: BatchSource) -> tuple[int, int]:
    """``(graph_bytes, feature_bytes)`` a device-resident run puts on the device: the sampler's
    state with its scratch arrays, the cache and the labels; the feature matrix."""
    ds = source.dataset
    state = state_nbytes((source.sampler, source.feature_cache, ds.labels))
    graph_bytes = state + SCRATCH_BYTES_PER_NODE * ds.num_nodes
    return graph_bytes, ds.features.numel() * ds.features.element_size()


def resolve_placement(
    source: BatchSource, sample_on: str, features_on: str, device: torch.device | str, margin: float
) -> Placement:
    """``decide_placement`` for ``source`` trained on ``device``, from its free memory now."""
    graph_bytes, feature_bytes = resident_sizes(source)
    return decide_placement(
        sample_on,
        features_on,
        graph_bytes=graph_bytes,
        feature_bytes=feature_bytes,
        device=device,
        free_bytes=free_device_memory(device),
        margin=margin,
    )


class DeviceResidentLoader(QueuedLoader):
    """The training batches of ``source``, sampled and gathered on ``placement.sample_on`` by a
    producer thread into a device queue of ``queue_size`` batches (int, or ``"auto"``: eq. 24-25).

    ``plan``: as ``PipelinedLoader``'s; each rank samples its own share of the seeds
    (``plan.rank``/``world_size``) on its own device. The graph moves at the first epoch and
    stays until the loader is collected; ``shutdown`` stops the running epoch's thread and the
    sampler processes. ``device_sampler="process"``: ``sampler_processes`` spawned processes
    sample and the thread relays their batches (``sampler_process``).
    """

    def __init__(
        self,
        source: BatchSource,
        placement: Placement | None = None,
        queue_size: int | str = 2,
        plan: EpochPlan | Callable[[], EpochPlan] | None = None,
        memory_margin: float = 0.1,
        device_sampler: str = "thread",
        sampler_processes: int = 2,
    ):
        check_queue_size(queue_size)
        check_device_sampler(device_sampler, sampler_processes)
        self.device_sampler = device_sampler
        fixed_q = None if queue_size == "auto" else int(queue_size)
        super().__init__(source, plan, fixed_q, AdaptiveQueueSize(margin=memory_margin))
        self.placement = placement if placement is not None else Placement()
        self.sizer.device = self.placement.sample_on
        self.mover = DeviceMover(self.placement.sample_on)
        self.resident: ResidentGraph | None = None
        self.sampler_processes = sampler_processes
        self.process: SamplerProcesses | None = None
        if device_sampler == "process":
            self._start_processes()
        self._run: _DeviceEpoch | None = None

    def __iter__(self) -> Iterator[MiniBatch]:
        self.close_epoch()
        self._run = _DeviceEpoch(self)
        return self._run

    def begin_epoch(self) -> tuple[int, list[Tensor], int]:
        """Residency (once), the epoch's cache draw on the device; the epoch, the seeds of this
        rank and the batch it starts at."""
        if self.resident is None:
            self.resident = ResidentGraph.build(self.source, self.placement)
        if self.device_sampler == "process" and self.process is None:
            self._start_processes()
        if self.process is not None and not self.process.shared:
            self.process.share(self.resident, self.source.input_aggregation)
        plan = self.plan()
        cache = self.source.feature_cache
        if self.mover.cuda:  # nothing the last producer launched still reads what is rewritten here
            torch.cuda.current_stream(self.mover.device).wait_stream(self.mover.stream)
        if cache is not None:
            cache.refresh_(plan.epoch)  # in place on the host, while no producer samples ...
            copy_state_(self.resident.cache, cache)  # ... then into the device copy
            if not self.resident.features_resident:
                self.mover.set_cache(resident_rows(cache, self.resident.features, self.resident.device))
        if self.mover.cuda:
            # the producer's stream reads what this thread copied over on its own stream
            self.mover.stream.wait_stream(torch.cuda.current_stream(self.mover.device))
        seeds = self.source.epoch_seeds(plan.epoch, plan.rank, plan.world_size)
        return plan.epoch, seeds, self.first_batch(plan, len(seeds))

    def _start_processes(self) -> None:
        """Spawn the sampler processes now, so they import and set up while the graph moves;
        where they cannot serve this source, say why and keep the thread."""
        if self.source.feature_cache is not None or not self.placement.features_resident:
            why = "a feature cache" if self.source.feature_cache is not None else "features on the host"
            log.info(
                "device_sampler=process needs resident features and no feature cache; %s: a thread samples",
                why,
            )
            self.device_sampler = "thread"
            return
        device = self.placement.sample_on
        if device.type == "cuda" and device.index is None:  # "cuda": the current device, by index
            device = torch.device("cuda", torch.cuda.current_device())
        self.process = SamplerProcesses(device, self.sampler_processes)

    def epoch_batches(
        self, epoch: int, seeds: list[Tensor], stop: threading.Event, first: int = 0
    ) -> Iterator[MiniBatch]:
        """The epoch's batches in order from batch ``first``, each finished on the producer
        stream (the caller's current stream) with its production time in ``meta["prep_s"]``:
        made here, or by the sampler process and copied here."""
        indices = range(first, len(seeds))
        if self.process is not None:
            requests = [(i, seeds[i], self.source.rng_seed(epoch, i)) for i in indices]
            yield from self.process.batches(requests, self.queue_size, stop)
            return
        for index in indices:
            if stop.is_set():
                return
            t0 = time.perf_counter()
            batch = self.produce(epoch, index, seeds[index])
            if self.mover.cuda:
                self.mover.stream.synchronize()  # only this thread waits: times the batch, bounds memory
            batch.meta["prep_s"] = time.perf_counter() - t0
            yield batch

    def produce(self, epoch: int, index: int, seeds: Tensor) -> MiniBatch:
        """Batch ``index`` of ``epoch``, sampled and gathered on the device (the producer's work)."""
        r = self.resident
        aggregation = self.source.input_aggregation
        return produce_resident(
            r, seeds, self.source.rng_seed(epoch, index), index, aggregation, self.mover.cache
        )

    def close_epoch(self) -> None:
        if self._run is not None:
            self._run.stop()
            self._run = None

    def shutdown(self) -> None:
        """Stop the producer thread and the sampler process (idempotent); the resident graph
        stays for a later epoch, which starts a new process."""
        self.close_epoch()
        if self.process is not None:
            self.process.close()
            self.process = None

    def producer_alive(self) -> bool:
        run = self._run
        thread_alive = run is not None and run.thread is not None and run.thread.is_alive()
        return thread_alive or (self.process is not None and self.process.alive())

    def __del__(self):
        with contextlib.suppress(Exception):
            self.shutdown()


class _DeviceEpoch:
    """One epoch: the producer thread and the iterator the training loop reads."""

    def __init__(self, loader: DeviceResidentLoader):
        self.loader = loader
        self.queue = DeviceQueue(loader.queue_size)
        self.stop_event = threading.Event()
        self.thread: threading.Thread | None = None
        self.done = False
        self.epoch = -1
        self.batches: list[Tensor] = []
        self.first = 0
        self._last_return: float | None = None

    def __iter__(self) -> _DeviceEpoch:
        return self

    def __len__(self) -> int:
        return len(self.loader)

    def _start(self) -> None:
        self.epoch, self.batches, self.first = self.loader.begin_epoch()
        self.thread = threading.Thread(target=self._produce, name="mqgnn-device-sampler", daemon=True)
        self.thread.start()

    def _produce(self) -> None:
        loader = self.loader
        mover = loader.mover
        stream = torch.cuda.stream(mover.stream) if mover.cuda else contextlib.nullcontext()
        try:
            with stream:
                for batch in loader.epoch_batches(self.epoch, self.batches, self.stop_event, self.first):
                    event = None
                    if mover.cuda:
                        event = torch.cuda.Event()
                        event.record(mover.stream)
                    batch.meta["batch_bytes"] = batch_nbytes(batch)
                    loader.sizer.observe_prep(batch.meta["prep_s"])
                    if not self.queue.put((batch, event), self.stop_event):
                        return
            if not self.stop_event.is_set():
                self.queue.finish()
        except BaseException as exc:  # surfaces in the training thread at its next request
            self.queue.fail(exc)

    def __next__(self) -> MiniBatch:
        if self.done:
            raise StopIteration
        if self.thread is None:
            self._start()
        loader = self.loader
        request, kind, payload = await_entry(
            loader, self.queue, self.thread, "device sampler", self._last_return, self.stop
        )
        if kind == "end":
            self.stop()
            raise StopIteration
        if kind == "error":
            self.stop()
            raise RuntimeError(f"device-resident sampling failed: {payload!r}") from payload
        batch = hand_over_batch(loader, self.queue, payload, request, epoch=self.epoch, producer="device")
        self._last_return = time.perf_counter()
        loader.handed_out(batch.meta["index"])
        return batch

    def stop(self) -> None:
        """End the epoch: the producer stops at its next batch and is joined."""
        self.stop_event.set()
        self.done = True
        thread = self.thread
        if thread is not None and thread.is_alive() and threading.current_thread() is not thread:
            thread.join(5.0)

    def __del__(self):
        self.stop_event.set()
