"""Padded batches for CUDA-graphed steps: the padded step computes the unpadded loss and gradients
(on the CPU, where the padding runs eagerly), and batches that cannot be graphed are refused."""

import pytest
import torch
from helpers.pipeline import small_dataset

from lightning_mqgnn.models import NodeClassifier
from lightning_mqgnn.models.cuda_graphs import (
    CUDAGraphSteps,
    PaddedBatch,
    bucket_of,
    padded_loss,
    padded_size,
)
from lightning_mqgnn.models.metrics import node_loss
from lightning_mqgnn.pipeline.produce import produce_batch
from lightning_mqgnn.sampling.neighbor import NeighborSampler


def test_padded_size_rounds_up_by_at_most_an_eighth_to_few_values():
    sizes = [padded_size(n) for n in range(2000)]
    assert sizes[:16] == list(range(16))
    for n, p in enumerate(sizes):
        assert n <= p <= n + n / 8
        shift = max(p.bit_length() - 4, 0)
        assert p % (1 << shift) == 0 and padded_size(p) == p
    assert len(set(sizes[1000:2000])) == 9  # a bucket per 12.5% of size


def batch_of(ds, conv: str, aggregated: bool, seeds, multilabel: bool = False):
    aggregation = {"sage": "mean", "gcn": "gcn"}[conv]
    sampler = NeighborSampler(ds.graph, [3, 4], aggregation)
    labels = ds.labels
    if multilabel:
        labels = torch.nn.functional.one_hot(ds.labels, ds.num_classes).float()
    return produce_batch(sampler, seeds, ds.features, labels, 7, 0, None, aggregation if aggregated else None)


@pytest.mark.parametrize(
    "conv,aggregated,multilabel",
    [("sage", True, False), ("gcn", True, False), ("sage", False, False), ("gcn", False, True)],
)
def test_padded_step_has_the_unpadded_loss_and_gradients(conv, aggregated, multilabel):
    ds = small_dataset(900)
    batch = batch_of(ds, conv, aggregated, ds.train_idx[:77], multilabel)
    shape = bucket_of(batch)
    assert shape is not None and shape.first == int(aggregated)
    real = [(b.num_dst, b.num_src, b.num_edges) for b in batch.blocks[shape.first :]]
    padded_sizes = [(b.num_dst, b.num_src, b.num_edges) for b in shape.blocks]
    assert padded_sizes != real and shape.labels[0] == 80  # the batch really is padded

    torch.manual_seed(0)
    model = NodeClassifier(
        ds.num_features,
        ds.num_classes,
        conv=conv,
        hidden=24,
        dropout=0.0,
        multilabel=multilabel,
        metric="rocauc" if multilabel else "accuracy",
    )
    eager = node_loss(model.batch_logits(batch), batch.labels, multilabel)
    eager_grads = torch.autograd.grad(eager, list(model.parameters()))

    padded = PaddedBatch(shape, torch.device("cpu"))
    for _ in range(2):  # a second fill over the first one's rows changes nothing
        padded.fill(batch)
        loss = padded_loss(model, padded)
        grads = torch.autograd.grad(loss, list(model.parameters()))
        assert torch.allclose(loss, eager, rtol=1e-5, atol=1e-6)
        for g, e in zip(grads, eager_grads):
            assert torch.allclose(g, e, rtol=1e-4, atol=1e-6)
    # the capture's form: gradients of stand-in leaves over the parameters' storage
    stand_ins = {name: p.detach().requires_grad_() for name, p in model.named_parameters()}
    loss = padded_loss(model, padded, stand_ins)
    grads = torch.autograd.grad(loss, list(stand_ins.values()))
    assert torch.allclose(loss, eager, rtol=1e-5, atol=1e-6)
    for g, e in zip(grads, eager_grads):
        assert torch.allclose(g, e, rtol=1e-4, atol=1e-6)


def test_a_smaller_batch_refills_the_tail_with_padding():
    ds = small_dataset(900)
    big = batch_of(ds, "sage", True, ds.train_idx[:77])
    shape = bucket_of(big)
    small = next(
        b for n in range(76, 60, -1) if bucket_of(b := batch_of(ds, "sage", True, ds.train_idx[:n])) == shape
    )
    torch.manual_seed(0)
    model = NodeClassifier(ds.num_features, ds.num_classes, conv="sage", hidden=24, dropout=0.0)
    padded = PaddedBatch(shape, torch.device("cpu"))
    padded.fill(big)
    padded.fill(small)
    eager = node_loss(model.batch_logits(small), small.labels, False)
    assert torch.allclose(padded_loss(model, padded), eager, rtol=1e-5)
    edges = small.blocks[1].num_edges
    block = padded.blocks[0]
    assert torch.all(block["weights"].tensor[edges:] == 0) and torch.all(block["indices"].tensor[edges:] == 0)
    padded_edges = block["indices"].tensor.shape[0]
    assert torch.equal(block["indptr"].tensor[: small.blocks[1].num_dst + 1], small.blocks[1].indptr)
    assert torch.all(block["indptr"].tensor[small.blocks[1].num_dst + 1 :] == padded_edges)


def test_batches_that_cannot_be_graphed_are_refused():
    ds = small_dataset(900)
    batch = batch_of(ds, "sage", True, ds.train_idx[:64])
    without_transpose = batch_of(ds, "sage", True, ds.train_idx[:64])
    without_transpose.blocks[1].src_indptr = None  # backward would sort the edges in the step
    assert bucket_of(batch) is not None and bucket_of(without_transpose) is None
    assert bucket_of(batch_of(ds, "sage", True, ds.train_idx[:0])) is None  # no output rows
    batch.cache_slots = torch.zeros(3, dtype=torch.int64)
    assert bucket_of(batch) is None


def test_a_failed_capture_is_an_error_that_names_the_way_out(monkeypatch):
    import lightning_mqgnn.models.cuda_graphs as cuda_graphs

    def failing_capture(module, padded):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(cuda_graphs, "capture", failing_capture)
    ds = small_dataset(900)
    model = NodeClassifier(ds.num_features, ds.num_classes, hidden=8)
    batch = batch_of(ds, "sage", True, ds.train_idx[:64])
    with pytest.raises(RuntimeError, match=r"capture of the training step failed .*cuda_graphs=False"):
        CUDAGraphSteps().loss(model, batch)


def test_a_module_with_cuda_graphs_copies_and_pickles_without_graphs():
    import copy
    import pickle

    ds = small_dataset(300)
    model = NodeClassifier(ds.num_features, ds.num_classes, hidden=8, cuda_graphs=True)
    assert isinstance(model._graph_steps, CUDAGraphSteps)
    model._graph_steps._graphs["x"] = object()  # stands for a captured graph
    for clone in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert clone._graph_steps.num_graphs == 0
    assert NodeClassifier(ds.num_features, ds.num_classes, hidden=8)._graph_steps is None  # opt-in


class _Rerun:
    """Stands in for a captured CUDA graph on the CPU: a replay runs the captured work again."""

    def __init__(self, work):
        self.replay = work


def rerun_capture(module, padded):
    """``cuda_graphs.capture`` with its graphs replaced by ``_Rerun``: the same static buffers,
    stand-in leaves and gradient outputs, so ``CUDAGraphSteps`` and ``_Replay`` run as on a GPU."""
    import lightning_mqgnn.models.cuda_graphs as cuda_graphs

    named = [(name, p) for name, p in module.named_parameters() if p.requires_grad]
    stand_ins = {name: p.detach().requires_grad_() for name, p in named}
    loss, grad_loss = torch.zeros(()), torch.zeros(())
    grads = tuple(torch.zeros_like(p) for _, p in named)
    pending = []

    def forward():
        with torch.enable_grad():  # an autograd.Function's forward runs without it
            pending.append(padded_loss(module, padded, stand_ins))
        loss.copy_(pending[-1].detach())

    def backward():
        computed = torch.autograd.grad(pending.pop(), list(stand_ins.values()), grad_outputs=grad_loss)
        for static, g in zip(grads, computed):
            static.copy_(g)

    params = tuple(p for _, p in named)
    return cuda_graphs._Graph(padded, params, _Rerun(forward), _Rerun(backward), loss, grad_loss, grads)


def test_graph_steps_reuse_buckets_recapture_moved_parameters_and_train_as_eager(monkeypatch):
    import lightning_mqgnn.models.cuda_graphs as cuda_graphs

    monkeypatch.setattr(cuda_graphs, "capture", rerun_capture)
    ds = small_dataset(900)
    steps = [
        batch_of(ds, "sage", True, ds.train_idx[s : s + n])
        for s, n in [(0, 77), (77, 60), (137, 77), (214, 60)]
    ]
    models = []
    for graphs in (True, False):
        torch.manual_seed(0)
        models.append(
            NodeClassifier(
                ds.num_features, ds.num_classes, hidden=16, dropout=0.0, lr=1e-2, cuda_graphs=graphs
            )
        )
    graphed, eager = models

    def train(batches):
        opts = [m.configure_optimizers() for m in models]
        for batch in batches:
            losses = []
            for model, opt in zip(models, opts):
                opt.zero_grad(set_to_none=True)
                loss = model._graph_steps.loss(model, batch) if model is graphed else None
                if loss is None:
                    loss = node_loss(model.batch_logits(batch), batch.labels, False)
                loss.backward()
                opt.step()
                losses.append(float(loss.detach()))
            assert losses[0] == pytest.approx(losses[1], rel=1e-5)

    train(steps)
    # a bucket per shape, one of them replayed for a second batch
    assert len(steps) > graphed._graph_steps.num_graphs == len({bucket_of(b) for b in steps}) >= 2
    old_storage = [p.data for m in models for p in m.parameters()]  # alive: the copies get new addresses
    for model in models:
        for p in model.parameters():
            p.data = p.data.clone()
    fresh = batch_of(ds, "sage", True, ds.train_idx[300:330])  # a shape no graph was captured for
    assert bucket_of(fresh) not in {bucket_of(b) for b in steps}
    train([fresh, steps[1]])
    # the move dropped every graph at the first step after it: the two buckets since, and the
    # one first seen after the move is not dropped with the stale ones when an old shape returns
    assert graphed._graph_steps.num_graphs == 2
    del old_storage
    for p, q in zip(graphed.parameters(), eager.parameters()):
        assert torch.allclose(p, q, rtol=1e-4, atol=1e-6)
