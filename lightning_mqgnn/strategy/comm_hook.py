"""DDP communication hooks run by the gradient queue: a step's gradients in buckets, each handed to
a ``torch.distributed`` comm hook (fp16/bf16 compression, PowerSGD, our quantisation, a user's
own) in place of DDP's reducer, on a thread and a process group of their own.

The thread: torch's hooks chain collectives in future callbacks (PowerSGD's P and Q all-reduces).
Under gloo those callbacks run on gloo's threads when the previous collective completes, so two
buckets (or two steps) in flight at once would issue collectives in an order that differs between
ranks, and collectives are matched by the order they are issued. One thread runs the buckets one
after the other, each to the end of its chain; the process group of its own keeps them apart from
the collectives the training thread issues meanwhile (model synchronisation, metrics, checkpoints).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

# what ``DistributedDataParallel.register_comm_hook`` takes: (state, bucket) -> Future[Tensor]
CommHook = Callable[[Any, Any], torch.futures.Future]
DEFAULT_BUCKET_CAP_MB = 25.0  # DistributedDataParallel's bucket_cap_mb


class QueueBucket:
    """One bucket of a step's local gradients as a comm hook sees it: the methods of
    ``torch.distributed.GradBucket`` (which Python cannot construct) over a flat ``buffer``
    holding ``params``' gradients one after the other."""

    def __init__(self, index: int, buffer: Tensor, params: list[Tensor], last: bool) -> None:
        self._index, self._buffer, self._params, self._last = index, buffer, params, last

    def index(self) -> int:
        return self._index

    def buffer(self) -> Tensor:
        return self._buffer

    def set_buffer(self, buffer: Tensor) -> None:
        self._buffer = buffer

    def gradients(self) -> list[Tensor]:
        """Views of the buffer, one shaped like each parameter (hooks write into them)."""
        views, offset = [], 0
        for p in self._params:
            views.append(self._buffer[offset : offset + p.numel()].view(p.shape))
            offset += p.numel()
        return views

    def parameters(self) -> list[Tensor]:
        return list(self._params)

    def is_last(self) -> bool:
        """Whether this is the step's last bucket (PowerSGD counts its iterations by it)."""
        return self._last


def bucket_members(params: list[Tensor], members: tuple[int, ...], cap_bytes: int) -> list[tuple[int, ...]]:
    """``members`` (indices into ``params``) in order, cut into buckets of at most ``cap_bytes``
    of gradient each; a parameter larger than the cap is a bucket of its own."""
    buckets: list[tuple[int, ...]] = []
    current: list[int] = []
    size = 0
    for i in members:
        nbytes = params[i].numel() * params[i].element_size()
        if current and size + nbytes > cap_bytes:
            buckets.append(tuple(current))
            current, size = [], 0
        current.append(i)
        size += nbytes
    if current:
        buckets.append(tuple(current))
    return buckets


def with_process_group(state: Any, group: Any) -> Any:
    """The hook state with ``group`` where it names no process group: ``None`` (torch's default
    hooks take the group itself as their state) becomes ``group``; a state object whose
    ``process_group`` is None (``PowerSGDState``) gets it."""
    if state is None:
        return group
    if getattr(state, "process_group", False) is None:
        state.process_group = group
    return state


def payload_meter(hook: CommHook, state: Any, bucket: QueueBucket) -> Callable[[], int | None]:
    """Called before ``hook`` runs on ``bucket``: a function that, once the hook's future is done,
    gives the bytes the hook handed to collectives, where its traffic is known (of the hook a
    wrapper names as ``__wrapped__``, as ``functools.wraps`` does): a state that counts
    its own (``bytes_sent``, as ``QuantizeState``), torch's all-reduce, fp16 and bf16 hooks,
    PowerSGD (its count of the compressed elements; before ``start_powerSGD_iter``, a plain
    all-reduce); else None."""
    inner = getattr(hook, "__wrapped__", None)
    if inner is not None:  # a wrapper that sends what the hook it wraps sends
        return payload_meter(inner, state, bucket)
    buffer = bucket.buffer()
    numel, itemsize = buffer.numel(), buffer.element_size()
    counted = getattr(state, "bytes_sent", None)
    if isinstance(counted, int):
        return lambda: state.bytes_sent - counted
    if isinstance(state, powerSGD_hook.PowerSGDState) and hook in (
        powerSGD_hook.powerSGD_hook,
        powerSGD_hook.batched_powerSGD_hook,
    ):
        vanilla = state.iter < state.start_powerSGD_iter
        before = state.total_numel_after_compression
        return lambda: (numel if vanilla else state.total_numel_after_compression - before) * itemsize
    if hook is default_hooks.allreduce_hook:
        return lambda: numel * itemsize
    if hook in (default_hooks.fp16_compress_hook, default_hooks.bf16_compress_hook):
        return lambda: numel * 2
    return lambda: None


@dataclass
class _Work:
    buckets: list[QueueBucket]
    ready: Any  # a CUDA event after the buffers were written, None on the CPU
    done: threading.Event
    results: list[Tensor] | None = None
    payload_bytes: int | None = 0  # None: not known for this hook
    error: BaseException | None = None


class HookedBuckets:
    """Runs ``hook(state, bucket)`` for the buckets of each ``submit``, in order, on one thread,
    each bucket's future waited for before the next bucket starts; ``wait`` returns a
    submission's reduced buffers (or raises what the hook raised)."""

    def __init__(self, hook: CommHook, state: Any) -> None:
        self.hook, self.state = hook, state
        self._work: queue.Queue[_Work | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="mqgnn-comm-hook", daemon=True)
        self._thread.start()

    def submit(self, buckets: list[QueueBucket]) -> _Work:
        ready = None
        if any(b.buffer().is_cuda for b in buckets):
            ready = torch.cuda.Event()
            ready.record()
        work = _Work(buckets, ready, threading.Event())
        self._work.put(work)
        return work

    @staticmethod
    def wait(work: _Work) -> tuple[list[Tensor], int | None]:
        """The submission's reduced buffers and the bytes its hooks sent (None: not known)."""
        work.done.wait()
        if work.error is not None:
            raise work.error
        assert work.results is not None
        return work.results, work.payload_bytes

    def _run(self) -> None:
        while (work := self._work.get()) is not None:
            try:
                if work.ready is not None:
                    work.ready.synchronize()  # the buffers the training stream wrote
                results = []
                for bucket in work.buckets:
                    meter = payload_meter(self.hook, self.state, bucket)
                    reduced = self.hook(self.state, bucket).wait()
                    sent = meter()
                    results.append(reduced[0] if isinstance(reduced, (list, tuple)) else reduced)
                    if sent is None or work.payload_bytes is None:
                        work.payload_bytes = None
                    else:
                        work.payload_bytes += sent
                if work.ready is not None:
                    torch.cuda.current_stream().synchronize()  # this thread's: done before it is read
                work.results = results
            except BaseException as err:  # noqa: BLE001 - goes to the training thread at its wait
                work.error = err
            finally:
                work.done.set()

    def close(self, timeout: float | None = None) -> None:
        """Finish what was submitted and end the thread (within ``timeout`` seconds)."""
        self._work.put(None)
        self._thread.join(timeout)


def new_hook_group(backend: str | None = None) -> Any:
    """A process group of all ranks for the hooks' collectives (a collective: every rank calls it)."""
    return dist.new_group(backend=backend)
