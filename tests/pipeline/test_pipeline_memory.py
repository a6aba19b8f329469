"""Workers share the graph and the features: the memory of the process tree does not grow by a
copy of them per worker."""

import time

import psutil
import torch

from lightning_mqgnn.graph.csr import CSRGraph
from lightning_mqgnn.pipeline.workers import SamplerWorkerPool
from lightning_mqgnn.sampling.neighbor import NeighborSampler


def tree_pss() -> int:
    me = psutil.Process()
    return sum(p.memory_full_info().pss for p in [me] + me.children(recursive=True))


def pool_pss(graph, features, labels, k: int) -> tuple[int, int]:
    pool = SamplerWorkerPool(NeighborSampler(graph, [5, 5]), features, labels, k)
    pool.start()
    try:
        seeds = torch.arange(0, 2048)
        for i in range(2 * k):  # every worker touches features and graph
            pool.submit(0, i, seeds[i * 128 % 2048 :][:128], i)
        for _ in range(2 * k):
            pool.get(timeout=60)
        time.sleep(0.2)
        return tree_pss(), len(pool.pids())
    finally:
        pool.stop()


def test_tree_memory_does_not_grow_by_a_feature_copy_per_worker():
    n = 300_000
    gen = torch.Generator().manual_seed(0)
    src = torch.randint(0, n, (2_000_000,), generator=gen)
    dst = torch.randint(0, n, (2_000_000,), generator=gen)
    graph = CSRGraph.from_edges(src, dst, n, symmetrize=True).share_memory_()
    features = torch.randn(n, 128, generator=gen).share_memory_()  # 154 MB
    labels = torch.zeros(n, dtype=torch.int64).share_memory_()
    big = features.nbytes + graph.indices.nbytes
    one, k1 = pool_pss(graph, features, labels, 1)
    four, k4 = pool_pss(graph, features, labels, 4)
    assert (k1, k4) == (1, 4)
    # a private copy would add >= 186 MB per worker; allow the interpreter's own pages and
    # per-batch buffers (tens of MiB) only
    per_worker = (four - one) / 3
    assert per_worker < 0.1 * big + 24 * 2**20, f"tree PSS grew by {per_worker / 2**20:.0f} MiB per worker"
