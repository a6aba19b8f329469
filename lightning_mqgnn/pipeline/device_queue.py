"""The device mini-batch queue (paper Fig. 1): bounded, resizable, and able to carry an error."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lightning_mqgnn.pipeline.plan import EpochPlan, Planned

if TYPE_CHECKING:
    from lightning_mqgnn.pipeline.queue_size import AdaptiveQueueSize
    from lightning_mqgnn.pipeline.source import BatchSource

END = object()  # marks the end of an epoch


class DeviceQueue:
    """A FIFO holding at most ``capacity`` batches; the capacity can change while in use (adaptive Q).

    ``put`` blocks while full and gives up when ``stop`` is set; ``finish``/``fail`` always go
    through so the consumer learns about the end of the epoch or an error without delay.
    """

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"queue capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._items: deque = deque()
        self._cond = threading.Condition()

    def __len__(self) -> int:
        return len(self._items)

    def set_capacity(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"queue capacity must be >= 1, got {capacity}")
        with self._cond:
            self.capacity = capacity
            self._cond.notify_all()

    def put(self, item: Any, stop: threading.Event) -> bool:
        """Append ``item`` once there is room; False if ``stop`` was set first."""
        with self._cond:
            while len(self._items) >= self.capacity:
                if stop.is_set():
                    return False
                self._cond.wait(0.1)
            self._items.append(("item", item))
            self._cond.notify_all()
            return True

    def finish(self) -> None:
        with self._cond:
            self._items.append(("end", END))
            self._cond.notify_all()

    def fail(self, error: BaseException) -> None:
        with self._cond:
            self._items.append(("error", error))
            self._cond.notify_all()

    def get(self, timeout: float) -> tuple[str, Any] | None:
        """``(kind, payload)`` with kind in {"item", "end", "error"}, or None on timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not self._items:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)
            entry = self._items.popleft()
            self._cond.notify_all()
            return entry


class QueuedLoader(Planned):
    """What the loaders that fill a device queue share: ``source``'s batches, this rank's share of
    the plan's epoch, and the queue's size, fixed (``fixed_q``) or eq. 24-25's (``sizer``)."""

    def __init__(
        self,
        source: BatchSource,
        plan: EpochPlan | Callable[[], EpochPlan] | None,
        fixed_q: int | None,
        sizer: AdaptiveQueueSize,
    ):
        super().__init__(plan)
        self.source = source
        self.fixed_q = fixed_q
        self.sizer = sizer

    def __len__(self) -> int:
        return self.source.num_batches(self.plan().world_size)

    @property
    def queue_size(self) -> int:
        return self.fixed_q if self.fixed_q is not None else self.sizer.q


POLL_S = 0.1  # how often a waiting consumer checks that its producer thread is still alive


class ProducerStopped(RuntimeError):
    """The thread filling a device queue ended without ending the epoch."""


def wait_for_entry(queue: DeviceQueue, producer: threading.Thread, what: str) -> tuple[str, Any]:
    """The next ``(kind, payload)`` of ``queue``; ``ProducerStopped`` naming ``what`` if the
    ``producer`` thread died with the queue empty (instead of waiting forever)."""
    while True:
        entry = queue.get(timeout=POLL_S)
        if entry is not None:
            return entry
        if not producer.is_alive() and len(queue) == 0:
            raise ProducerStopped(f"the {what} thread stopped without ending the epoch")


@dataclass
class BatchRequest:
    """The training thread asking for its next batch: when it asked, how many batches were queued
    then, and the step since the previous batch was handed over (eq. 24-25's compute time)."""

    start: float
    depth: int
    compute_s: float | None


def request_batch(loader: Any, queue: DeviceQueue, last_return: float | None) -> BatchRequest:
    """Open a request; the adaptive queue size (``loader.sizer``) learns the step it ends."""
    start = time.perf_counter()
    compute_s = None if last_return is None else start - last_return
    if compute_s is not None:
        loader.sizer.observe_compute(compute_s)
    return BatchRequest(start, len(queue), compute_s)


def hand_over_batch(loader: Any, queue: DeviceQueue, payload: Any, request: BatchRequest, **meta: Any) -> Any:
    """The consumer's side of a queued ``(batch, event)``: the training stream waits for the event
    (``loader.mover``), the adaptive queue size learns the batch's bytes (``loader.sizer``, when
    ``loader.fixed_q`` is None) and the request's wait, depth and step, ``meta`` and the queue
    size go into ``batch.meta``."""
    batch, event = payload
    batch = loader.mover.hand_over(batch, event)
    if loader.fixed_q is None:
        est = loader.sizer.update(batch.meta["batch_bytes"], batch.meta["index"])
        if est is not None:
            queue.set_capacity(est.q)
    batch.meta.update(
        wait_s=time.perf_counter() - request.start,
        device_queue_depth=request.depth,
        queue_size=queue.capacity,
        **meta,
    )
    if request.compute_s is not None:
        batch.meta["prev_compute_s"] = request.compute_s
    return batch


def await_entry(
    loader: Any,
    queue: DeviceQueue,
    producer: threading.Thread,
    what: str,
    last_return: float | None,
    stop: Callable[[], None],
) -> tuple[BatchRequest, str, Any]:
    """The training thread's request (``request_batch``) and the queue's next ``(kind, payload)``
    (``wait_for_entry``); ``stop()`` ends the epoch before a ``ProducerStopped`` goes up."""
    request = request_batch(loader, queue, last_return)
    try:
        kind, payload = wait_for_entry(queue, producer, what)
    except ProducerStopped:
        stop()
        raise
    return request, kind, payload
