"""GNNPipe's layer pipeline on one rank: this rank's stage computes its consecutive convolutions
for every chunk of its way's partition, receiving each chunk's input rows from the previous stage
and sending its output rows to the next. Both directions carry non-zero entries only
(``nonzeros``): the rows go as a bitmap and their non-zero values, lossless; the gradients come
back for the entries the bitmap marks, since a stage's output is ReLU then dropout and an entry
sent as zero passes no gradient back. With ``recompute`` the gradient is applied to the
recomputed output, whose entries differ from the sent ones where a history row was refreshed in
between (below); an entry that ReLU zeroed in the forward and not in the recomputation then gets
no gradient instead of the gradient at its sent value, 0.

Schedule (one optimizer step per epoch, so weights are never stale): all chunks forward in an
order shared by every rank, then all chunks backward in the reverse order (GPipe's
all-forward-then-all-backward). A chunk's convolution aggregates rows of other chunks: they come
from this stage's history of the layer's input (``history[l]``: the rows some chunk or peer reads,
``chunks.history_slots``), written as each chunk passes, so rows of chunks earlier in this
epoch's order are fresh and the others are one epoch old. Gradients with respect to those rows
are scattered into ``grad_history[l]`` and added to the rows' gradients when their chunk is
backpropagated. In the reverse order, the gradients of the rows read stale come from chunks whose
backward follows their own: they arrive after their chunk's turn. With ``complete_gradients``
(the default) every stage therefore runs its backward twice. The first pass only gathers: each
chunk, from the gradient the next stage sent for its output, backpropagates as far as its history
reads (no parameter gradient, nothing sent), so that the gradient history holds every gradient
of the epoch that some chunk's turn would come too early for. The second pass is the backward
proper: each chunk takes every gradient its rows receive this epoch, the parameter gradients
accumulate and the input gradients go to the previous stage, which gathers with them in its own
first pass; the second pass's own late gradients repeat the first's and are dropped. Given the
forward's values, the gradients of a stage's top history layer are then those of the whole graph
at once; a lower one's late gradients come from the first pass, whose gradients lack the late
ones of the layers above (one more pass per history layer would make them exact too; a test
checks the exact first step of stages with one history layer each). Without it (the paper's
schedule, one backward) a late gradient waits in the buffer for the next epoch's backward, one
epoch late, as PipeGCN applies stale halo gradients; GNNPipe drops those instead and doubles the
rest. The chunk order is shuffled every epoch (same seed on every rank) so that no chunk
always reads stale rows: each cross-chunk dependency is fresh with probability about one half.

With ``recompute`` the forward keeps only each chunk's input rows and reruns the chunk, with the
same dropout masks, in the backward (activation recomputation): activation memory is one chunk's
instead of the whole partition's.

In the hybrid (several ways), a way's inner rows are a graph partition: rows of other partitions
(halo) come from the same stage of the other ways chunk by chunk. Every way runs its chunks in the
same order, so after the chunks at one position of that order have passed forward, the ways
exchange those chunks' rows that peers read (every history layer of the stage in one message):
halo rows of chunks earlier in the epoch's order are fresh, the others one epoch old, as within a
partition. Before the chunks at a position go backward, the ways hand each other the gradients
gathered so far for those chunks' halo rows, so that a fresh read's gradient arrives in time and
a stale read's waits for the chunk's turn in the backward proper (with one backward, in the next
epoch's): the exchange runs in both passes (``ChunkHalo``).

Before the first training epoch an exact forward fills the history (no stale start from zeros).
Evaluation runs the exact forward over the whole partition, stage by stage; within a stage each
layer runs chunk by chunk, and the rows go to the next stage chunk by chunk, so that beside the
partition's input and output rows only one chunk's intermediates and messages are alive.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch
from torch import Tensor

from lightning_mqgnn.fullgraph.batch import PartitionBatch
from lightning_mqgnn.fullgraph.chunks import Chunk, HistorySlots, chunk_partition, history_slots
from lightning_mqgnn.fullgraph.history import backward_into_history, read_history, take_arrived_gradients
from lightning_mqgnn.fullgraph.layout import PipelineLayout
from lightning_mqgnn.fullgraph.nonzeros import bitmap_bytes, nonzero_mask, pack_nonzeros, unpack_nonzeros
from lightning_mqgnn.fullgraph.stacks import Stack
from lightning_mqgnn.fullgraph.transport import Transport
from lightning_mqgnn.models.metrics import node_loss
from lightning_mqgnn.sampling.rng import epoch_seed

# message kinds, part of every tag so that the streams of one link never mix
FORWARD, BACKWARD, EVAL, HALO_VALUES, HALO_GRADS, HALO_EVAL, HALO_PLAN = range(1, 8)
TAG_BITS = 20


@dataclass
class Staleness:
    """How old the history rows a stage read were: ``reads`` rows read, ``stale`` of them written
    in an earlier epoch than the one reading them, ``max_age`` in epochs; ``halo_reads`` and
    ``halo_stale`` the same for the rows of other partitions among them (the hybrid)."""

    reads: int = 0
    stale: int = 0
    max_age: int = 0
    halo_reads: int = 0
    halo_stale: int = 0

    @property
    def stale_fraction(self) -> float:
        return self.stale / self.reads if self.reads else 0.0

    @property
    def halo_stale_fraction(self) -> float:
        return self.halo_stale / self.halo_reads if self.halo_reads else 0.0


@dataclass(frozen=True)
class ChunkHalo:
    """The rows the ways of a stage exchange for one chunk position (the hybrid): ``send[p]``,
    the history slots of this way's rows in its chunk that way ``p`` reads; ``recv[p]``, the slots
    of the halo rows this way reads from way ``p``'s chunk at the same position."""

    send: list[Tensor]
    recv: list[Tensor]


@dataclass
class _ChunkRun:
    """What the backward of one chunk needs from its forward."""

    chunk: int
    x_in: Tensor | None  # the received input rows (stages after the first)
    out: Tensor | None  # the stage's output rows, with the autograd graph (without recompute)
    rng: tuple[Tensor, Tensor | None]  # RNG state before the forward, for the recomputation
    loss: Tensor | None = None  # last stage, without recompute
    sent: Tensor | None = None  # the bitmap of the output rows sent on: which gradients come back


class LayerPipeline:
    """The layer pipeline of ``rank`` under ``layout`` over its way's partition ``batch`` (see the
    module docstring).

    ``transport_factory(position, size, group, global_ranks)`` builds the point-to-point links;
    ``num_chunks`` chunks per partition, cut by ``chunking`` ('metis' or 'random'); ``staleness``
    collects the ages of the history rows read (shared across pipelines when given);
    ``complete_gradients``: a gathering backward pass first, so that no gradient arrives a chunk's
    turn late (module docstring).
    """

    def __init__(
        self,
        batch: PartitionBatch,
        widths: list[int],
        layout: PipelineLayout,
        rank: int,
        transport_factory: Callable[..., Transport] = Transport,
        group=None,
        num_chunks: int = 8,
        chunking: str = "metis",
        seed: int = 0,
        shuffle: bool = True,
        recompute: bool = True,
        staleness: Staleness | None = None,
        complete_gradients: bool = True,
    ):
        part = batch.partition
        if part.num_parts != layout.ways:
            raise ValueError(f"partition has {part.num_parts} parts but the layout has {layout.ways} ways")
        self.layout = layout
        self.rank = rank
        self.way, self.stage = layout.way_of(rank), layout.stage_of(rank)
        self.layers = layout.layers_of(self.stage)
        self.first, self.last = self.stage == 0, self.stage == layout.stages - 1
        self.widths = widths
        self.num_inner = part.num_inner
        self.seed, self.shuffle, self.recompute = seed, shuffle, recompute
        self.complete_gradients = complete_gradients
        self.chunks = chunk_partition(part, num_chunks, chunking, seed)
        send_all = torch.cat(part.send_idx) if part.send_idx else torch.empty(0, dtype=torch.int64)
        halo_rows = torch.arange(part.num_inner, part.block.num_src)
        self.kept, slot, self.slots = history_slots(
            self.chunks, torch.cat([send_all, halo_rows]), part.block.num_src
        )
        self.send_slots = slot[send_all]  # peers read these inner rows (the hybrid)
        self.halo_slots = slot[halo_rows]
        self.first_halo_slot = int((self.kept < part.num_inner).sum())
        stage_ranks = [layout.rank_of(self.way, s) for s in range(layout.stages)]
        self.link = transport_factory(self.stage, layout.stages, group, stage_ranks)
        way_ranks = [layout.rank_of(w, self.stage) for w in range(layout.ways)]
        self.halo_link = (
            transport_factory(self.way, layout.ways, group, way_ranks) if layout.ways > 1 else None
        )
        self.part = part
        # per history layer, one row per kept row (``self.kept``): values, the epoch each was
        # written in, and the gradients other chunks (or peers) sent back for it
        self.history: dict[int, Tensor] = {}
        self.written: dict[int, Tensor] = {}
        self.grad_history: dict[int, Tensor] = {}
        self.staleness = staleness if staleness is not None else Staleness()
        self.bytes_sent = 0  # training messages only
        self.wait_s = 0.0
        self.epoch = 0
        self._tags: dict[tuple[int, str], int] = {}
        self._runs: list[_ChunkRun] = []
        self._order: list[int] = []
        self._sends: list[Future] = []
        self._chunk_halos: list[ChunkHalo] = []  # the hybrid's plan; empty: no halo rows to swap
        self._values_pending: tuple[int, Future] | None = None
        self._device = torch.device("cpu")
        self._allocated = False
        self._input_keep: Tensor | None = None
        self._input_scale = 1.0
        self._warm = False
        self._executor: ThreadPoolExecutor | None = ThreadPoolExecutor(1, thread_name_prefix="gnnpipe")

    # ------------------------------------------------------------------ public
    def history_layers(self) -> list[int]:
        """The layers whose input rows this stage keeps a history of (the first convolution reads
        exact embeddings instead)."""
        return [layer for layer in self.layers if layer > 0]

    def chunk_order(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(len(self.chunks)))
        gen = torch.Generator().manual_seed(epoch_seed(self.seed, epoch))
        return torch.randperm(len(self.chunks), generator=gen).tolist()

    def forward_phase(self, stack: Stack, batch: PartitionBatch, epoch: int) -> Tensor:
        """Every chunk through this stage's layers; returns this rank's summed training loss over
        the global number of training nodes (zero on stages other than the last)."""
        self._to_device(batch.features.device)
        self.epoch = epoch
        if not self._warm:
            if self.halo_link is not None and self.history_layers():
                self._plan_halo()  # a stage without history layers reads no halo rows from history
            self._warm_up(stack, batch)
            self._warm = True
        self._draw_input_mask(stack, batch)
        self._order = self.chunk_order(epoch)
        self._runs = []
        total = torch.zeros((), device=self._device)
        for c in self._order:
            self._finish_halo_values()  # the peers' rows of the chunks before, read from here on
            chunk = self.chunks[c]
            x_in = (
                None
                if self.first
                else self._recv_rows(FORWARD, self.stage - 1, chunk.num_rows, self.widths[self.layers[0]])
            )
            rng = _rng_state(self._device)
            run = _ChunkRun(c, x_in, None, rng)
            if self.recompute:
                with torch.no_grad():
                    out = self._chunk_forward(stack, batch, run, record=True)
            else:
                if x_in is not None:
                    x_in.requires_grad_(True)
                out = self._chunk_forward(stack, batch, run, record=True)
                run.out = out
            if self.last:
                loss = self._chunk_loss(stack, batch, chunk, out)
                run.loss = None if self.recompute else loss
                total = total + loss.detach()
            else:
                run.sent = self._send_rows(FORWARD, self.stage + 1, out)
            self._runs.append(run)
            if self._chunk_halos:
                self._start_halo_values(c)
        self._finish_halo_values()
        self._wait_sends()
        return total

    def backward_phase(self, stack: Stack, batch: PartitionBatch) -> None:
        """Every chunk backward in the reverse order; parameter gradients accumulate in ``.grad``.
        With ``complete_gradients`` a gathering pass goes first (module docstring), and what the
        gradient history holds after the backward proper is dropped; without it, the history
        keeps the gradients that arrived too late for the next epoch's backward. In the hybrid the
        history also holds what peers returned for the halo rows they read; each chunk's hook
        takes its rows'."""
        cross_chunk = len(self.chunks) > 1 or bool(self._chunk_halos)  # else no gradient comes late
        if not (self.complete_gradients and self.history_layers() and cross_chunk):
            self._backward_pass(stack, batch, self._runs)
            return
        received = self._backward_pass(stack, batch, list(self._runs), gather=True)
        self._backward_pass(stack, batch, self._runs, received=iter(received))
        for grads in self.grad_history.values():
            grads.zero_()

    def _backward_pass(
        self,
        stack: Stack,
        batch: PartitionBatch,
        runs: list[_ChunkRun],
        gather: bool = False,
        received: Iterator[Tensor] | None = None,
    ) -> list[Tensor]:
        """One backward over ``runs``, in the reverse order, emptying the list. ``gather``: only as
        far as the history reads, sending nothing down; returns the output gradients it received
        from the next stage, which the backward proper is given as ``received`` (in the same
        order) instead of receiving them again."""
        grads_in: list[Tensor] = []
        while runs:  # reverse order; each run is dropped as soon as its backward is done
            run = runs.pop()
            if self._chunk_halos:
                self._exchange_halo_grads(run.chunk)
            chunk = self.chunks[run.chunk]
            if self.recompute:
                if run.x_in is not None:
                    run.x_in.requires_grad_(True)
                with torch.random.fork_rng(devices=_rng_devices(self._device)):
                    _set_rng_state(run.rng, self._device)
                    out = self._chunk_forward(stack, batch, run, record=False)
                    loss = self._chunk_loss(stack, batch, chunk, out) if self.last else None
            else:
                out, loss = run.out, run.loss
            if self.last:
                assert loss is not None
                top, grad = loss, None
            else:
                assert run.sent is not None
                grad = (
                    next(received)
                    if received is not None
                    else self._recv_values(BACKWARD, self.stage + 1, run.sent, chunk.num_rows, out.shape[1])
                )
                top = out
            if gather:
                backward_into_history(top, grad, run.x_in, retain_graph=not self.recompute)
                if grad is not None:
                    grads_in.append(grad)
                continue
            top.backward(grad)
            if not self.first:
                assert run.x_in is not None and run.x_in.grad is not None
                self._send_grads(self.stage - 1, run.x_in.grad, run.x_in)
        self._wait_sends()
        return grads_in

    @torch.no_grad()
    def exact_forward(self, stack: Stack, batch: PartitionBatch, training: bool = False) -> Tensor | None:
        """The exact forward of the whole partition, stage after stage; the logits of the inner
        rows on the last stage, None elsewhere. ``training``: fill the history (the warm-up)."""
        self._to_device(batch.features.device)
        n = self.num_inner
        kind = FORWARD if training else EVAL
        src = None
        if self.first:
            src = stack.embed(batch.features)
            h0, h = src[:n], src[:n]
        else:
            h0 = stack.embed(batch.features[:n])
            h = h0.new_empty(n, self.widths[self.layers[0]])
            for chunk in self.chunks:
                h[chunk.rows] = self._recv_rows(kind, self.stage - 1, chunk.num_rows, h.shape[1])
        for layer in self.layers:
            if layer > 0:
                halo = self._exact_halo(h, training)
                src = torch.cat([h, halo]) if halo.numel() else h
                if training:
                    torch.index_select(src, 0, self.kept, out=self.history[layer])
                    self.written[layer].fill_(self.epoch)
            h = self._conv_by_chunks(stack, layer, src, h0)
        if self.last:
            return stack.head(h)
        for chunk in self.chunks:
            self._send_rows(kind, self.stage + 1, h[chunk.rows], count=training)
        self._wait_sends()
        return None

    def _conv_by_chunks(self, stack: Stack, layer: int, src: Tensor, h0: Tensor) -> Tensor:
        """Convolution ``layer`` of every inner row from the local rows ``src``, one chunk at a
        time (the layer's intermediates are then one chunk's, not the partition's)."""
        out = src.new_empty(self.num_inner, self.widths[layer + 1])
        for chunk in self.chunks:
            out[chunk.rows] = stack.conv(layer, chunk.block, src[chunk.source_rows()], h0[chunk.rows])
        return out

    def close(self) -> None:
        """Finish the messages in flight (peers wait for them) and stop the thread."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    # ------------------------------------------------------------------ the chunk computation
    def _chunk_forward(self, stack: Stack, batch: PartitionBatch, run: _ChunkRun, record: bool) -> Tensor:
        chunk, slots = self.chunks[run.chunk], self.slots[run.chunk]
        block, n = chunk.block, chunk.num_rows
        if self.first:
            src = stack.embed_dropped(
                self._inputs(batch, chunk.source_rows())
            )  # exact: no history for layer 0
            h0, h = src[:n], src[:n]
        else:
            h0, h = stack.embed_dropped(self._inputs(batch, chunk.rows)), run.x_in
        for layer in self.layers:
            if layer > 0:
                if record:
                    self._write(layer, slots.write_slots, h.detach()[slots.write_pos])
                    self._count_reads(layer, slots)
                ext = read_history(self.history[layer], self.grad_history[layer], slots.ext_slots)
                if h.requires_grad and slots.write_pos.numel():
                    h.register_hook(take_arrived_gradients(self.grad_history[layer], slots))
                src = torch.cat([h, ext])
            h = stack.conv(layer, block, src, h0)
        return h

    def _draw_input_mask(self, stack: Stack, batch: PartitionBatch) -> None:
        """This epoch's input dropout mask over every local row, from a generator seeded by (seed,
        epoch): the same on every stage, so the stages' H0 of a node agree (as a single process's
        one H0 does) and the recomputed forward sees the same mask."""
        p = stack.input_dropout if stack.training else 0.0
        if p <= 0.0:
            self._input_keep = None
            return
        gen = torch.Generator(device=self._device).manual_seed(epoch_seed(self.seed, self.epoch + 1))
        shape = batch.features.shape
        self._input_keep = torch.rand(shape, generator=gen, device=self._device) >= p
        self._input_scale = 1.0 / (1.0 - p)

    def _inputs(self, batch: PartitionBatch, rows: Tensor) -> Tensor:
        """Input feature rows, dropped out with this epoch's mask."""
        x = batch.features[rows]
        if self._input_keep is None:
            return x
        return x * self._input_keep[rows] * self._input_scale

    def _chunk_loss(self, stack: Stack, batch: PartitionBatch, chunk: Chunk, out: Tensor) -> Tensor:
        mask = batch.train_mask[chunk.rows]
        logits = stack.head(out[mask])
        multilabel = batch.labels.dim() > 1
        labels = batch.labels[chunk.rows][mask]
        return node_loss(logits, labels, multilabel, "sum") / batch.num_train_global

    def _write(self, layer: int, where: Tensor, rows: Tensor) -> None:
        """Record ``rows``, values of this epoch, in the history."""
        self.history[layer][where] = rows
        self.written[layer][where] = self.epoch

    def _count_reads(self, layer: int, slots: HistorySlots) -> None:
        if not slots.ext_slots.numel():
            return
        age = self.epoch - self.written[layer][slots.ext_slots]
        stale = age > 0
        halo = slots.ext_slots >= self.first_halo_slot  # history slots follow local row ids
        self.staleness.reads += int(age.numel())
        self.staleness.stale += int(stale.sum())
        self.staleness.halo_reads += int(halo.sum())
        self.staleness.halo_stale += int((stale & halo).sum())
        self.staleness.max_age = max(self.staleness.max_age, int(age.max()))

    # ------------------------------------------------------------------ state and warm-up
    def _to_device(self, device: torch.device) -> None:
        """Move the chunks and partition to ``device`` and allocate the history there (once)."""
        if device == self._device and self._allocated:
            return
        self._device, self._allocated = device, True
        self.chunks = [c.to(device) for c in self.chunks]
        self.slots = [s.to(device) for s in self.slots]
        self.kept, self.send_slots, self.halo_slots = (
            t.to(device) for t in (self.kept, self.send_slots, self.halo_slots)
        )
        self.part = self.part.to(device)
        rows = int(self.kept.numel())
        for layer in self.history_layers():
            width = self.widths[layer]
            self.history[layer] = torch.zeros(rows, width, device=device)
            self.written[layer] = torch.full((rows,), -1, dtype=torch.int64, device=device)
            self.grad_history[layer] = torch.zeros(rows, width, device=device)

    def _warm_up(self, stack: Stack, batch: PartitionBatch) -> None:
        was_training = stack.training
        stack.train(False)
        try:
            self.exact_forward(stack, batch, training=True)
        finally:
            stack.train(was_training)

    # ------------------------------------------------------------------ messages
    def _tag(self, kind: int, direction: str) -> int:
        key = (kind, direction)
        count = self._tags.get(key, 0)
        self._tags[key] = count + 1
        return (kind << TAG_BITS) | (count % (1 << TAG_BITS))

    def _send_rows(self, kind: int, stage: int, rows: Tensor, count: bool = True) -> Tensor:
        """Send activation ``rows`` to ``stage`` of this way as their non-zero entries (``nonzeros``:
        a bitmap message, then the values); returns the bitmap, which says which gradient entries
        will come back."""
        packed = pack_nonzeros(rows.detach().to("cpu", torch.float32).contiguous())
        self._post(kind, stage, [packed.bitmap, packed.values], count)
        return packed.bitmap

    def _send_grads(self, stage: int, grads: Tensor, rows: Tensor) -> None:
        """Send the gradients with respect to the received ``rows`` back to ``stage``, for their
        non-zero entries only: a stage's output is ReLU then dropout, so an entry it sent as zero
        passes no gradient back, and the sender knows which entries it sent (its bitmap)."""
        self._post(BACKWARD, stage, [grads.detach()[rows.detach() != 0].to("cpu", torch.float32)], True)

    def _post(self, kind: int, stage: int, messages: list[Tensor], count: bool) -> None:
        """Send ``messages`` to ``stage`` in order, on the communication thread."""
        if count and kind in (FORWARD, BACKWARD):
            self.bytes_sent += sum(m.numel() * m.element_size() for m in messages)
        tags, link = [self._tag(kind, "send") for _ in messages], self.link

        def send_all() -> None:
            for message, tag in zip(messages, tags):
                link.exchange(self._to_stage(stage, message), self._to_stage(stage), tag)

        self._sends.append(self._submit(send_all))

    def _recv_rows(self, kind: int, stage: int, rows: int, width: int) -> Tensor:
        """Activation rows from ``stage`` (``_send_rows``'s bitmap, then values)."""
        start = time.perf_counter()
        bitmap = self._recv_message(kind, stage, torch.empty(bitmap_bytes(rows * width), dtype=torch.uint8))
        self.wait_s += time.perf_counter() - start
        return self._recv_values(kind, stage, bitmap, rows, width)

    def _recv_values(self, kind: int, stage: int, bitmap: Tensor, rows: int, width: int) -> Tensor:
        """The ``rows x width`` tensor whose entries ``bitmap`` marks come from ``stage`` (the
        rest are zero): the values of received activation rows, or the gradients returned for the
        rows this stage sent with ``bitmap``."""
        start = time.perf_counter()
        mask = nonzero_mask(bitmap, rows * width)
        values = self._recv_message(kind, stage, torch.empty(int(mask.sum())))
        self.wait_s += time.perf_counter() - start
        return unpack_nonzeros(mask, values, (rows, width)).to(self._device)

    def _recv_message(self, kind: int, stage: int, buffer: Tensor) -> Tensor:
        """Receive one message from ``stage`` into ``buffer`` (sized by the caller)."""
        self.link.exchange(self._to_stage(stage), self._to_stage(stage, buffer), self._tag(kind, "recv"))
        return buffer

    def _to_stage(self, stage: int, tensor: Tensor | None = None) -> list[Tensor]:
        """A message list of the stage link: ``tensor`` for ``stage``, nothing for the others."""
        out = [torch.empty(0)] * self.layout.stages
        if tensor is not None:
            out[stage] = tensor
        return out

    def _submit(self, job) -> Future:
        if self._executor is None:
            raise RuntimeError("layer pipeline is closed")
        return self._executor.submit(job)

    def _wait_sends(self) -> None:
        sends, self._sends = self._sends, []
        start = time.perf_counter()
        for future in sends:
            future.result()
        self.wait_s += time.perf_counter() - start

    def _exchange_with_ways(self, sends: list[Tensor], recv_numels: list[int], kind: int) -> Future:
        """Send ``sends[p]`` to way ``p`` of this stage and receive ``recv_numels[p]`` floats from
        each, on the communication thread; the future gives the received messages."""
        assert self.halo_link is not None
        sends = [s.detach().to("cpu", torch.float32).contiguous() for s in sends]
        if kind != HALO_EVAL:
            self.bytes_sent += sum(s.numel() * s.element_size() for s in sends)
        recvs = [torch.empty(n) for n in recv_numels]
        tag, link = self._tag(kind, "both"), self.halo_link

        def job() -> list[Tensor]:
            link.exchange(sends, recvs, tag)
            return recvs

        return self._submit(job)

    def _result(self, future: Future) -> list[Tensor]:
        start = time.perf_counter()
        try:
            return [t.to(self._device) for t in future.result()]
        finally:
            self.wait_s += time.perf_counter() - start

    def _exact_halo(self, h: Tensor, training: bool) -> Tensor:
        """This layer's halo rows, exchanged now (evaluation and warm-up)."""
        if self.halo_link is None:
            return h.new_empty(0, h.shape[1])
        part, width = self.part, h.shape[1]
        sends = [h[idx].reshape(-1) for idx in part.send_idx]
        kind = HALO_VALUES if training else HALO_EVAL
        recvs = self._result(self._exchange_with_ways(sends, [k * width for k in part.recv_counts], kind))
        return torch.cat([r.view(-1, width) for r in recvs])

    def _plan_halo(self) -> None:
        """The ``ChunkHalo`` of every chunk position: each way tells its peers which of its chunks
        every row they read belongs to (once, before the first epoch)."""
        assert self.halo_link is not None
        part = self.part
        chunk_of = torch.empty(self.num_inner, dtype=torch.int64)
        for c, chunk in enumerate(self.chunks):
            chunk_of[chunk.rows.cpu()] = c
        own = [chunk_of[idx.cpu()] for idx in part.send_idx]
        theirs = [torch.empty(k, dtype=torch.int64) for k in part.recv_counts]
        self.halo_link.exchange(own, theirs, self._tag(HALO_PLAN, "both"))
        send_slots = torch.split(self.send_slots, [int(i.numel()) for i in own])
        recv_slots = torch.split(self.halo_slots, part.recv_counts)
        device = self._device
        self._chunk_halos = [
            ChunkHalo(
                [slots[(of == c).to(device)] for slots, of in zip(send_slots, own)],
                [slots[(of == c).to(device)] for slots, of in zip(recv_slots, theirs)],
            )
            for c in range(len(self.chunks))
        ]

    def _rows_of_layers(self, buffers: dict[int, Tensor], slots: Tensor) -> Tensor:
        """``buffers[layer][slots]`` of every history layer, flattened into one message."""
        return torch.cat([buffers[layer][slots].reshape(-1) for layer in self.history_layers()])

    def _per_layer(self, message: Tensor, rows: int) -> list[tuple[int, Tensor]]:
        """``_rows_of_layers``' message of ``rows`` rows, back into each history layer's rows."""
        layers = self.history_layers()
        parts = torch.split(message, [rows * self.widths[layer] for layer in layers])
        return [(layer, part.view(rows, self.widths[layer])) for layer, part in zip(layers, parts)]

    def _message_numels(self, slots: list[Tensor]) -> list[int]:
        width = sum(self.widths[layer] for layer in self.history_layers())
        return [int(s.numel()) * width for s in slots]

    def _start_halo_values(self, c: int) -> None:
        """After chunk ``c``'s forward: its rows that other ways read go to them, and their chunk
        at the same position comes back (written before the next chunk reads, ``_finish_halo_values``)."""
        halo = self._chunk_halos[c]
        sends = [self._rows_of_layers(self.history, slots) for slots in halo.send]
        self._values_pending = (
            c,
            self._exchange_with_ways(sends, self._message_numels(halo.recv), HALO_VALUES),
        )

    def _finish_halo_values(self) -> None:
        if self._values_pending is None:
            return
        c, future = self._values_pending
        self._values_pending = None
        for slots, message in zip(self._chunk_halos[c].recv, self._result(future)):
            for layer, rows in self._per_layer(message, int(slots.numel())):
                self._write(layer, slots, rows)

    def _exchange_halo_grads(self, c: int) -> None:
        """Before chunk ``c``'s backward: the gradients gathered so far for the halo rows of the
        peers' chunks at this position go to their ways (their rows restart at zero), and the
        gradients the peers gathered for this way's rows of chunk ``c`` come in, for its backward
        to take. A gradient of a row read stale comes after its chunk's turn and waits in the
        buffer for the chunk's turn in the backward proper (with one backward, the next epoch's)."""
        halo = self._chunk_halos[c]
        sends = []
        for slots in halo.recv:
            sends.append(self._rows_of_layers(self.grad_history, slots))
            for layer in self.history_layers():
                self.grad_history[layer][slots] = 0.0
        future = self._exchange_with_ways(sends, self._message_numels(halo.send), HALO_GRADS)
        for slots, message in zip(halo.send, self._result(future)):
            for layer, rows in self._per_layer(message, int(slots.numel())):
                self.grad_history[layer].index_add_(0, slots, rows)


def _rng_devices(device: torch.device) -> list:
    return [device] if device.type == "cuda" else []


def _rng_state(device: torch.device) -> tuple[Tensor, Tensor | None]:
    return torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None


def _set_rng_state(state: tuple[Tensor, Tensor | None], device: torch.device) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


__all__ = ["LayerPipeline", "Staleness"]
