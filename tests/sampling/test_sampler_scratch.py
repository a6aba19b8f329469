"""The samplers' reusable scratch: the relabelling's two ways of ordering new sources (a scan of
its scratch array, a sort), the
workspace buffers, and positions written into them agree with the allocating forms."""

import pytest
import torch

import lightning_mqgnn.sampling.cpu_kernels as cpu_kernels
from lightning_mqgnn.sampling.base import Relabeler, Workspace, row_positions, row_positions_by_repeat


@pytest.mark.parametrize("num_nodes", [1, 7, 8, 9, 1000, 4099])
def test_relabel_orders_new_sources_alike_by_scan_and_by_sort(num_nodes, monkeypatch):
    g = torch.Generator().manual_seed(num_nodes)
    relabel = Relabeler(num_nodes)
    for _ in range(20):
        prefix = torch.randperm(num_nodes, generator=g)[
            : int(torch.randint(1, num_nodes + 1, (1,), generator=g))
        ]
        others = torch.randint(
            0, num_nodes, (int(torch.randint(0, 3 * num_nodes, (1,), generator=g)),), generator=g
        )
        others[:1] = num_nodes - 1  # the last node: the scan's last step
        results = []
        for ratio in (0, 10**9):  # always sort, always scan
            monkeypatch.setattr(cpu_kernels, "SCAN_PER_SORTED_ID", ratio)
            results.append(relabel(prefix, others))
        (nodes_a, local_a), (nodes_b, local_b) = results
        assert torch.equal(nodes_a, nodes_b) and torch.equal(local_a, local_b)
        new = nodes_a[prefix.numel() :]
        assert torch.equal(new, torch.unique(others[~torch.isin(others, prefix)]))
        assert torch.equal(nodes_a[local_a], others)
        assert bool((relabel.scratch(torch.device("cpu")) == -1).all())  # the scratch is left clean


def test_workspace_reuses_and_grows_its_buffers():
    ws = Workspace()
    a = ws.take("x", 10, torch.int64, torch.device("cpu"))
    b = ws.take("x", 6, torch.int64, torch.device("cpu"))
    assert b.data_ptr() == a.data_ptr() and b.numel() == 6
    c = ws.take("x", 11, torch.int64, torch.device("cpu"))
    assert c.numel() == 11 and ws._buffers["x"].numel() >= 12  # grows by a quarter at least
    d = ws.take("x", 4, torch.int32, torch.device("cpu"))
    assert d.dtype == torch.int32
    assert ws.take("y", 3, torch.bool, torch.device("cpu")).numel() == 3
    import pickle

    assert pickle.loads(pickle.dumps(ws))._buffers == {}  # buffers are not shipped to workers


def test_row_positions_into_a_buffer_equal_the_allocating_form():
    g = torch.Generator().manual_seed(1)
    buffer = torch.full((4000,), -7, dtype=torch.int64)
    for _ in range(50):
        starts = torch.randint(0, 1000, (100,), generator=g)
        counts = torch.randint(0, 6, (100,), generator=g)
        expect = row_positions(starts, counts)
        assert torch.equal(row_positions(starts, counts, out=buffer), expect)
        assert torch.equal(row_positions_by_repeat(starts, counts, out=buffer), expect)


def test_the_scratch_arrays_of_one_thread_are_one_array_and_other_threads_have_their_own():
    import threading

    from lightning_mqgnn.graph.csr import CSRGraph
    from lightning_mqgnn.sampling.feature_cache import GNSCache
    from lightning_mqgnn.sampling.gns import GNSSampler
    from lightning_mqgnn.sampling.labor import SourceIndex

    cpu = torch.device("cpu")
    relabel, index = Relabeler(500), SourceIndex(500)
    assert relabel.scratch(cpu).data_ptr() == index.scratch(cpu).data_ptr()
    assert Relabeler(501).scratch(cpu).numel() == 501  # another node count, another array
    elsewhere: list[int] = []
    thread = threading.Thread(target=lambda: elsewhere.append(Relabeler(500).scratch(cpu).data_ptr()))
    thread.start()
    thread.join()
    assert elsewhere[0] != relabel.scratch(cpu).data_ptr()

    # a GNS sampler over LABOR layers: four users of the scratch, one array, clean after sampling
    src = torch.randint(0, 300, (3000,), generator=torch.Generator().manual_seed(0))
    dst = torch.randint(0, 300, (3000,), generator=torch.Generator().manual_seed(1))
    graph = CSRGraph.from_edges(src, dst, 300)
    cache = GNSCache(graph, torch.arange(300), fraction=0.1, seed=0)
    sampler = GNSSampler(graph, [4, 4], cache, sampling="labor", estimator="hajek", importance_sampling=1)
    sampler.sample(torch.arange(40))
    users = [sampler._relabel, sampler._sources, sampler._upper._relabel, sampler._upper._sources]
    assert len({u._held.data_ptr() for u in users}) == 1
    assert bool((users[0]._held == -1).all())
