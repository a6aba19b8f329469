"""GNNPipe's pieces on one process: the layout of ranks, the chunks' blocks, the GCNII layer, and
a dying stage surfacing within seconds (4 gloo processes)."""

from __future__ import annotations

import functools
import math

import helpers.fullgraph_ranks as ranks
import pytest
import torch

from lightning_mqgnn.fullgraph import PartitionBook, PipelineLayout, chunk_partition
from lightning_mqgnn.fullgraph.chunks import HistorySlots, inner_graph
from lightning_mqgnn.fullgraph.history import backward_into_history, read_history, take_arrived_gradients
from lightning_mqgnn.models.gcnii import GCNIILayer, identity_mapping_strength


def test_layout_places_ranks_and_balances_layers():
    layout = PipelineLayout(world_size=4, stages=2, num_convs=7)
    assert layout.ways == 2
    assert [(layout.way_of(r), layout.stage_of(r)) for r in range(4)] == [(0, 1), (0, 0), (1, 1), (1, 0)]
    assert all(layout.rank_of(layout.way_of(r), layout.stage_of(r)) == r for r in range(4))
    assert [list(layout.layers_of(s)) for s in range(2)] == [[0, 1, 2, 3], [4, 5, 6]]
    pure = PipelineLayout(world_size=4, stages=4, num_convs=16)
    assert [len(pure.layers_of(s)) for s in range(4)] == [4, 4, 4, 4]
    assert pure.stage_of(0) == 3  # rank 0 holds the last stage: the loss and the scores


@pytest.mark.parametrize(
    ("world", "stages", "convs", "message"),
    [
        (4, 3, 8, "multiple of stages"),
        (4, 4, 2, "every stage needs at least one layer"),
        (4, 0, 8, "at least one stage"),
    ],
)
def test_impossible_layouts_are_refused(world, stages, convs, message):
    with pytest.raises(ValueError, match=message):
        PipelineLayout(world, stages, convs)


@pytest.mark.parametrize(("parts", "method"), [(1, "metis"), (2, "metis"), (2, "random")])
def test_chunk_blocks_aggregate_like_the_partition(parts, method):
    """With every history row exact, each chunk's block gives the partition block's rows."""
    ds = ranks.small_dataset()
    book = PartitionBook.build(ds.graph, parts, "metis", seed=0)
    part = book.local(ds.graph, 0, "gcn")
    chunks = chunk_partition(part, 5, method, seed=1)
    assert torch.equal(torch.sort(torch.cat([c.rows for c in chunks])).values, torch.arange(part.num_inner))
    h = torch.randn(part.block.num_src, 3)
    full = part.block.aggregate(h)
    for chunk in chunks:
        assert not bool(torch.isin(chunk.ext, chunk.rows).any())
        torch.testing.assert_close(chunk.block.aggregate(h[chunk.source_rows()]), full[chunk.rows])
    if method == "metis":  # METIS chunks cut fewer edges than a random split
        cut = sum(int(c.ext.numel()) for c in chunks)
        random_cut = sum(int(c.ext.numel()) for c in chunk_partition(part, 5, "random", seed=1))
        assert cut < random_cut


def test_history_reads_send_their_gradients_to_the_gradient_history():
    history, grad_history = torch.randn(5, 3), torch.zeros(5, 3)
    slots = torch.tensor([4, 1, 4])
    rows = read_history(history, grad_history, slots)
    assert torch.equal(rows, history[slots])
    upstream = torch.randn(3, 3)
    (rows * upstream).sum().backward()
    assert torch.equal(grad_history, torch.zeros(5, 3).index_add_(0, slots, upstream))
    with torch.no_grad():
        assert not read_history(history, grad_history, slots).requires_grad


def test_a_chunk_takes_the_gradients_its_rows_received_once():
    grad_history = torch.arange(12.0).reshape(4, 3)
    slots = HistorySlots(
        ext_slots=torch.tensor([0]), write_pos=torch.tensor([2, 0]), write_slots=torch.tensor([3, 1])
    )
    h = torch.zeros(3, 3, requires_grad=True)
    h.register_hook(take_arrived_gradients(grad_history, slots))
    h.sum().backward()
    expected = torch.ones(3, 3)
    expected[2] += torch.tensor([9.0, 10.0, 11.0])
    expected[0] += torch.tensor([3.0, 4.0, 5.0])
    assert torch.equal(h.grad, expected)
    assert torch.equal(grad_history[[1, 3]], torch.zeros(2, 3))  # taken: later arrivals wait
    assert torch.equal(grad_history[[0, 2]], torch.tensor([[0.0, 1.0, 2.0], [6.0, 7.0, 8.0]]))


def test_a_gathering_backward_fills_the_gradient_history_and_nothing_else():
    """``backward_into_history`` sends what the history reads and the chunk's input hand on, as a
    full backward does, but leaves no gradient on the parameters or on the chunk's input."""
    torch.manual_seed(0)
    weight = torch.randn(3, 3, requires_grad=True)
    history = torch.randn(4, 3)
    slots = HistorySlots(
        ext_slots=torch.tensor([0, 2]), write_pos=torch.tensor([1]), write_slots=torch.tensor([3])
    )
    upstream = torch.randn(2, 3)

    def chunk(grad_history: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x_in = torch.randn(2, 3, generator=torch.Generator().manual_seed(1), requires_grad=True)
        x_in.register_hook(take_arrived_gradients(grad_history, slots))
        ext = read_history(history, grad_history, slots.ext_slots)
        return x_in, (x_in + ext) @ weight

    arrived = torch.zeros(4, 3)
    arrived[3] = 1.0  # a gradient waiting for the chunk's row 1
    full, gathered = arrived.clone(), arrived.clone()
    x_in, out = chunk(full)
    out.backward(upstream)
    x_in2, out2 = chunk(gathered)
    backward_into_history(out2, upstream, x_in2)
    assert torch.equal(gathered, full)
    assert torch.equal(gathered[3], torch.zeros(3))  # the chunk's row took what had arrived
    assert x_in2.grad is None
    assert weight.grad is not None  # from the full backward only
    grad_after_full = weight.grad.clone()
    x_in3, out3 = chunk(arrived.clone())
    backward_into_history(out3, upstream, x_in3)
    assert torch.equal(weight.grad, grad_after_full)


def test_too_many_chunks_is_refused():
    ds = ranks.small_dataset()
    part = PartitionBook.build(ds.graph, 4, "metis").local(ds.graph, 0, "gcn")
    with pytest.raises(ValueError, match="into 1000 chunks"):
        chunk_partition(part, 1000)
    assert inner_graph(part).num_nodes == part.num_inner


def test_gcnii_layer_is_equation_5():
    ds = ranks.small_dataset()
    part = PartitionBook.build(ds.graph, 1, "metis").local(ds.graph, 0, "gcn")
    torch.manual_seed(0)
    beta = identity_mapping_strength(0.5, 3)
    assert beta == pytest.approx(math.log(0.5 / 3 + 1))
    layer = GCNIILayer(6, alpha=0.1, beta=beta)
    h, h0 = torch.randn(part.num_inner, 6), torch.randn(part.num_inner, 6)
    support = 0.9 * (part.block.adjacency() @ h) + 0.1 * h0
    expected = support @ ((1 - beta) * torch.eye(6) + beta * layer.weight)
    torch.testing.assert_close(layer(part.block, h, h0), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.distributed
@pytest.mark.parametrize("stages", [4, 2])  # 2: the hybrid, whose ways swap halo rows chunk by chunk
def test_dying_stage_fails_fast_with_a_clear_error(stages):
    ranks.assert_peers_fail_fast(functools.partial(ranks.dying_stage, stages=stages), dead=2)
