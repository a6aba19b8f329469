"""The training step's forward and backward replayed from CUDA graphs, one per padded batch shape.

On a GPU a SAGE or GCN step of the paper's size is about 60 kernels of microseconds each, and the
Python and dispatcher work that launches them takes several times longer than the kernels: the
host, not the GPU, sets the pace. A CUDA graph launches a captured forward (and its backward) as
one unit, but only for fixed shapes at fixed addresses, and sampled blocks differ in size from
batch to batch. So each batch is padded to a bucket, every size rounded up to ``m · 2^k`` with
``8 <= m < 16`` (``padded_size``: at most 12.5% more rows or edges, a handful of buckets an
epoch), and written into that bucket's static buffers (``PaddedBatch``):

- padded input rows are zeros; padded edges have weight 0, point at source row 0 and sit after
  the last real edge (in the first padded destination row's bag, or the last real one's): each
  adds ``0 · h``;
- padded destination rows have no edges of their own, and no real edge points at a padded source
  row, so their values never reach a real row;
- padded output rows carry label 0 and loss weight 0, the real ones ``1 / B`` (and ``1 / T`` per
  task for multi-label tasks): the loss ``Σ_i w_i ℓ_i`` is the unpadded batch's mean, and its
  gradients on the parameters are the unpadded step's, up to the order of float sums.

The dropout masks are drawn inside the graph from the same CUDA generator, so a graphed run is
a run with other random masks than an eager one, not a different model. The optimiser step stays
outside the graphs (fused Adam is one kernel). Which steps are graphed at all is
``NodeClassifierBase._graphed_loss``'s choice (one process, no autocast) and ``bucket_of``'s.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.func import functional_call

from lightning_mqgnn.models.metrics import node_loss
from lightning_mqgnn.sampling.batch import Block, MiniBatch

MAX_GRAPHS = 16  # buckets captured per run; batches of further shapes run eagerly


def padded_size(n: int) -> int:
    """``n`` rounded up to ``m · 2^k`` with ``8 <= m < 16`` (``n`` itself below 16)."""
    shift = max(n.bit_length() - 4, 0)
    return -(-n >> shift) << shift


@dataclass(frozen=True)
class BlockShape:
    """A block's padded sizes, and whether it carries its transpose (``Block.with_transpose``)."""

    num_dst: int
    num_src: int
    num_edges: int
    dst_in_src: bool
    transposed: bool


@dataclass(frozen=True)
class BucketShape:
    """What a captured graph is specialised to: padded sizes, dtypes, and which layers it reads
    (``first`` = 1 when the batch carries its first layer's aggregation)."""

    first: int
    x: tuple[int, ...]
    x_dtype: torch.dtype
    blocks: tuple[BlockShape, ...]
    labels: tuple[int, ...]
    labels_dtype: torch.dtype


def bucket_of(batch: MiniBatch) -> BucketShape | None:
    """The bucket of ``batch``, or None when its step cannot be graphed: no output rows, features
    merged from a device cache, or a layer that needs its block's transpose in backward without
    one."""
    if batch.cache_slots is not None or batch.labels is None or batch.labels.shape[0] == 0:
        return None
    first = 1 if batch.aggregated is not None else 0
    x = batch.aggregated if first else batch.features
    if x is None:
        return None
    blocks = []
    for i, block in enumerate(batch.blocks[first:], start=first):
        # above the input layer the sources take gradients: backward reads the block's transpose
        needs_transpose = i > 0
        if needs_transpose and block.src_indptr is None:  # backward would sort the edges
            return None
        blocks.append(
            BlockShape(
                padded_size(block.num_dst),
                padded_size(block.num_src),
                padded_size(block.num_edges),
                block.dst_in_src,
                needs_transpose,
            )
        )
    labels = batch.labels
    return BucketShape(
        first,
        (padded_size(x.shape[0]), *x.shape[1:]),
        x.dtype,
        tuple(blocks),
        (padded_size(labels.shape[0]), *labels.shape[1:]),
        labels.dtype,
    )


class _Buffer:
    """One static tensor: each fill copies the real rows to its front and keeps the rest at the
    pad value, rewritten only where the last fill put real rows (a pad is constant per bucket, so
    a step mostly launches one copy per buffer)."""

    def __init__(self, tensor: Tensor):
        self.tensor = tensor
        self.written = tensor.shape[0]  # fresh memory: every row needs its pad

    def fill(self, real: Tensor, pad: float | int) -> None:
        n = real.shape[0]
        self.tensor[:n].copy_(real)
        end = min(self.written, self.tensor.shape[0])
        if n < end:
            self.tensor[n:end].fill_(pad)
        self.written = n


class PaddedBatch:
    """The static inputs of one bucket's graph: input rows, the blocks the step reads, labels and
    per-row loss weights (module docstring), refilled from each batch of the bucket."""

    def __init__(self, shape: BucketShape, device: torch.device):
        self.shape = shape

        def buffer(size: tuple[int, ...], dtype: torch.dtype) -> _Buffer:
            return _Buffer(torch.empty(size, dtype=dtype, device=device))

        self.x = buffer(shape.x, shape.x_dtype)
        self.blocks: list[dict[str, _Buffer]] = []
        for b in shape.blocks:
            fields = {
                "indptr": buffer((b.num_dst + 1,), torch.int64),
                "indices": buffer((b.num_edges,), torch.int64),
                "weights": buffer((b.num_edges,), torch.float32),
            }
            if b.transposed:
                fields["src_indptr"] = buffer((b.num_src + 1,), torch.int64)
                fields["src_rows"] = buffer((b.num_edges,), torch.int64)
                fields["src_weights"] = buffer((b.num_edges,), torch.float32)
            self.blocks.append(fields)
        self.labels = buffer(shape.labels, shape.labels_dtype)
        weight_shape = (shape.labels[0],) + (1,) * (len(shape.labels) - 1)
        self.loss_weights = buffer(weight_shape, torch.float32)
        self._real_rows = -1

    def fill(self, batch: MiniBatch) -> None:
        """Write ``batch`` (of this bucket) into the buffers."""
        self.x.fill(batch.aggregated if self.shape.first else batch.features, 0)
        for fields, block in zip(self.blocks, batch.blocks[self.shape.first :]):
            # padded rows start at the bucket's edge count: the first of them, or with no padded
            # row the last real one, ends at the padded edges, the others are empty
            edges = fields["indices"].tensor.shape[0]
            fields["indptr"].fill(block.indptr, edges)
            fields["indices"].fill(block.indices, 0)
            fields["weights"].fill(block.weights, 0.0)
            if "src_indptr" in fields:
                fields["src_indptr"].fill(block.src_indptr, edges)
                fields["src_rows"].fill(block.src_rows, 0)
                fields["src_weights"].fill(block.src_weights, 0.0)
        self.labels.fill(batch.labels, 0)
        rows = batch.labels.shape[0]
        if rows != self._real_rows:  # the weights depend on the batch's size only
            tasks = batch.labels.shape[1] if batch.labels.dim() > 1 else 1
            weights = self.loss_weights.tensor
            weights.zero_()
            weights[:rows].fill_(1.0 / (rows * tasks))
            self._real_rows = rows

    def to_blocks(self) -> tuple[Tensor, list[Block | None], Tensor, Tensor]:
        """The buffers as input rows, blocks (None for a first layer the batch has aggregated),
        labels and loss weights."""
        blocks: list[Block | None] = [None] * self.shape.first
        for shape, fields in zip(self.shape.blocks, self.blocks):
            tensors = {name: buffer.tensor for name, buffer in fields.items()}
            blocks.append(Block(shape.num_dst, shape.num_src, dst_in_src=shape.dst_in_src, **tensors))
        return self.x.tensor, blocks, self.labels.tensor, self.loss_weights.tensor


def padded_loss(
    module: nn.Module, padded: PaddedBatch, parameters: dict[str, Tensor] | None = None
) -> Tensor:
    """The step's loss on a padded batch: ``Σ_i w_i ℓ_i`` over its output rows (module docstring).
    ``module`` is a ``NodeClassifier``; ``parameters`` stand in for its own (``functional_call``)."""
    x, blocks, labels, loss_weights = padded.to_blocks()
    kwargs = {"aggregated": True} if padded.shape.first else {}
    if parameters is None:
        logits = module.forward(blocks, x, **kwargs)
    else:
        logits = functional_call(module, parameters, (blocks, x), kwargs)
    per_row = node_loss(logits, labels, module.multilabel, reduction="none")
    return (per_row * loss_weights.to(per_row.dtype)).sum()


WARMUP_PASSES = 3  # eager passes before a capture: lazy initialisation (cuBLAS workspaces) stays out


@dataclass(eq=False)
class _Graph:
    """One bucket's forward and backward graphs and their static tensors."""

    padded: PaddedBatch
    params: tuple[nn.Parameter, ...]  # the trainable ones, where they lived at capture
    forward: torch.cuda.CUDAGraph
    backward: torch.cuda.CUDAGraph
    loss: Tensor
    grad_loss: Tensor
    grads: tuple[Tensor, ...]


class _Replay(torch.autograd.Function):
    """Forward: replay the forward graph, give its loss; backward: the backward graph's parameter
    gradients, copied (the next replay overwrites the static ones, and an accumulating ``.grad``
    must not alias them)."""

    @staticmethod
    def forward(ctx, graph: _Graph, *params: Tensor) -> Tensor:
        graph.forward.replay()
        ctx.graph = graph
        return graph.loss.detach().clone()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        graph = ctx.graph
        graph.grad_loss.copy_(grad)
        graph.backward.replay()
        return (None, *(g.clone() for g in graph.grads))


def trainable_pointers(module: nn.Module) -> tuple[int, ...]:
    """Where the trainable parameters' data live: a graph reads them there."""
    return tuple(p.data_ptr() for p in module.parameters() if p.requires_grad)


def capture(module: nn.Module, padded: PaddedBatch) -> _Graph:
    """Forward and backward graphs of ``padded_loss`` on ``padded``'s buffers. Captured with
    ``capture_error_mode="thread_local"``: a device-resident producer thread keeps sampling (and
    allocating, and reading sizes to the host) on its own stream meanwhile. The graphs take
    gradients of fresh leaves over the parameters' storage, not of the parameters: the
    parameters' own gradient accumulators, made by earlier eager or replayed steps, would tie the
    capture to the training stream."""
    named = [(name, p) for name, p in module.named_parameters() if p.requires_grad]
    params = tuple(p for _, p in named)
    stand_ins = {name: p.detach().requires_grad_() for name, p in named}
    leaves = tuple(stand_ins.values())
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(WARMUP_PASSES):
            torch.autograd.grad(padded_loss(module, padded, stand_ins), leaves)
    torch.cuda.current_stream().wait_stream(side)
    pool = torch.cuda.graph_pool_handle()
    forward, backward = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(forward, pool=pool, capture_error_mode="thread_local"):
        loss = padded_loss(module, padded, stand_ins)
    grad_loss = torch.empty_like(loss)
    with torch.cuda.graph(backward, pool=pool, capture_error_mode="thread_local"):
        grads = torch.autograd.grad(loss, leaves, grad_outputs=grad_loss)
    return _Graph(padded, params, forward, backward, loss.detach(), grad_loss, grads)


class CUDAGraphSteps:
    """The graphed losses of one module, by bucket: ``loss(module, batch)`` captures a bucket on
    its first batch (``capture``) and replays it for every later batch of that bucket. Returns
    None for a batch it does not graph, which the caller then runs eagerly (batches ``bucket_of``
    refuses, and those of new shapes after ``MAX_GRAPHS`` buckets); a capture that fails is an
    error that names the way out."""

    def __init__(self):
        self._graphs: dict[BucketShape, _Graph] = {}
        self._pointers: tuple[int, ...] = ()  # the parameters' addresses every graph was captured with

    @property
    def num_graphs(self) -> int:
        return len(self._graphs)

    def __getstate__(self) -> dict:  # graphs live in one process's device memory: not copied
        return {"_graphs": {}, "_pointers": ()}

    def loss(self, module: nn.Module, batch: MiniBatch) -> Tensor | None:
        shape = bucket_of(batch)
        if shape is None:
            return None
        pointers = trainable_pointers(module)
        if pointers != self._pointers:
            # the parameters were moved or replaced: no graph captured before may replay, and a
            # bucket first seen now must not keep one of those alive beside it
            self._graphs.clear()
            self._pointers = pointers
        graph = self._graphs.get(shape)
        if graph is not None:
            graph.padded.fill(batch)
        else:
            if len(self._graphs) >= MAX_GRAPHS:
                return None
            padded = PaddedBatch(shape, batch.labels.device)
            padded.fill(batch)
            try:
                graph = capture(module, padded)
            except RuntimeError as exc:
                # a failed capture can leave the CUDA generator in capture mode, so the next eager
                # random draw would fail somewhere else, with a message that names nothing of this
                raise RuntimeError(
                    f"CUDA graph capture of the training step failed ({type(exc).__name__}: {exc}); "
                    "train with NodeClassifier(cuda_graphs=False) (recipe: without +model.module.cuda_graphs=true)"
                ) from exc
            self._graphs[shape] = graph
        return _Replay.apply(graph, *graph.params)
