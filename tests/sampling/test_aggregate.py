"""The block aggregation kernel and the layers' choice of order: exact against dense algebra."""

import pytest
import torch

from lightning_mqgnn.models.layers import GCNLayer, SAGELayer, transform_first
from lightning_mqgnn.sampling.aggregate import (
    _eager_when_compiled,
    transpose_of,
    weighted_row_sum,
    weighted_row_sum_with_self,
)
from lightning_mqgnn.sampling.batch import Block


def random_block(num_dst: int, num_src: int, max_deg: int, seed: int) -> Block:
    g = torch.Generator().manual_seed(seed)
    counts = torch.randint(0, max_deg + 1, (num_dst,), generator=g)
    counts[0] = 0  # an empty row must aggregate to zero
    indptr = torch.zeros(num_dst + 1, dtype=torch.int64)
    indptr[1:] = counts.cumsum(0)
    indices = torch.randint(0, num_src, (int(indptr[-1]),), generator=g)
    weights = torch.rand(indices.numel(), generator=g)
    return Block(num_dst, num_src, indptr, indices, weights, dst_in_src=False)


def dense(block: Block) -> torch.Tensor:
    rows = block.dst_ids()
    a = torch.zeros(block.num_dst, block.num_src, dtype=torch.float64)
    a.index_put_((rows, block.indices), block.weights.double(), accumulate=True)  # repeated edges add up
    return a


def test_forward_and_backward_equal_the_dense_products():
    block = random_block(40, 300, 6, seed=0)
    h = torch.randn(300, 7, dtype=torch.float64, requires_grad=True)
    out = weighted_row_sum(block.indptr, block.indices, block.weights.double(), h)
    a = dense(block)
    assert torch.allclose(out, a @ h.detach(), atol=1e-12)
    assert torch.all(out[0] == 0)
    g = torch.randn(40, 7, dtype=torch.float64)
    out.backward(g)
    assert torch.allclose(h.grad, a.t() @ g, atol=1e-12)
    assert torch.autograd.gradcheck(
        lambda x: weighted_row_sum(block.indptr, block.indices, block.weights.double(), x),
        (torch.randn(300, 2, dtype=torch.float64, requires_grad=True),),
    )


@pytest.mark.parametrize("max_deg", [6, 0])
def test_row_sum_with_self_is_the_sum_beside_the_first_rows_with_their_gradient(max_deg):
    block = random_block(40, 300, max_deg, seed=3)
    h = torch.randn(300, 7, dtype=torch.float64, requires_grad=True)
    out = weighted_row_sum_with_self(block.indptr, block.indices, block.weights.double(), h)
    a = dense(block)
    assert torch.allclose(out, torch.cat([a @ h.detach(), h.detach()[:40]], 1), atol=1e-12)
    g = torch.randn(40, 14, dtype=torch.float64)
    out.backward(g)
    expected = a.t() @ g[:, :7]
    expected[:40] += g[:, 7:]
    assert torch.allclose(h.grad, expected, atol=1e-12)
    assert torch.autograd.gradcheck(
        lambda x: weighted_row_sum_with_self(block.indptr, block.indices, block.weights.double(), x),
        (torch.randn(300, 2, dtype=torch.float64, requires_grad=True),),
    )


@pytest.mark.parametrize("aggregate", [weighted_row_sum, weighted_row_sum_with_self])
def test_the_forward_takes_embedding_bags_inference_path(aggregate):
    """The training path of ``embedding_bag`` also maps entries to rows for a backward of its own,
    which the aggregation never runs: its forward must not take it, even for an ``h`` in the graph."""
    block = random_block(40, 300, 6, seed=2)
    h = torch.randn(300, 8, requires_grad=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        aggregate(block.indptr, block.indices, block.weights, h).sum().backward()
    names = {e.name for e in prof.events()}
    assert "aten::_embedding_bag_forward_only" in names
    assert "aten::_embedding_bag" not in names
    assert h.grad is not None


def test_weights_that_ask_for_gradients_are_refused():
    block = random_block(5, 10, 3, seed=1)
    with pytest.raises(ValueError, match="sampling constants"):
        weighted_row_sum(block.indptr, block.indices, block.weights.requires_grad_(), torch.randn(10, 2))


@pytest.mark.parametrize("num_src", [20, 3000])
@pytest.mark.parametrize("conv", [GCNLayer, SAGELayer])
def test_layers_give_the_same_result_in_either_order(conv, num_src):
    """Sources = destinations and many edges (a full-graph block): transform first is cheaper;
    many more sources than destinations (a sampled block): aggregate first. Both are exact."""
    torch.manual_seed(0)
    block = random_block(20, num_src, 15, seed=2)
    block.dst_in_src = True
    layer = conv(16, 8).double()
    h = torch.randn(num_src, 16, dtype=torch.float64)
    a = dense(block)
    if conv is GCNLayer:
        expected = a @ h @ layer.linear.weight.t() + layer.bias
    else:
        expected = a @ h @ layer.neigh.weight.t() + layer.self_(h[:20])
    assert transform_first(block, 16, 8) == (num_src == 20)
    assert torch.allclose(layer(block, h), expected, atol=1e-10)
    # given destination features (inference over global ids) take the same path
    assert torch.allclose(layer(block, h, h[:20]), expected, atol=1e-10)


@pytest.mark.parametrize("with_self", [False, True])
@pytest.mark.parametrize("max_deg", [6, 0])
def test_a_block_carrying_its_transpose_has_the_same_gradients_bit_for_bit(with_self, max_deg):
    block = random_block(40, 300, max_deg, seed=5)
    block.dst_in_src = True
    carried = block.with_transpose()
    assert carried.src_indptr.tolist() == [
        0,
        *torch.bincount(block.indices, minlength=300).cumsum(0).tolist(),
    ]
    grads = []
    for b in (block, carried):
        h = torch.randn(300, 7, generator=torch.Generator().manual_seed(1), requires_grad=True)
        out = b.aggregate_with_self(h) if with_self else b.aggregate(h)
        out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(2)))
        grads.append(h.grad)
    assert torch.equal(grads[0], grads[1])
    a = dense(block)
    g = torch.randn(40, 7, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    h = torch.randn(300, 7, dtype=torch.float64, requires_grad=True)
    weighted_row_sum(block.indptr, block.indices, block.weights.double(), h, carried._transpose()).backward(g)
    assert torch.allclose(h.grad, a.t() @ g, atol=1e-6)  # the carried float32 weights


def test_the_transpose_travels_with_the_block():
    from lightning_mqgnn.pipeline.packing import pack_batch, unpack_batch
    from lightning_mqgnn.sampling.batch import MiniBatch

    top = random_block(10, 40, 4, seed=7).with_transpose()
    bottom = random_block(40, 90, 4, seed=8)
    batch = MiniBatch(torch.arange(90), torch.arange(10), [bottom, top])
    moved = unpack_batch(pack_batch(batch)).to("cpu")
    assert moved.blocks[0].src_indptr is None
    for name in ("indptr", "indices", "weights", "src_indptr", "src_rows", "src_weights"):
        assert torch.equal(getattr(moved.blocks[1], name), getattr(top, name))


def test_producers_give_the_layers_above_the_input_their_transpose():
    from lightning_mqgnn.graph.csr import CSRGraph
    from lightning_mqgnn.pipeline.produce import sample_batch
    from lightning_mqgnn.sampling.neighbor import NeighborSampler

    g = torch.Generator().manual_seed(0)
    graph = CSRGraph.from_edges(
        torch.randint(0, 200, (1500,), generator=g), torch.randint(0, 200, (1500,), generator=g), 200
    )
    batch = sample_batch(NeighborSampler(graph, [4, 3, 2], "mean"), torch.arange(20), rng_seed=3, index=0)
    assert batch.blocks[0].src_indptr is None
    for block in batch.blocks[1:]:
        assert torch.equal(block.src_rows, block.with_transpose().src_rows)
        assert int(block.src_indptr[-1]) == block.num_edges


@pytest.mark.parametrize("aggregation", ["mean", "gcn"])
def test_a_full_block_of_consecutive_nodes_is_the_dense_operator_of_those_rows(aggregation):
    """Consecutive destinations take their rows of the CSR as they are (mean), or are gathered with
    their self loops (gcn); either way the block is the exact operator restricted to those rows,
    as for the same nodes in another order."""
    from helpers.graphs import random_graph

    from lightning_mqgnn.sampling.exact import exact_operator, full_block

    graph = random_graph(60, 400, seed=3, isolate_last=True)
    op = exact_operator(graph, aggregation)
    everything, _ = full_block(graph, torch.arange(60), op)
    for lo, hi in ((0, 60), (0, 7), (13, 41), (45, 60)):
        block, _ = full_block(graph, torch.arange(lo, hi), op)
        shuffled, _ = full_block(graph, torch.arange(hi - 1, lo - 1, -1), op)
        assert block.num_dst == hi - lo and block.dst_in_src == (lo == 0)
        assert torch.allclose(dense(block), dense(everything)[lo:hi])
        assert torch.allclose(dense(block), dense(shuffled).flip(0))


@pytest.mark.parametrize("eager_first", [False, True])
def test_torch_compile_runs_a_function_marked_eager_eagerly(eager_first):
    """Dynamo does not trace a ``_eager_when_compiled`` function (traced, it would record
    ``is_compiling()`` as True), whether its first call is compiled or eager."""
    seen = []

    @_eager_when_compiled
    def probe(x):
        seen.append(torch.compiler.is_compiling())
        return x * 2

    if eager_first:
        probe(torch.ones(3))
    torch.compiler.reset()
    compiled = torch.compile(lambda x: probe(x + 1) - 1, backend="eager")
    for _ in range(2):
        assert torch.equal(compiled(torch.ones(3)), torch.full((3,), 3.0))
    assert seen == [False] * (2 + eager_first)


def test_a_compiled_transpose_is_the_eager_one():
    block = random_block(40, 300, 6, seed=1)
    args = (block.indptr, block.indices, block.weights, block.num_src)
    torch.compiler.reset()
    compiled = torch.compile(lambda *a: transpose_of(*a), backend="eager")
    assert all(torch.equal(a, b) for a, b in zip(compiled(*args), transpose_of(*args)))
