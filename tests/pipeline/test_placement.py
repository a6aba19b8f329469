"""The placement decision from sizes and free device memory, and moving a sampler's state."""

from __future__ import annotations

import logging

import pytest
import torch

from lightning_mqgnn.graph.csr import CSRGraph
from lightning_mqgnn.pipeline.placement import decide_placement
from lightning_mqgnn.sampling.feature_cache import GNSCache
from lightning_mqgnn.sampling.gns import GNSSampler
from lightning_mqgnn.sampling.residency import copy_state_, state_nbytes, to_device

GiB = 2**30
CUDA = torch.device("cuda", 0)


def decide(sample_on="auto", features_on="auto", graph=1 * GiB, features=2 * GiB, free=10 * GiB, device=CUDA):
    return decide_placement(
        sample_on,
        features_on,
        graph_bytes=graph,
        feature_bytes=features,
        device=device,
        free_bytes=free,
        margin=0.2,
    )


def test_auto_puts_graph_and_features_on_the_device_when_both_fit():
    p = decide()
    assert p.sample_on == CUDA and p.features_on == CUDA and p.on_device and p.features_resident


def test_features_that_do_not_fit_fall_back_to_the_host_gather_and_say_so(caplog):
    with caplog.at_level(logging.INFO, logger="lightning_mqgnn.pipeline.placement"):
        p = decide(features=7.5 * GiB)  # 1 + 7.5 > 0.8 * 10
    assert p.sample_on == CUDA and p.features_on == torch.device("cpu") and not p.features_resident
    warning = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert warning and "7.50 GiB" in warning[0].getMessage() and "8.00 GiB" in warning[0].getMessage()
    # asked explicitly: the same fall-back, not a failure
    assert decide(features_on="cuda", features=7.5 * GiB).features_on == torch.device("cpu")


def test_a_graph_that_does_not_fit_samples_on_the_cpu_under_auto_and_is_refused_under_cuda():
    p = decide(graph=9 * GiB)
    assert not p.on_device and p.features_on == torch.device("cpu")
    with pytest.raises(ValueError, match=r"sample_on='cuda'.*9\.00 GiB"):
        decide("cuda", graph=9 * GiB)


def test_explicit_choices_and_their_errors():
    assert decide("cpu", "auto").sample_on == torch.device("cpu")
    assert decide("cuda", "cpu").features_on == torch.device("cpu")
    with pytest.raises(ValueError, match="features_on='cuda' needs sample_on"):
        decide("cpu", "cuda")
    with pytest.raises(ValueError, match="sample_on='cuda'"):
        decide("cuda", device="cpu", free=None)
    with pytest.raises(ValueError, match="features_on='cuda'"):
        decide("auto", "cuda", device="cpu", free=None)
    with pytest.raises(ValueError, match="sample_on must be one of"):
        decide("gpu")
    assert not decide(device="cpu", free=None).on_device  # auto without CUDA: the CPU


def graph(n=200, m=900, seed=0) -> CSRGraph:
    g = torch.Generator().manual_seed(seed)
    return CSRGraph.from_edges(
        torch.randint(0, n, (m,), generator=g), torch.randint(0, n, (m,), generator=g), n, symmetrize=True
    )


def test_to_device_copies_the_object_graph_and_keeps_shared_parts_shared():
    g = graph()
    cache = GNSCache(g, torch.arange(150), fraction=0.1, seed=0)
    sampler = GNSSampler(g, [3, 3], cache)
    sampler.sample(torch.arange(10))  # builds the scratch arrays
    memo: dict = {}
    moved = to_device(sampler, "cpu", memo)
    moved_cache = to_device(cache, "cpu", memo)
    assert moved is not sampler and moved.cache is moved_cache is not cache
    assert moved.graph is moved.cache.graph is moved._upper.graph  # one graph, as in the original
    assert moved.graph.indices is g.indices  # on the CPU Tensor.to shares the memory
    assert moved._relabel._held is None  # per-process scratch is left behind, rebuilt at first use
    assert state_nbytes(sampler) >= g.indptr.nbytes + g.indices.nbytes + cache.slot.nbytes


def test_copy_state_refreshes_a_copy_in_place_and_refuses_new_shapes():
    g = graph()
    cache = GNSCache(g, torch.arange(150), fraction=0.1, seed=0)

    class Copy:
        pass

    moved = Copy()
    moved.__dict__.update({k: v.clone() for k, v in vars(cache).items() if isinstance(v, torch.Tensor)})
    cache.refresh_(3)
    copy_state_(moved, cache)
    assert torch.equal(moved.slot, cache.slot) and int(moved.version) == 3
    moved.nodes = torch.zeros(1, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"GNSCache.nodes changed shape"):
        copy_state_(moved, cache)
