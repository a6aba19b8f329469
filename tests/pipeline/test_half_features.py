"""Features stored in float16 or bfloat16 are read as float32: the gathered rows, the first
layer's aggregation and the GNS cache's resident rows equal the float32 computation on the
rounded values."""

from __future__ import annotations

import pytest
import torch

from lightning_mqgnn.graph import generate_graph
from lightning_mqgnn.graph.ondisk import open_dataset, write_dataset
from lightning_mqgnn.pipeline.gather import gather
from lightning_mqgnn.pipeline.produce import sample_batch
from lightning_mqgnn.sampling.feature_cache import GNSCache, resident_rows
from lightning_mqgnn.sampling.neighbor import NeighborSampler


@pytest.fixture(scope="module")
def ds():
    return generate_graph(preset="arxiv", scale=0.01, seed=5)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("aggregation", [None, "mean", "gcn"])
def test_half_features_gather_as_their_rounded_values_in_float32(ds, tmp_path, dtype, aggregation):
    half = open_dataset(write_dataset(ds, tmp_path / dtype, features_dtype=dtype))
    assert half.features.dtype == getattr(torch, dtype)
    rounded = ds.features.to(getattr(torch, dtype)).float()
    assert not torch.equal(rounded, ds.features)  # the rounding is real
    sampler = NeighborSampler(ds.graph, [4, 4], aggregation or "mean")
    for index in range(3):
        seeds = ds.train_idx[index * 64 : (index + 1) * 64]
        got = gather(sample_batch(sampler, seeds, index, 0), half.features, half.labels, None, aggregation)
        want = gather(sample_batch(sampler, seeds, index, 0), rounded, ds.labels, None, aggregation)
        name = "aggregated" if aggregation else "features"
        assert getattr(got, name).dtype == torch.float32
        assert torch.equal(getattr(got, name), getattr(want, name))
        assert torch.equal(got.labels, want.labels)


def test_the_gns_cache_holds_half_features_as_float32(ds, tmp_path):
    half = open_dataset(write_dataset(ds, tmp_path / "half", features_dtype="float16"))
    cache = GNSCache(ds.graph, ds.train_idx, fraction=0.05, fanouts=(4, 4), seed=0)
    cache.refresh_(0)
    rows = resident_rows(cache, half.features)
    assert rows.dtype == torch.float32
    assert torch.equal(rows, ds.features[cache.nodes].half().float())
