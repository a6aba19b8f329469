"""Device-resident sampling in processes of their own (``DeviceResidentLoader(device_sampler="process")``).

Why: a producer thread shares the training process's interpreter. On a GPU a batch is a few
hundred small launches made from Python, and they take turns with the training loop's own Python
on the interpreter lock, so a batch costs about the sum of the two. A spawned process samples on
the same device from the graph the training process already moved there (its tensors reach the
child by CUDA IPC, not copied) and hands each batch back as IPC handles. The training process
copies the batch into memory of its own on the producer stream, a few device copies, before it
lets the child's go: a process that frees CUDA IPC memory it received first synchronises its
current stream, and that must be the producer's, never the training stream.

Several such processes (``SamplerProcesses``) take the batches of an epoch in turn, batch ``i``
going to process ``i mod n``: each batch is seeded by its index, so the batches are the same
whoever samples them. Only for resident features without a feature cache (a child cannot follow
a cache's refresh or host-side gathers); ``DeviceResidentLoader`` keeps the thread otherwise.

Protocol over one pipe per child. Parent to child: ``("graph", resident, aggregation)`` first
(the child starts, imports and makes its CUDA context while the parent still moves the graph);
``("run", run, requests, credit)`` replaces whatever the child had left with ``requests``
(``(index, seeds, rng_seed)``, in order); ``("ack", run)`` after each batch taken; ``None`` to
end. Child to parent: ``("batch", run, batch)`` or ``("error", run, traceback)``, and
``("closed", -1, None)`` after ``None``, when it waits for the parent to hang up: the parent first
opens and releases whatever was still on its way, so no IPC memory is left shared when the child
exits. The child runs at most ``credit`` batches ahead of the acks; the parent drops what a run
it left early still sends. On the CPU the same code runs with shared-memory tensors.
"""

from __future__ import annotations

import contextlib
import gc
import threading
import time
import traceback
from collections import deque
from collections.abc import Iterator

import torch
from torch import Tensor

from lightning_mqgnn import SAMPLER_PROCESS_NAME
from lightning_mqgnn.pipeline.child_signals import ignore_parent_signals
from lightning_mqgnn.pipeline.resident import ResidentGraph, produce_resident
from lightning_mqgnn.sampling.batch import MiniBatch

POLL_S = 0.1  # how often a waiting parent checks the child is alive and the epoch not stopped
JOIN_S = 5.0


class SamplerProcessError(RuntimeError):
    """A device sampler process failed or died."""


def _serve(conn, device: torch.device) -> None:
    """The child: set up ``device``, take the graph, answer runs of requests until ``None``."""
    ignore_parent_signals()  # the parent handles them and closes us
    torch.set_num_threads(1)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.set_device(device)
        torch.cuda.init()
    with contextlib.suppress(EOFError, BrokenPipeError, ConnectionResetError, KeyboardInterrupt):
        message = conn.recv()
        if message is not None:
            _answer(conn, *message[1:], cuda)
        del message  # the last reference to the shared graph here: its IPC mappings are released
        gc.collect()  # (a sampler may hold it in a reference cycle) before the parent learns we are done
        conn.send(("closed", -1, None))
        conn.recv()  # raises EOFError once the parent has released what it received and hung up


def _answer(conn, resident: ResidentGraph, input_aggregation: str | None, cuda: bool) -> None:
    """Batches for the runs the parent sends, until ``None``."""
    run, pending, credit, unacked = -1, deque(), 0, 0

    def handle(message) -> bool:
        nonlocal run, pending, credit, unacked
        if message is None:
            return False
        if message[0] == "run":
            _, run, requests, credit = message
            pending, unacked = deque(requests), 0
        elif message[0] == "ack" and message[1] == run:
            unacked -= 1
        return True

    while True:
        if not pending or unacked >= credit:
            if not handle(conn.recv()):
                return
            continue
        while conn.poll():
            if not handle(conn.recv()):
                return
        if not pending or unacked >= credit:
            continue
        index, seeds, rng_seed = pending.popleft()
        t0 = time.perf_counter()
        try:
            batch = produce_resident(resident, torch.from_numpy(seeds), rng_seed, index, input_aggregation)
            if cuda:
                torch.cuda.current_stream().synchronize()
        except Exception:
            conn.send(("error", run, traceback.format_exc()))
            pending.clear()
            continue
        batch.meta["prep_s"] = time.perf_counter() - t0
        try:
            conn.send(("batch", run, batch))
        except RuntimeError:  # a tensor aliases memory this child received: send a copy
            conn.send(("batch", run, batch.clone()))
        unacked += 1
        del batch
        if cuda:
            torch.cuda.ipc_collect()  # blocks the parent has let go of return to this allocator


class SamplerProcess:
    """A spawned child on ``device``; after ``share(resident, ...)`` it samples from ``resident``
    (shared, not copied) for the parent's epochs."""

    def __init__(self, device: torch.device):
        ctx = torch.multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(
            target=_serve, args=(child, device), name=SAMPLER_PROCESS_NAME, daemon=True
        )
        self.process.start()
        child.close()
        self._run = 0
        self._held: MiniBatch | None = None  # the last batch received: its IPC mappings stay open

    def share(self, resident: ResidentGraph, input_aggregation: str | None) -> None:
        self._send(("graph", resident, input_aggregation))

    def batches(
        self, requests: list[tuple[int, Tensor, int]], credit: int, stop: threading.Event
    ) -> Iterator[MiniBatch]:
        """The batches of ``requests`` in order, each a copy in this process's memory made on the
        current stream; ends early, without error, once ``stop`` is set."""
        self._run += 1
        run = self._run
        wire = [(index, seeds.cpu().numpy(), int(rng)) for index, seeds, rng in requests]
        self._send(("run", run, wire, max(1, int(credit))))
        for _ in requests:
            message = self._next_of(run, stop)
            if message is None:
                return
            kind, payload = message
            if kind == "error":
                raise SamplerProcessError(f"the device sampler process failed:\n{payload}")
            own = payload.clone()
            self._held = payload
            yield own
            self._send(("ack", run))

    def _next_of(self, run: int, stop: threading.Event) -> tuple[str, object] | None:
        """The next message of ``run`` (older runs' are dropped), or None once ``stop`` is set."""
        while True:
            while not self.conn.poll(POLL_S):
                if stop.is_set():
                    return None
                if not self.process.is_alive():
                    raise self._died()
            try:
                kind, message_run, payload = self.conn.recv()
            except (EOFError, ConnectionResetError) as exc:
                raise self._died() from exc
            if message_run == run:
                return kind, payload

    def _died(self) -> SamplerProcessError:
        self.process.join(JOIN_S)
        return SamplerProcessError(
            f"the device sampler process exited (exit code {self.process.exitcode}) during an epoch"
        )

    def _send(self, message) -> None:
        try:
            self.conn.send(message)
        except (BrokenPipeError, ConnectionResetError, OSError) as exc:
            raise self._died() from exc

    def alive(self) -> bool:
        return self.process.is_alive()

    def close(self) -> None:
        """Ask the child to end, release what it still sent, hang up, and make sure it exited
        (idempotent)."""
        self._held = None
        with contextlib.suppress(Exception):
            self.conn.send(None)
            deadline = time.monotonic() + JOIN_S
            while self.conn.poll(max(0.0, deadline - time.monotonic())):
                if self.conn.recv()[0] == "closed":  # batches on their way are opened and dropped
                    break
        with contextlib.suppress(Exception):
            self.conn.close()
        self.process.join(JOIN_S)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(JOIN_S)


class SamplerProcesses:
    """``n`` sampler processes on ``device`` taking an epoch's batches in turn."""

    def __init__(self, device: torch.device, n: int):
        self.members = [SamplerProcess(device) for _ in range(n)]
        self.shared = False  # whether the members hold the resident graph yet

    def share(self, resident: ResidentGraph, input_aggregation: str | None) -> None:
        for member in self.members:
            member.share(resident, input_aggregation)
        self.shared = True

    def batches(
        self, requests: list[tuple[int, Tensor, int]], credit: int, stop: threading.Event
    ) -> Iterator[MiniBatch]:
        """``requests``' batches in order, request ``i`` made by member ``i mod n``. A member's
        ack goes out when its next batch is asked for, so its credit is one more."""
        n = len(self.members)
        turns = [m.batches(requests[k::n], credit + (n > 1), stop) for k, m in enumerate(self.members)]
        for i in range(len(requests)):
            batch = next(turns[i % n], None)
            if batch is None:  # stopped
                return
            yield batch

    def alive(self) -> bool:
        return any(m.alive() for m in self.members)

    def pids(self) -> list[int]:
        return [m.process.pid for m in self.members]

    def close(self) -> None:
        for member in self.members:
            member.close()
