"""DGL interop (run in the DGL environment: ``.venv-dgl/bin/python -m pytest -m dgl tests/``):
our blocks and datasets must mean the same thing to ``dgl.nn`` layers as to ours."""

from __future__ import annotations

import dataclasses
import http.server
import threading

import pytest
import torch

dgl = pytest.importorskip("dgl")
dglnn = pytest.importorskip("dgl.nn")

from lightning_mqgnn.graph.csr import CSRGraph  # noqa: E402
from lightning_mqgnn.graph.dataset import GraphDataset  # noqa: E402
from lightning_mqgnn.graph.dgl_graph import from_dgl, load_dgl_builtin, to_dgl  # noqa: E402
from lightning_mqgnn.models.layers import SAGELayer  # noqa: E402
from lightning_mqgnn.pipeline.gather import gather  # noqa: E402
from lightning_mqgnn.sampling.dgl_blocks import to_dgl_blocks  # noqa: E402
from lightning_mqgnn.sampling.neighbor import NeighborSampler  # noqa: E402

pytestmark = pytest.mark.dgl


def two_community_dataset(n: int = 400, num_features: int = 16, seed: int = 0) -> GraphDataset:
    """Two classes, edges mostly within a class, features = noisy class centroid."""
    gen = torch.Generator().manual_seed(seed)
    labels = (torch.arange(n) >= n // 2).to(torch.int64)
    src = torch.randint(0, n, (8 * n,), generator=gen)
    same = torch.rand(8 * n, generator=gen) < 0.9
    half = n // 2
    partner = torch.randint(0, half, (8 * n,), generator=gen) + labels[src] * half  # same class
    other = torch.randint(0, n, (8 * n,), generator=gen)
    dst = torch.where(same, partner, other)
    graph = CSRGraph.from_edges(src, dst, n, symmetrize=True)
    centroids = torch.randn(2, num_features, generator=gen)
    features = centroids[labels] + 2.0 * torch.randn(n, num_features, generator=gen)
    perm = torch.randperm(n, generator=gen)
    return GraphDataset(
        name="two_communities",
        graph=graph,
        features=features,
        labels=labels,
        train_idx=perm[: n // 2],
        val_idx=perm[n // 2 : 3 * n // 4],
        test_idx=perm[3 * n // 4 :],
        num_classes=2,
    )


def sampled_batch(ds: GraphDataset, aggregation: str, fanouts=(3, 4), replace: bool = False, seed: int = 0):
    torch.manual_seed(seed)
    sampler = NeighborSampler(ds.graph, list(fanouts), aggregation=aggregation, replace=replace)
    batch = sampler.sample(ds.train_idx[:64])
    batch.features = ds.features[batch.input_nodes]
    batch.labels = ds.labels[batch.output_nodes]
    return batch


@pytest.mark.parametrize("aggregation", ["gcn", "mean"])
@pytest.mark.parametrize("replace", [False, True])
def test_block_aggregate_equals_weighted_graphconv(aggregation, replace):
    ds = two_community_dataset()
    batch = sampled_batch(ds, aggregation, replace=replace)
    blocks = to_dgl_blocks(batch)
    conv = dglnn.GraphConv(8, 8, norm="none", weight=False, bias=False, allow_zero_in_degree=True)
    for ours, theirs in zip(batch.blocks, blocks):
        assert (theirs.num_src_nodes(), theirs.num_dst_nodes()) == (ours.num_src, ours.num_dst)
        assert theirs.num_edges() == ours.num_edges
        h = torch.randn(ours.num_src, 8)
        expected = ours.aggregate(h)
        got = conv(theirs, h, edge_weight=theirs.edata["w"])
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_block_normalization_equals_graphconv_norm_both():
    ds = two_community_dataset()
    torch.manual_seed(0)
    batch = NeighborSampler(ds.graph, [3, 4], "gcn", normalization="block").sample(ds.train_idx[:64])
    conv = dglnn.GraphConv(8, 8, norm="both", weight=False, bias=False, allow_zero_in_degree=True)
    for ours, theirs in zip(batch.blocks, to_dgl_blocks(batch)):
        h = torch.randn(ours.num_src, 8)
        torch.testing.assert_close(conv(theirs, h), ours.aggregate(h), rtol=1e-5, atol=1e-5)


def test_features_labels_and_ids_land_where_dgl_models_read_them():
    ds = two_community_dataset()
    batch = sampled_batch(ds, "mean")
    blocks = to_dgl_blocks(batch)
    assert torch.equal(blocks[0].srcdata["feat"], ds.features[batch.input_nodes])
    assert torch.equal(blocks[-1].dstdata["label"], ds.labels[batch.output_nodes])
    assert torch.equal(blocks[0].srcdata[dgl.NID], batch.input_nodes)
    assert torch.equal(blocks[-1].dstdata[dgl.NID], batch.output_nodes)
    # layer l's destinations are layer l+1's sources
    assert blocks[0].num_dst_nodes() == blocks[1].num_src_nodes()
    aggregated = gather(
        dataclasses.replace(batch, features=None), ds.features, ds.labels, input_aggregation="mean"
    )
    with pytest.raises(ValueError, match="aggregate_inputs=False"):
        to_dgl_blocks(aggregated)


def test_cached_features_are_merged_before_export():
    ds = two_community_dataset()
    batch = sampled_batch(ds, "mean")
    n_in = batch.input_nodes.numel()
    cache = ds.features[batch.input_nodes[::2]].clone()  # every other input row lives in the cache
    slots = torch.full((n_in,), -1, dtype=torch.int64)
    slots[::2] = torch.arange(cache.shape[0])
    batch.cache_slots = slots
    batch.features = ds.features[batch.input_nodes[slots < 0]]
    blocks = to_dgl_blocks(batch, cache=cache)
    assert torch.equal(blocks[0].srcdata["feat"], ds.features[batch.input_nodes])


def test_sage_layer_matches_dgl_sageconv_mean():
    ds = two_community_dataset()
    batch = sampled_batch(ds, "mean", fanouts=(4, 5))
    blocks = to_dgl_blocks(batch)
    torch.manual_seed(1)
    for in_dim, out_dim in ((16, 8), (8, 16)):  # DGL projects before aggregating when in > out
        ours = SAGELayer(in_dim, out_dim)
        theirs = dglnn.SAGEConv(in_dim, out_dim, aggregator_type="mean")
        with torch.no_grad():  # DGL's mean SAGEConv keeps its bias in fc_self, as SAGELayer does
            theirs.fc_self.bias.normal_()
            ours.neigh.weight.copy_(theirs.fc_neigh.weight)
            ours.self_.weight.copy_(theirs.fc_self.weight)
            ours.self_.bias.copy_(theirs.fc_self.bias)
        for block, dgl_block in zip(batch.blocks, blocks):
            h = torch.randn(block.num_src, in_dim)
            # by hand, eq. 17: W_self h_v + W_neigh mean_{u in S(v)} h_u (+ bias)
            by_hand = ours.self_(h[: block.num_dst]) + ours.neigh(block.aggregate(h))
            torch.testing.assert_close(ours(block, h), by_hand, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(theirs(dgl_block, h), by_hand, rtol=1e-5, atol=1e-5)


def test_from_dgl_drops_loops_and_duplicates_and_round_trips():
    src = torch.tensor([0, 1, 1, 2, 3, 3, 2, 4])
    dst = torch.tensor([1, 0, 0, 3, 2, 3, 2, 0])  # 1->0 twice, self loops 3->3 and 2->2
    g = dgl.graph((src, dst), num_nodes=5)
    g.ndata["feat"] = torch.arange(10, dtype=torch.float32).reshape(5, 2)
    g.ndata["label"] = torch.tensor([0, 1, 2, 1, 0])
    g.ndata["train_mask"] = torch.tensor([1, 1, 0, 0, 0], dtype=torch.uint8)
    g.ndata["val_mask"] = torch.tensor([False, False, True, False, False])
    g.ndata["test_mask"] = torch.tensor([False, False, False, True, True])
    ds = from_dgl(g, name="tiny")
    # row v lists the in-neighbours of v, sorted; self loops and the duplicate are gone
    assert ds.graph.indptr.tolist() == [0, 2, 3, 4, 5, 5]
    assert ds.graph.indices.tolist() == [1, 4, 0, 3, 2]
    assert ds.num_classes == 3 and ds.metric == "accuracy"
    assert ds.labels.dtype == torch.int64 and ds.features.dtype == torch.float32
    assert torch.equal(ds.features, g.ndata["feat"])
    assert ds.train_idx.tolist() == [0, 1] and ds.val_idx.tolist() == [2] and ds.test_idx.tolist() == [3, 4]

    back = from_dgl(to_dgl(ds), name="tiny")
    for field in ("features", "labels", "train_idx", "val_idx", "test_idx"):
        assert torch.equal(getattr(back, field), getattr(ds, field)), field
    assert torch.equal(back.graph.indptr, ds.graph.indptr)
    assert torch.equal(back.graph.indices, ds.graph.indices)
    # with self loops for GCN: every node gains exactly one in-edge, from itself
    g_loops = to_dgl(ds, add_self_loops=True)
    assert torch.equal(g_loops.in_degrees(), ds.graph.in_degrees() + 1)
    assert g_loops.has_edges_between(torch.arange(5), torch.arange(5)).all()


def test_from_dgl_rejects_bad_input_with_names():
    g = dgl.graph((torch.tensor([0, 1]), torch.tensor([1, 2])), num_nodes=3)
    g.ndata["feat"] = torch.ones(3, 2)
    g.ndata["label"] = torch.tensor([0, 1, 0])
    g.ndata["train_mask"] = torch.tensor([True, False, False])
    g.ndata["val_mask"] = torch.tensor([False, True, False])
    with pytest.raises(ValueError, match=r"mine: node data field 'test_mask' is missing"):
        from_dgl(g, name="mine")
    g.ndata["test_mask"] = torch.tensor([0, 0, 2])
    with pytest.raises(ValueError, match=r"mine: node data field 'test_mask' is not a 0/1 mask: has value 2"):
        from_dgl(g, name="mine")
    g.ndata["test_mask"] = torch.tensor([False, True, True])
    with pytest.raises(ValueError, match=r"mine \(DGLGraph\): fields 'val_idx' and 'test_idx' overlap"):
        from_dgl(g, name="mine")
    g.ndata["test_mask"] = torch.tensor([False, False, True])
    g.ndata["feat"] = torch.tensor([[1.0, 2.0], [float("nan"), 0.0], [0.0, 0.0]])
    with pytest.raises(ValueError, match=r"mine \(DGLGraph\): field 'features' has non-finite value nan"):
        from_dgl(g, name="mine")
    with pytest.raises(ValueError, match=r"unknown DGL dataset name 'redit'"):
        load_dgl_builtin("redit")


def test_dgl_model_trained_on_our_blocks_reduces_loss():
    ds = two_community_dataset()
    torch.manual_seed(0)
    sampler = NeighborSampler(ds.graph, [5, 5], aggregation="gcn")
    convs = torch.nn.ModuleList(
        [dglnn.GraphConv(16, 32, norm="none", allow_zero_in_degree=True), dglnn.GraphConv(32, 2, norm="none")]
    )
    opt = torch.optim.Adam(convs.parameters(), lr=1e-2)

    def loss_on(seeds):
        batch = sampler.sample(seeds)
        batch.features = ds.features[batch.input_nodes]
        batch.labels = ds.labels[batch.output_nodes]
        blocks = to_dgl_blocks(batch)
        h = blocks[0].srcdata["feat"]
        for i, (conv, blk) in enumerate(zip(convs, blocks)):
            h = conv(blk, h, edge_weight=blk.edata["w"])
            if i == 0:
                h = torch.relu(h)
        return torch.nn.functional.cross_entropy(h, blocks[-1].dstdata["label"])

    with torch.no_grad():
        before = loss_on(ds.train_idx).item()
    for _ in range(5):
        for seeds in ds.train_idx.split(50):
            opt.zero_grad()
            loss_on(seeds).backward()
            opt.step()
    with torch.no_grad():
        after = loss_on(ds.train_idx).item()
    assert after < 0.5 * before, (before, after)


def test_builtin_dataset_download_is_decided_before_dgl_tries(tmp_path, monkeypatch):
    with pytest.raises(
        FileNotFoundError, match=r"cora: not found under .* downloads are off \(download=false\)"
    ):
        load_dgl_builtin("cora", raw_dir=str(tmp_path), download=False)
    monkeypatch.setenv("DGL_REPO", "http://nohost.invalid/")  # offline: one clear error, no retries
    with pytest.raises(FileNotFoundError, match=r"nohost.invalid/dataset/.*cannot be reached"):
        load_dgl_builtin("cora", raw_dir=str(tmp_path))
    # allowed and reachable: DGL's own downloader asks the server (which has nothing to give)
    requested: list[str] = []

    class Recorder(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            requested.append(self.path)
            self.send_error(404)

        def log_message(self, *args):
            pass

    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        monkeypatch.setenv("DGL_REPO", f"http://127.0.0.1:{server.server_port}/")
        with pytest.raises(Exception):  # noqa: B017 (DGL's error for a 404 is its own business)
            load_dgl_builtin("cora", raw_dir=str(tmp_path))
        server.shutdown()
    assert requested and requested[0].startswith("/dataset/cora"), requested
