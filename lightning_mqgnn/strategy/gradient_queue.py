"""The RaCoM gradient queue: in-flight gradient all-reduces, applied `staleness` steps later."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from lightning_mqgnn.strategy.comm import PendingReduce, Reducer
from lightning_mqgnn.strategy.comm_hook import (
    DEFAULT_BUCKET_CAP_MB,
    HookedBuckets,
    QueueBucket,
    bucket_members,
)


@dataclass
class _Entry:
    # one flat buffer per (dtype, device) group: grads / world, then presence counts; with a comm
    # hook, the presence counts alone until the hook's buckets are in
    flats: list[Tensor]
    pending: PendingReduce | None  # None once the reduction has completed
    local_missing: bool  # this rank lacked a gradient: only then can a count be 0 (read it, a host sync)
    hooked: Any = None  # the comm hook's work on this step's buckets, None once it is in
    pushed_at: int = 0  # the push that started it
    done_after: int | None = None  # pushes after its own by which it was seen complete

    def is_completed(self) -> bool:
        pending = self.pending is None or self.pending.is_completed()
        return pending and (self.hooked is None or self.hooked.done.is_set())


@dataclass
class _PresenceCopy:
    counts: list[Tensor]  # per group: how many ranks had each member's gradient, on the host
    ready: Any  # CUDA event marking the end of the copy, None for CPU tensors


# a wait for the oldest reduction longer than this share of a step counts as not hidden
WAIT_SHARE = 0.05


class UnusedParametersError(RuntimeError):
    """Parameters that received no gradient on some ranks, in DDP's words (Lightning's DDP strategy
    rewrites that message into its own, ``MQGNNStrategy.on_exception`` adds ``unused`` back)."""

    def __init__(self, unused: list[str]) -> None:
        self.unused = unused
        super().__init__(
            "Expected to have finished reduction in the prior iteration before starting a new one. This error "
            "indicates that your module has parameters that were not used in producing loss: "
            f"{', '.join(unused)}. You can enable unused parameter detection by passing "
            "`MQGNNStrategy(find_unused_parameters=True)` (they then average over the ranks that have a "
            "gradient, counting the others as zero, and stay None where no rank has one)"
        )


@dataclass(frozen=True)
class _Group:
    dtype: torch.dtype
    device: torch.device
    members: tuple[int, ...]  # indices into the parameter list
    numel: int  # gradient elements (the buffer also holds one presence count per member)


class GradientQueue:
    """FIFO of gradient all-reduces started after each backward (eq. 20-21).

    ``push`` flattens the local gradients, divides them by the world size (as DDP does) and starts a
    sum all-reduce without waiting; ``apply_oldest`` waits for the oldest reduction and writes the averaged
    gradient into ``.grad``. Applying only once more than ``staleness`` reductions are queued gives the
    update rule W <- W - eta * grad_acc(t - staleness) (eq. 22 with a delayed eq. 21); staleness 0 is
    synchronous DDP. A parameter keeps ``grad = None`` only when no rank produced a gradient for it.

    With ``allow_missing=False`` (DDP's ``find_unused_parameters=False``) a parameter that lacked a
    gradient on any rank is an error naming it (from ``names``), raised on every rank at once: the presence
    counts are reduced with the gradients, so all ranks see the same counts. Counts in host memory (CPU
    training) are checked when the step is applied, the first step whose averaged gradient is used;
    device counts are copied to the host asynchronously and read at the next application, so the check
    costs no device synchronisation and, like DDP's, reports the step after.

    ``hook`` (``comm_hook.HookedBuckets``): a DDP communication hook reduces the gradients instead, in
    buckets of at most ``bucket_cap_mb`` (DDP's argument), from the local gradients (the hook averages,
    as under DDP); the presence counts are still all-reduced on their own. ``bytes_sent`` counts the
    gradient bytes this rank handed to collectives over ``reductions`` steps (a hook's when its
    reduction completes; None once a hook's traffic is not known).
    """

    def __init__(
        self,
        params: list[Tensor],
        staleness: int,
        reducer: Reducer,
        allow_missing: bool = True,
        names: list[str] | None = None,
        hook: HookedBuckets | None = None,
        bucket_cap_mb: float = DEFAULT_BUCKET_CAP_MB,
    ) -> None:
        if staleness < 0:
            raise ValueError(f"GradientQueue: staleness must be >= 0, got {staleness!r}")
        if names is not None and len(names) != len(params):
            raise ValueError(f"GradientQueue: {len(names)} names for {len(params)} parameters")
        self.params = params
        self.staleness = staleness
        self.reducer = reducer
        self.allow_missing = allow_missing
        self.names = names if names is not None else [f"params[{i}]" for i in range(len(params))]
        self._groups = self._group_params(params)
        self._queue: deque[_Entry] = deque()
        self._presence: _PresenceCopy | None = None
        self.hook = hook
        cap = int(bucket_cap_mb * 2**20)
        # (group index, members) of each bucket: a group's buckets cover its members in order
        self._buckets = [
            (g, members)
            for g, group in enumerate(self._groups)
            for members in bucket_members(params, group.members, cap)
        ]
        self.bytes_sent: int | None = 0
        self.reductions = 0  # the steps whose bytes ``bytes_sent`` holds
        self._pushes = 0
        self._last_push: float | None = None
        self._step_s = 0.0  # the last interval between pushes: a training step
        self._needed: list[int] = []  # per applied step, the staleness that would have hidden its reduction

    @staticmethod
    def _group_params(params: list[Tensor]) -> list[_Group]:
        by_key: dict[tuple[torch.dtype, torch.device], list[int]] = {}
        for i, p in enumerate(params):
            by_key.setdefault((p.dtype, p.device), []).append(i)
        return [
            _Group(dtype, device, tuple(idx), sum(params[i].numel() for i in idx))
            for (dtype, device), idx in by_key.items()
        ]

    def __len__(self) -> int:
        return len(self._queue)

    def take_sent(self) -> tuple[int | None, int]:
        """``(bytes_sent, reductions)`` since the last call (bytes None: a hook's are not known)."""
        sent, reductions = self.bytes_sent, self.reductions
        self.bytes_sent = 0 if sent is not None else None
        self.reductions = 0
        return sent, reductions

    def ready(self) -> bool:
        """True when a gradient at least ``staleness`` steps old is queued."""
        return len(self._queue) > self.staleness

    def _local_gradients(self, members: tuple[int, ...]) -> list[Tensor]:
        return [
            self.params[i].grad.reshape(-1)
            if self.params[i].grad is not None
            else self.params[i].new_zeros(self.params[i].numel())
            for i in members
        ]

    def _presence_flags(self, members: tuple[int, ...]) -> list[Tensor]:
        # built on the device (a fill, no host-to-device copy)
        return [self.params[i].new_full((1,), float(self.params[i].grad is not None)) for i in members]

    def needed_staleness(self) -> list[int]:
        """For each step applied since the last call, the smallest staleness that would have hidden
        its reduction: the pushes after its own by which it was seen complete, or one more than
        the staleness it was applied at when the step waited for it (more than ``WAIT_SHARE`` of
        a step)."""
        needed, self._needed = self._needed, []
        return needed

    def _observe_completions(self) -> None:
        now = time.perf_counter()
        if self._last_push is not None:
            self._step_s = now - self._last_push
        self._last_push = now
        self._pushes += 1
        for entry in self._queue:
            if entry.done_after is None and entry.is_completed():
                entry.done_after = self._pushes - entry.pushed_at

    def push(self) -> None:
        """Start the asynchronous all-reduce of the current local gradients."""
        self._observe_completions()
        missing = any(p.grad is None for p in self.params)
        if self.hook is not None:
            counts = [torch.cat(self._presence_flags(group.members)) for group in self._groups]
            pending = self.reducer.launch(counts)
            last = len(self._buckets) - 1
            buckets = [
                QueueBucket(
                    b, torch.cat(self._local_gradients(members)), [self.params[i] for i in members], b == last
                )
                for b, (_, members) in enumerate(self._buckets)
            ]
            self._queue.append(_Entry(counts, pending, missing, self.hook.submit(buckets), self._pushes))
            return
        flats = []
        for group in self._groups:
            flat = torch.cat(self._local_gradients(group.members) + self._presence_flags(group.members))
            flat[: group.numel].div_(self.reducer.world_size)
            flats.append(flat)
        if self.bytes_sent is not None:
            self.bytes_sent += sum(g.numel * flat.element_size() for g, flat in zip(self._groups, flats))
        self.reductions += 1
        self._queue.append(_Entry(flats, self.reducer.launch(flats), missing, pushed_at=self._pushes))

    def apply_oldest(self) -> float:
        """Wait for the oldest reduction, write it into ``.grad``; return the seconds spent blocked."""
        entry = self._queue.popleft()
        waited = self._complete(entry)
        if entry.done_after is None:  # not seen complete at a push: done since, or waited for
            entry.done_after = self.staleness + (waited > WAIT_SHARE * self._step_s)
        self._needed.append(entry.done_after)
        if not self.allow_missing:
            self._check_presence()  # the previous application's counts
            self._copy_presence(entry)
            if self._presence is not None and self._presence.ready is None:
                self._check_presence()  # host counts: this step's, now
        for group, flat in zip(self._groups, entry.flats):
            # counts are >= 1 wherever this rank had a gradient; read them (host sync) only otherwise
            counts = flat[group.numel :].tolist() if entry.local_missing else [1.0] * len(group.members)
            offset = 0
            for j, i in enumerate(group.members):
                p = self.params[i]
                n = p.numel()
                p.grad = None if counts[j] == 0 else flat[offset : offset + n].view(p.shape)
                offset += n
        return waited

    def _copy_presence(self, entry: _Entry) -> None:
        """Start copying the entry's presence counts to the host; read at the next application."""
        counts = [flat[group.numel :] for group, flat in zip(self._groups, entry.flats)]
        on_cuda = any(c.is_cuda for c in counts)
        host = [c.to("cpu", non_blocking=True) if c.is_cuda else c.clone() for c in counts]
        event = None
        if on_cuda:
            event = torch.cuda.Event()
            event.record()
        self._presence = _PresenceCopy(host, event)

    def _check_presence(self) -> None:
        copy, self._presence = self._presence, None
        if copy is None:
            return
        if copy.ready is not None:
            copy.ready.synchronize()  # long complete: it was enqueued a step ago
        world = self.reducer.world_size
        missing = []
        for group, counts in zip(self._groups, copy.counts):
            missing += [(self.names[i], int(c)) for i, c in zip(group.members, counts.tolist()) if c < world]
        if missing:
            raise UnusedParametersError([f"{name} ({count}/{world} ranks)" for name, count in missing])

    def _complete(self, entry: _Entry) -> float:
        """Wait for ``entry``'s reductions; with a hook, assemble its flats. The seconds blocked."""
        if entry.pending is None and entry.hooked is None:
            return 0.0
        start = time.perf_counter()
        if entry.pending is not None:
            entry.pending.wait()
            entry.pending = None
        if entry.hooked is not None:
            reduced, sent = HookedBuckets.wait(entry.hooked)
            entry.hooked = None
            parts: list[list[Tensor]] = [[] for _ in self._groups]
            for (g, _), buffer in zip(self._buckets, reduced):
                parts[g].append(buffer.reshape(-1).to(self._groups[g].dtype))
            entry.flats = [torch.cat([*grads, counts]) for grads, counts in zip(parts, entry.flats)]
            self.bytes_sent = None if sent is None or self.bytes_sent is None else self.bytes_sent + sent
            self.reductions += 1
        return time.perf_counter() - start

    def drain(self) -> float:
        """Wait for every in-flight reduction (before a checkpoint or teardown); keep the results queued."""
        return sum(self._complete(entry) for entry in self._queue)

    def clear(self) -> None:
        self.drain()
        self._queue.clear()
        self._presence = None

    def state_dict(self) -> dict[str, Any]:
        """Queued averaged gradients (completed first), on the CPU."""
        self.drain()
        return {
            "staleness": self.staleness,
            "group_numels": [g.numel + len(g.members) for g in self._groups],
            "pending": [[flat.detach().cpu().clone() for flat in entry.flats] for entry in self._queue],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        expected = [g.numel + len(g.members) for g in self._groups]
        if list(state["group_numels"]) != expected:
            raise ValueError(
                f"GradientQueue checkpoint: field 'group_numels' is {list(state['group_numels'])}, but this "
                f"model's gradient buffers have {expected} elements (a different model or optimiser?)"
            )
        if len(state["pending"]) > self.staleness:
            raise ValueError(
                f"GradientQueue checkpoint: field 'pending' holds {len(state['pending'])} queued gradients, "
                f"more than this strategy's staleness {self.staleness}"
            )
        self.clear()
        for flats in state["pending"]:
            moved = [f.to(device=g.device, dtype=g.dtype) for f, g in zip(flats, self._groups)]
            self._queue.append(_Entry(moved, None, local_missing=True))
