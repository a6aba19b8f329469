"""The host tier of features on disk: each policy holds the rows it ranks first within its
budget, reads through the tiers give the feature rows themselves, in the training process and
in sampler workers, the ranks of one machine share one tier, and bad settings are one clear
error."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from lightning_mqgnn.graph import generate_graph
from lightning_mqgnn.graph.ondisk import open_dataset, write_dataset
from lightning_mqgnn.pipeline.gather import batch_gathers
from lightning_mqgnn.pipeline.host_cache import TieredFeatures, host_row_cache, shared_host_row_cache
from lightning_mqgnn.pipeline.workers import SamplerWorkerPool
from lightning_mqgnn.sampling.feature_cache import random_walk_distribution
from lightning_mqgnn.sampling.neighbor import NeighborSampler


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    ds = generate_graph(preset="arxiv", scale=0.01, seed=3)
    return ds, write_dataset(ds, tmp_path_factory.mktemp("host") / "ds")


@pytest.fixture(scope="module")
def on_disk(written):
    ds, folder = written
    return ds, open_dataset(folder)


@pytest.mark.parametrize("policy", ["degree", "walk"])
def test_a_policy_holds_the_rows_it_ranks_first_within_the_budget(on_disk, policy):
    ds, mapped = on_disk
    row_bytes = ds.features.shape[1] * 4
    budget_gb = 100.5 * row_bytes / 1e9  # room for 100 rows and half of one
    cache = host_row_cache(mapped, budget_gb, policy, [5, 5])
    assert cache.nodes.numel() == 100 and cache.nbytes == 100 * row_bytes
    assert torch.equal(cache.nodes, torch.sort(cache.nodes).values)
    assert torch.equal(cache.rows, ds.features[cache.nodes])  # read from the file, the same rows
    assert cache.rows.is_shared() and cache.nodes.is_shared()
    if policy == "degree":
        score = torch.bincount(ds.graph.indices, minlength=ds.graph.num_nodes).to(torch.float64)
    else:
        score = random_walk_distribution(ds.graph, ds.train_idx, [5, 5])
    held = torch.zeros(ds.graph.num_nodes, dtype=torch.bool)
    held[cache.nodes] = True
    assert float(score[held].min()) >= float(score[~held].max())  # no row left out ranks higher


def test_reads_through_the_tiers_are_the_feature_rows(on_disk):
    ds, mapped = on_disk
    cache = host_row_cache(mapped, 300 * 512 / 1e9, "degree")
    tiered = TieredFeatures(cache, mapped.features)
    ids = torch.randint(0, ds.graph.num_nodes, (2000,), generator=torch.Generator().manual_seed(0))
    ids[:50] = cache.nodes[:50]  # some certainly held
    ids[50:60] = ids[0]  # repeats
    assert torch.equal(tiered.read(ids), ds.features[ids])
    out = torch.full((ids.numel(), ds.features.shape[1]), float("nan"))
    tiered.read(ids, out=out)
    assert torch.equal(out, ds.features[ids])
    assert tiered.hits(ids) == int(torch.isin(ids, cache.nodes).sum()) >= 60
    assert tiered.read(ids[:0]).shape == (0, ds.features.shape[1])
    everything = host_row_cache(mapped, 1.0, "walk")  # a budget above the features: all of them
    assert everything.nodes.numel() == ds.graph.num_nodes
    assert TieredFeatures(everything, mapped.features).hits(ids) == ids.numel()


@pytest.mark.parametrize("aggregation", [None, "mean"], ids=["rows", "aggregated"])
def test_a_worker_gathers_through_the_tiers_what_the_features_give(on_disk, aggregation):
    ds, mapped = on_disk
    sampler = NeighborSampler(mapped.graph, [4, 4])
    tiered = TieredFeatures(host_row_cache(mapped, 500 * 512 / 1e9, "walk", [4, 4]), mapped.features)
    seeds = ds.train_idx[:64]
    pool = SamplerWorkerPool(sampler, tiered, mapped.labels, 1, input_aggregation=aggregation)
    pool.start()
    try:
        pool.submit(0, 0, seeds, 7)
        got = pool.get(timeout=60).batch
    finally:
        pool.stop()
    expect = sampler_batch(sampler, seeds, 7)
    want = batch_gathers(expect, ds.features, ds.labels, None, aggregation)
    name = "aggregated" if aggregation else "features"
    assert torch.equal(getattr(got, name), want[name].value())
    assert 0 < got.meta["host_hits"] < got.meta["host_reads"] == expect.input_nodes.numel()


def sampler_batch(sampler, seeds, rng_seed):
    from lightning_mqgnn.pipeline.produce import sample_batch

    return sample_batch(sampler, seeds, rng_seed, 0)


def test_bad_host_cache_settings_are_one_clear_error(on_disk):
    _, mapped = on_disk
    with pytest.raises(ValueError, match=r"policy must be one of \('degree', 'walk'\), got 'lru'"):
        host_row_cache(mapped, 0.001, "lru")
    with pytest.raises(ValueError, match="positive number of GB, got -1"):
        host_row_cache(mapped, -1, "walk")
    with pytest.raises(ValueError, match="holds no row of 512 bytes"):
        host_row_cache(mapped, 1e-7, "walk")


def test_a_featureless_graph_has_no_rows_for_a_host_tier():
    from lightning_mqgnn.graph.link_dataset import link_only_dataset
    from lightning_mqgnn.pipeline.host_cache import host_tier_capacity

    ds = link_only_dataset("g", generate_graph(preset="arxiv", scale=0.002, seed=0).graph)
    with pytest.raises(
        ValueError, match=r"g has no features: a host cache of feature rows has nothing to hold"
    ):
        host_tier_capacity(ds, 0.001, "walk")


def test_a_tier_travels_as_its_machine_memory_not_its_rows(on_disk, tmp_path):
    """Pickled, a tier is its handles: a process started on its own maps the same memory."""
    _, mapped = on_disk
    cache = host_row_cache(mapped, 400 * 512 / 1e9, "degree")
    total_before = float(cache.rows.double().sum())
    blob = pickle.dumps(cache)
    assert len(blob) < 2000 < cache.nbytes
    (tmp_path / "tier.pkl").write_bytes(blob)
    child = (
        "import pickle, sys; tier = pickle.loads(open(sys.argv[1], 'rb').read()); "
        "print(tier.filled_by, float(tier.rows.double().sum()), tier.nodes.numel()); tier.rows[3, 5] = -7.0"
    )
    proc = subprocess.run(
        [sys.executable, "-c", child, str(tmp_path / "tier.pkl")], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    filled_by, total, count = proc.stdout.split()
    assert int(filled_by) == os.getpid() and int(count) == 400
    assert float(total) == pytest.approx(total_before, rel=1e-12)
    assert float(cache.rows[3, 5]) == -7.0  # the child wrote into this process's memory: no copy


def _rank(rank, folder, out, node_ranks, fail_on_build):
    dist.init_process_group("gloo", init_method=f"file://{out}/rendezvous", rank=rank, world_size=2)
    builds = []

    def build():
        builds.append(rank)
        if fail_on_build:
            raise ValueError("the features file went away")
        return host_row_cache(open_dataset(folder), 300 * 512 / 1e9, "degree")

    local_rank = 0 if node_ranks[0] != node_ranks[1] else rank
    started = time.perf_counter()
    try:
        tier = shared_host_row_cache(build, local_rank, node_ranks[rank])
        result = dict(filled_by=tier.filled_by, pid=os.getpid(), builds=len(builds), rows=tier.rows.tolist())
    except Exception as err:
        result = dict(error=f"{type(err).__name__}: {err}", seconds=time.perf_counter() - started)
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def _two_ranks(folder, tmp_path, node_ranks, fail_on_build=False):
    mp.spawn(_rank, (folder, tmp_path, node_ranks, fail_on_build), nprocs=2, join=True)
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]


def test_the_ranks_of_one_machine_share_the_tier_their_local_rank_0_filled(written, on_disk, tmp_path):
    _, mapped = on_disk
    first, second = _two_ranks(written[1], tmp_path, node_ranks=(0, 0))
    assert first["builds"] == 1 and second["builds"] == 0  # the features were read once
    assert first["filled_by"] == second["filled_by"] == first["pid"] != second["pid"]
    assert first["rows"] == second["rows"]
    reference = host_row_cache(mapped, 300 * 512 / 1e9, "degree")
    assert torch.equal(torch.tensor(second["rows"]), reference.rows)


def test_ranks_on_different_machines_each_fill_their_own(written, tmp_path):
    first, second = _two_ranks(written[1], tmp_path, node_ranks=(0, 1))
    assert first["builds"] == second["builds"] == 1
    assert first["filled_by"] == first["pid"] and second["filled_by"] == second["pid"]
    assert first["rows"] == second["rows"]


def test_a_failed_fill_fails_every_rank_of_its_machine_at_once(written, tmp_path):
    first, second = _two_ranks(written[1], tmp_path, node_ranks=(0, 0), fail_on_build=True)
    assert first["error"] == "ValueError: the features file went away"
    assert second["error"] == (
        "RuntimeError: host tier: local rank 0 of node 0 failed to build it: "
        "ValueError('the features file went away')"
    )
    assert second["seconds"] < 10
