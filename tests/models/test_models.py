"""Layers and the NodeClassifier: sampled forward with all neighbours equals exact inference."""

from dataclasses import replace

import lightning.pytorch as pl
import pytest
import torch

from lightning_mqgnn.graph.csr import CSRGraph
from lightning_mqgnn.graph.dataset import GraphDataset
from lightning_mqgnn.models import FullGraphBatch, GCNLayer, NodeClassifier, SAGELayer
from lightning_mqgnn.models.metrics import make_metric
from lightning_mqgnn.pipeline.gather import gather
from lightning_mqgnn.sampling.neighbor import NeighborSampler


def uniform_edges_dataset(n=120, f=6, classes=3, seed=0, num_edges=600) -> GraphDataset:
    """``num_edges`` uniformly random edges (both directions), random features and labels, a random 60/30/rest split: not the
    generated arxiv-like graph of ``helpers.pipeline.small_dataset``."""
    g = torch.Generator().manual_seed(seed)
    src, dst = torch.randint(0, n, (num_edges,), generator=g), torch.randint(0, n, (num_edges,), generator=g)
    graph = CSRGraph.from_edges(src, dst, n, symmetrize=True)
    perm = torch.randperm(n, generator=g)
    return GraphDataset(
        name="tiny",
        graph=graph,
        features=torch.randn(n, f, generator=g),
        labels=torch.randint(0, classes, (n,), generator=g),
        train_idx=perm[:60],
        val_idx=perm[60:90],
        test_idx=perm[90:],
        num_classes=classes,
    )


@pytest.mark.parametrize("conv,aggregation", [("gcn", "gcn"), ("sage", "mean")])
def test_full_fanout_forward_equals_exact_inference(conv, aggregation):
    torch.manual_seed(0)
    ds = uniform_edges_dataset()
    model = NodeClassifier(ds.num_features, ds.num_classes, conv=conv, hidden=16, dropout=0.0).eval()
    sampler = NeighborSampler(ds.graph, [-1, -1], aggregation)
    nodes = ds.test_idx
    batch = gather(sampler.sample(nodes), ds.features, ds.labels)
    with torch.no_grad():
        sampled = model(batch.blocks, batch.features)
    exact = model._full_graph_logits(FullGraphBatch(ds, nodes, "test"))
    assert torch.allclose(sampled, exact, atol=1e-5)


@pytest.mark.parametrize("conv,aggregation", [("gcn", "gcn"), ("sage", "mean")])
def test_exact_inference_over_the_rows_later_layers_read_equals_it_over_every_node(
    conv, aggregation, monkeypatch
):
    """A sparse graph and a few scored nodes: each layer below the last computes only the rows
    above and their in-neighbours, with the logits of computing every node and of the sampled
    forward with all neighbours."""
    from lightning_mqgnn.models.inference import FullGraphInference

    torch.manual_seed(0)
    ds = uniform_edges_dataset(n=400, num_edges=300)
    nodes = ds.test_idx[:12]
    model = NodeClassifier(ds.num_features, ds.num_classes, conv=conv, hidden=16, num_layers=3, dropout=0.0)
    model.eval()
    inference = FullGraphInference(ds, aggregation)
    rows = inference.rows_per_layer(nodes, 3)
    assert rows[0] is not None and rows[1] is not None and rows[2] is nodes
    assert nodes.numel() < rows[1].numel() < rows[0].numel() < ds.num_nodes
    closure = inference.run(model.layers, torch.relu_, nodes, torch.device("cpu"))
    monkeypatch.setattr(FullGraphInference, "CLOSURE_SHARE", 0.0)  # every node at every layer below
    everything = FullGraphInference(ds, aggregation)
    assert everything.rows_per_layer(nodes, 3)[:2] == [None, None]
    every_node = everything.run(model.layers, torch.relu_, nodes, torch.device("cpu"))
    batch = gather(NeighborSampler(ds.graph, [-1, -1, -1], aggregation).sample(nodes), ds.features, ds.labels)
    with torch.no_grad():
        sampled = model(batch.blocks, batch.features)
    assert torch.allclose(closure, every_node, atol=1e-5)
    assert torch.allclose(closure, sampled, atol=1e-5)
    # the plan is built once per scored tensor, and a second call gives the same logits
    assert torch.equal(inference.run(model.layers, torch.relu_, nodes, torch.device("cpu")), closure)


@pytest.mark.parametrize("features_dtype", ["float32", "float16", "bfloat16"])
def test_exact_inference_in_chunks_rebuilt_at_each_run_equals_it_in_one_cached_piece(
    features_dtype, tmp_path, monkeypatch
):
    """The bounded-memory path: blocks of a few edges each, not kept between runs, and features
    on disk in half precision read a chunk's rows at a time; the logits equal one cached block
    over the same features widened to float32, and the plan holds no block."""
    from lightning_mqgnn.graph.ondisk import open_dataset, write_dataset
    from lightning_mqgnn.models.inference import FullGraphInference

    torch.manual_seed(0)
    ds = open_dataset(
        write_dataset(
            uniform_edges_dataset(n=400, num_edges=1200), tmp_path / "ds", features_dtype=features_dtype
        )
    )
    widened = replace(ds, features=ds.features.float())
    nodes = ds.test_idx[:40]
    cpu = torch.device("cpu")
    for conv, aggregation in [("gcn", "gcn"), ("sage", "mean")]:
        model = NodeClassifier(
            ds.num_features, ds.num_classes, conv=conv, hidden=16, num_layers=3, dropout=0.0
        )
        model.eval()
        whole = FullGraphInference(widened, aggregation).run(model.layers, torch.relu_, nodes, cpu)
        with monkeypatch.context() as patch:
            patch.setattr(FullGraphInference, "MAX_EDGES", 50)
            patch.setattr(FullGraphInference, "CACHED_EDGES", 0)
            patch.setattr(FullGraphInference, "WIDENED_BYTES", 4 * ds.num_features * 60)  # 60 rows
            chunked = FullGraphInference(ds, aggregation)
            first = chunked.run(model.layers, torch.relu_, nodes, cpu)
            plan = chunked._plans[id(nodes)][1]
            assert all(layer.blocks is None for layer in plan)
            assert sum(len(layer.chunks) for layer in plan) > 3 * len(plan)
            assert chunked._widened_by_chunk() == (features_dtype != "float32")
            assert torch.equal(chunked.run(model.layers, torch.relu_, nodes, cpu), first)
        assert torch.allclose(first, whole, atol=1e-5), (conv, (first - whole).abs().max())


def test_training_step_reduces_loss_on_a_fixed_batch():
    torch.manual_seed(0)
    ds = uniform_edges_dataset()
    model = NodeClassifier(ds.num_features, ds.num_classes, conv="sage", hidden=16, dropout=0.0, lr=1e-2)
    batch = gather(NeighborSampler(ds.graph, [3, 3]).sample(ds.train_idx), ds.features, ds.labels)
    opt = model.configure_optimizers()
    losses = []
    for _ in range(80):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(batch.blocks, batch.features), batch.labels)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    assert losses[-1] < 0.5 * losses[0]


def test_metric_choice_follows_the_dataset():
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0], [3.0, 0.0]])
    labels = torch.tensor([0, 1, 1])
    acc = make_metric("accuracy", 2, False)
    assert float(acc(logits, labels)) == pytest.approx(2 / 3)
    auc = make_metric("rocauc", 2, False)
    assert float(auc(torch.softmax(logits, -1)[:, 1], torch.tensor([0, 1, 0]))) == pytest.approx(1.0)
    multi = make_metric("rocauc", 3, True)
    assert (
        float(multi(torch.tensor([[0.9, 0.1, 0.8], [0.1, 0.9, 0.2]]), torch.tensor([[1, 0, 1], [0, 1, 0]])))
        == 1.0
    )
    with pytest.raises(ValueError, match="multi-label"):
        make_metric("accuracy", 3, True)
    with pytest.raises(ValueError, match="binary"):
        make_metric("rocauc", 5, False)


@pytest.mark.parametrize("conv", ["sage", "gcn"])
def test_a_cpu_fit_in_bf16_mixed_precision_learns(conv):
    """``Trainer(precision="bf16-mixed")`` on the CPU (the GEMMs in bfloat16, the rest as autocast
    places it): the loss stays finite and validation accuracy beats chance clearly."""
    from helpers.pipeline import make_trainer, small_dataset

    from lightning_mqgnn.data import LoaderSettings, MQGNNDataModule

    ds = small_dataset(800)
    dm = MQGNNDataModule(
        ds,
        NeighborSampler(ds.graph, [5, 5], "mean" if conv == "sage" else "gcn"),
        LoaderSettings(batch_size=64),
    )
    torch.manual_seed(0)
    model = NodeClassifier(ds.num_features, ds.num_classes, conv=conv, hidden=64, lr=1e-2)
    trainer = make_trainer(
        [], max_epochs=15, precision="bf16-mixed", limit_val_batches=1.0, log_every_n_steps=1
    )
    trainer.fit(model, dm)
    assert torch.isfinite(trainer.callback_metrics["train/loss"])
    assert trainer.callback_metrics["val/metric"] > 2.0 / ds.num_classes


def test_lightning_hook_names_bypass_module_setattr(monkeypatch):
    """Lightning writes the running hook's name dozens of times a step: none of those writes may go
    through ``nn.Module.__setattr__``, and ``self.log`` (which reads the name) still logs."""
    from helpers.pipeline import make_trainer, small_dataset

    from lightning_mqgnn.data import LoaderSettings, MQGNNDataModule
    from lightning_mqgnn.models.node_classifier import HOOK_NAME_ATTRIBUTE

    written = []
    module_setattr = torch.nn.Module.__setattr__

    def counting_setattr(self, name, value):
        written.append(name)
        module_setattr(self, name, value)

    ds = small_dataset(400)
    dm = MQGNNDataModule(ds, NeighborSampler(ds.graph, [3, 3], "mean"), LoaderSettings(batch_size=64))
    model = NodeClassifier(ds.num_features, ds.num_classes, hidden=16)
    monkeypatch.setattr(torch.nn.Module, "__setattr__", counting_setattr)
    trainer = make_trainer([], max_steps=4, log_every_n_steps=1)
    trainer.fit(model, dm)
    assert HOOK_NAME_ATTRIBUTE not in written
    assert HOOK_NAME_ATTRIBUTE in vars(model)
    assert torch.isfinite(trainer.callback_metrics["train/loss"])


@pytest.mark.parametrize("conv", ["sage", "gcn"])
def test_a_torch_compiled_module_trains_like_the_eager_one(conv):
    """``torch.compile`` of the module (aot_eager: the graphs dynamo captures, run by aten) runs
    the compiled CPU loops (dropout words and mask, block transposes) eagerly beside its graphs,
    and trains bit for bit as the eager module does, dropout included."""
    from helpers.pipeline import small_dataset

    ds = small_dataset(300)
    aggregation = "mean" if conv == "sage" else "gcn"
    batches = [
        gather(
            NeighborSampler(ds.graph, [3, 3], aggregation).sample(ds.train_idx[i : i + 64]),
            ds.features,
            ds.labels,
        )
        for i in (0, 64, 128)
    ]
    params = {}
    for compiled in (False, True):
        torch.manual_seed(0)
        model = NodeClassifier(ds.num_features, ds.num_classes, conv=conv, hidden=16, dropout=0.5)
        run = torch.compile(model, backend="aot_eager", dynamic=True) if compiled else model
        opt = model.configure_optimizers()
        torch.manual_seed(1)
        for batch in batches:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(run(batch.blocks, batch.features), batch.labels).backward()
            opt.step()
        params[compiled] = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert torch.equal(params[False], params[True])


@pytest.mark.parametrize(("in_dim", "out_dim"), [(128, 256), (256, 10)])
def test_gcn_weights_start_glorot_uniform_and_biases_at_zero(in_dim, out_dim):
    """Glorot-uniform, as Kipf & Welling's GCN and DGL's GraphConv: entries fill [-a, a] with
    a = sqrt(6 / (in + out)), 2.4x wider than nn.Linear's default at 256 -> 10."""
    torch.manual_seed(0)
    layer = GCNLayer(in_dim, out_dim)
    bound = (6 / (in_dim + out_dim)) ** 0.5
    weight = layer.linear.weight.detach()
    assert weight.abs().max() <= bound
    assert weight.abs().max() > 0.99 * bound  # thousands of uniform draws reach the edge
    assert abs(weight.std().item() - bound / 3**0.5) < 0.05 * bound
    assert torch.equal(layer.bias.detach(), torch.zeros(out_dim))


@pytest.mark.parametrize(("in_dim", "out_dim"), [(6805, 256), (256, 15)])
def test_sage_with_glorot_starts_as_dgls_sageconv(in_dim, out_dim):
    """Both halves Glorot-uniform with ReLU's gain, as DGL's SAGEConv: entries fill [-a, a] with
    a = sqrt(2) sqrt(6 / (in + out)), 3.4x wider than nn.Linear's at 6,805 -> 256; bias zero."""
    torch.manual_seed(0)
    layer = SAGELayer(in_dim, out_dim, glorot=True)
    bound = 2**0.5 * (6 / (in_dim + out_dim)) ** 0.5
    for weight in (layer.neigh.weight.detach(), layer.self_.weight.detach()):
        assert weight.abs().max() <= bound
        assert weight.abs().max() > 0.99 * bound
        assert abs(weight.std().item() - bound / 3**0.5) < 0.05 * bound
    assert torch.equal(layer.self_.bias.detach(), torch.zeros(out_dim))


@pytest.mark.parametrize("glorot_init", [None, False])
def test_sage_keeps_linears_initialisation_draw_for_draw_by_default(glorot_init):
    torch.manual_seed(3)
    model = NodeClassifier(in_dim=128, num_classes=10, conv="sage", glorot_init=glorot_init)
    torch.manual_seed(3)
    neigh, self_ = torch.nn.Linear(128, 256, bias=False), torch.nn.Linear(128, 256)
    assert torch.equal(model.layers[0].neigh.weight, neigh.weight)
    assert torch.equal(model.layers[0].self_.weight, self_.weight)
    assert torch.equal(model.layers[0].self_.bias, self_.bias)
    torch.manual_seed(3)
    glorot = NodeClassifier(in_dim=128, num_classes=10, conv="sage", glorot_init=True)
    assert glorot.layers[0].neigh.weight.abs().max() > 1 / 128**0.5  # beyond nn.Linear's range


def test_gcn_without_glorot_keeps_linears_initialisation_draw_for_draw():
    """``glorot_init=False`` (FastGCN's configs): the weights nn.Linear draws, from the same random
    stream, so those variants train as they did before Glorot was the default."""
    torch.manual_seed(3)
    model = NodeClassifier(in_dim=128, num_classes=10, conv="gcn", glorot_init=False)
    torch.manual_seed(3)
    first = torch.nn.Linear(128, 256, bias=False)
    assert torch.equal(model.layers[0].linear.weight, first.weight)
    torch.manual_seed(3)
    glorot = NodeClassifier(in_dim=128, num_classes=10, conv="gcn")
    assert glorot.layers[1].linear.weight.abs().max() > 1 / 256**0.5  # beyond nn.Linear's range


def test_full_graph_stacks_take_the_same_initialisation():
    from lightning_mqgnn.fullgraph.module import FullGraphNodeClassifier

    for glorot_init, wider in ((True, True), (None, False)):
        torch.manual_seed(3)
        model = FullGraphNodeClassifier(in_dim=128, num_classes=10, conv="sage", glorot_init=glorot_init)
        assert (model.stack.layers[0].neigh.weight.abs().max() > 1 / 128**0.5) == wider


def bag_of_words_dataset(n=400, f=300, density=0.03, seed=0) -> GraphDataset:
    """``uniform_edges_dataset`` with binary features, ``density`` of them non-zero."""
    g = torch.Generator().manual_seed(seed)
    ds = uniform_edges_dataset(n=n, f=f, seed=seed, num_edges=1200)
    return replace(ds, features=(torch.rand(n, f, generator=g) < density).float())


@pytest.mark.parametrize("conv,aggregation", [("gcn", "gcn"), ("sage", "mean")])
@pytest.mark.parametrize("num_layers", [1, 2, 3])
def test_exact_inference_on_sparse_features_takes_their_non_zeros_and_equals_the_dense_product(
    conv, aggregation, num_layers, monkeypatch
):
    """Bag-of-words features: the first layer multiplies their CSR matrix (``project``), whole or
    in chunks, over the rows later layers read or every node, with the logits of the dense path
    and of the sampled forward with all neighbours."""
    from lightning_mqgnn.models.inference import FullGraphInference

    torch.manual_seed(0)
    ds = bag_of_words_dataset()
    nodes = ds.test_idx[:30]
    cpu = torch.device("cpu")
    model = NodeClassifier(
        ds.num_features, ds.num_classes, conv=conv, hidden=16, num_layers=num_layers, dropout=0.0
    ).eval()
    sparse = FullGraphInference(ds, aggregation)
    logits = sparse.run(model.layers, torch.relu_, nodes, cpu)
    assert sparse._sparse_features is not None and sparse._sparse_features.layout == torch.sparse_csr
    with monkeypatch.context() as patch:
        patch.setattr("lightning_mqgnn.models.inference.sparse_rows", lambda features: None)
        dense = FullGraphInference(ds, aggregation)
        dense_logits = dense.run(model.layers, torch.relu_, nodes, cpu)
        assert dense._sparse_features is None
    assert torch.allclose(logits, dense_logits, atol=1e-5), (logits - dense_logits).abs().max()
    with monkeypatch.context() as patch:
        patch.setattr(FullGraphInference, "MAX_EDGES", 50)
        patch.setattr(FullGraphInference, "CLOSURE_SHARE", 0.0)
        chunked = FullGraphInference(ds, aggregation)
        chunked_logits = chunked.run(model.layers, torch.relu_, nodes, cpu)
        assert len(chunked._plans[id(nodes)][1][0].chunks) > 3
    assert torch.allclose(chunked_logits, dense_logits, atol=1e-5)
    sampler = NeighborSampler(ds.graph, [-1] * num_layers, aggregation)
    batch = gather(sampler.sample(nodes), ds.features, ds.labels)
    with torch.no_grad():
        sampled = model(batch.blocks, batch.features)
    assert torch.allclose(logits, sampled, atol=1e-5)


def test_unbiased_linear_of_a_csr_matrix_equals_the_dense_product_with_its_empty_rows_zero():
    from lightning_mqgnn.models.layers import unbiased_linear

    x = bag_of_words_dataset(n=50, f=40, density=0.05).features
    x[[0, 7, 49]] = 0.0  # rows with no non-zero: their bags are empty
    x[3, 5] = 2.5  # values other than 1 weigh their row
    weight = torch.randn(12, 40)
    sparse = unbiased_linear(x.to_sparse_csr(), weight)
    assert torch.allclose(sparse, torch.nn.functional.linear(x, weight), atol=1e-5)
    assert torch.equal(sparse[[0, 7, 49]], torch.zeros(3, 12))
    assert torch.equal(unbiased_linear(x, weight), torch.nn.functional.linear(x, weight))


def test_a_fit_makes_the_sparse_features_with_the_data_before_the_first_validation():
    """``NodeClassifier.setup``: the CSR copy of bag-of-words features exact inference multiplies
    exists when training starts (not built inside the first validation's time), and the
    validation uses that copy."""
    from helpers.pipeline import make_trainer

    from lightning_mqgnn.data import LoaderSettings, MQGNNDataModule

    ds = bag_of_words_dataset()
    seen = {}

    class AtTrainingStart(pl.Callback):
        def on_train_start(self, trainer, pl_module):
            inference = pl_module._inference
            seen["csr"] = None if inference is None else inference.__dict__.get("_sparse_features")

    dm = MQGNNDataModule(ds, NeighborSampler(ds.graph, [3, 3], "mean"), LoaderSettings(batch_size=64))
    model = NodeClassifier(ds.num_features, ds.num_classes, hidden=16)
    trainer = make_trainer(
        [AtTrainingStart()], max_steps=2, limit_val_batches=1.0, val_check_interval=1, num_sanity_val_steps=0
    )
    trainer.fit(model, dm)
    assert seen["csr"] is not None and seen["csr"].layout == torch.sparse_csr
    assert model._inference._sparse_features is seen["csr"]
    assert "val/metric" in trainer.callback_metrics


def test_sparse_rows_only_of_sparse_float32_features_in_memory(monkeypatch):
    from lightning_mqgnn.graph import features as features_module
    from lightning_mqgnn.graph.features import sparse_rows

    bag = bag_of_words_dataset(density=0.05).features
    csr = sparse_rows(bag)
    assert csr is not None and csr.layout == torch.sparse_csr and torch.equal(csr.to_dense(), bag)
    assert sparse_rows(torch.randn(50, 20)) is None  # dense
    assert sparse_rows(bag, max_density=0.01) is None  # above the density asked for
    assert sparse_rows(bag.half()) is None  # half precision: widened where read, never counted
    monkeypatch.setattr(features_module, "SPARSE_MAX_ELEMENTS", bag.numel() - 1)
    assert sparse_rows(bag) is None  # too large to count its non-zeros


@pytest.mark.parametrize("conv,aggregation", [("gcn", "gcn"), ("sage", "mean")])
def test_training_on_sparse_aggregated_inputs_multiplies_their_csr_matrix_with_the_dense_gradients(
    conv, aggregation
):
    """A batch whose gather stage aggregated bag-of-words inputs: the first GEMM takes them as a
    CSR matrix (decided on the fit's first batch), with the dense product's logits and weight
    gradients; dense inputs keep the dense product."""
    torch.manual_seed(0)
    ds = bag_of_words_dataset(density=0.003)
    batch = gather(
        NeighborSampler(ds.graph, [5, 5], aggregation).sample(ds.train_idx[:40]),
        ds.features,
        ds.labels,
        input_aggregation=aggregation,
    )
    model = NodeClassifier(ds.num_features, ds.num_classes, conv=conv, hidden=16, dropout=0.0)
    sparse_logits = model.batch_logits(batch)
    assert model._sparse_inputs is True
    sparse_logits.square().sum().backward()
    sparse_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model._sparse_inputs = False  # as a dense first batch would have decided
    dense_logits = model.batch_logits(batch)
    dense_logits.square().sum().backward()
    assert torch.allclose(sparse_logits, dense_logits, atol=1e-5)
    for sparse_grad, param in zip(sparse_grads, model.parameters()):
        assert torch.allclose(sparse_grad, param.grad, atol=1e-4)
    dense_inputs = replace(batch, aggregated=torch.randn_like(batch.aggregated))
    model.on_fit_start()
    model.batch_logits(dense_inputs)
    assert model._sparse_inputs is False
