"""``bench host_policy``: the replacement policies it replays, each against a plain reference, the
optimal one against every other, and the whole benchmark on a small generated graph."""

from __future__ import annotations

import json
from collections import OrderedDict

import numpy as np
import pytest
from helpers.paths import REPO


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "recipes"))
    from benchmarks import host_policy

    return host_policy


def random_trace(seed: int, num_nodes: int, batches: int, per_batch: int) -> tuple[np.ndarray, np.ndarray]:
    """Batches of distinct rows drawn with a skew, as a sampler reads hubs more often."""
    rng = np.random.default_rng(seed)
    weight = 1.0 / np.arange(1, num_nodes + 1) ** 0.8
    reads = [rng.choice(num_nodes, per_batch, replace=False, p=weight / weight.sum()) for _ in range(batches)]
    offsets = np.arange(0, batches * per_batch + 1, per_batch, dtype=np.int64)
    return np.concatenate(reads).astype(np.int64), offsets


def per_batch(hit: list[bool], offsets: np.ndarray) -> list[int]:
    return [sum(hit[a:b]) for a, b in zip(offsets[:-1], offsets[1:])]


def lru_reference(trace, offsets, capacity, initial) -> list[int]:
    held, hit = OrderedDict((v, True) for v in initial), []
    for v in trace.tolist():
        hit.append(v in held)
        if v in held:
            held.move_to_end(v)
        else:
            if len(held) == capacity:
                held.popitem(last=False)
            held[v] = True
    return per_batch(hit, offsets)


def clock_reference(trace, offsets, capacity, initial) -> list[int]:
    slots, bits, hand, hit = list(initial), [False] * len(initial), 0, []
    for v in trace.tolist():
        if v in slots:
            hit.append(True)
            bits[slots.index(v)] = True
            continue
        hit.append(False)
        if len(slots) < capacity:
            slots.append(v)
            bits.append(True)
            continue
        while bits[hand]:
            bits[hand] = False
            hand = (hand + 1) % capacity
        slots[hand], bits[hand] = v, True
        hand = (hand + 1) % capacity
    return per_batch(hit, offsets)


def min_reference(trace, offsets, capacity, initial) -> list[int]:
    """Belady's MIN by brute force: on a miss with the tier full, the row read again latest (the
    missed row among them) leaves."""
    reads, held, hit = trace.tolist(), set(initial), []

    def next_read(v, i):
        return next((j for j in range(i + 1, len(reads)) if reads[j] == v), len(reads))

    for i, v in enumerate(reads):
        hit.append(v in held)
        if v in held:
            continue
        if len(held) < capacity:
            held.add(v)
            continue
        latest = max(held | {v}, key=lambda u: (next_read(u, i), u == v))
        if latest != v:
            held.remove(latest)
            held.add(v)
    return per_batch(hit, offsets)


@pytest.mark.parametrize("capacity", [1, 7, 30, 64])
@pytest.mark.parametrize("start", ["empty", "full"])
def test_each_replacement_policy_replays_as_its_plain_reference(bench, capacity, start):
    trace, offsets = random_trace(capacity, num_nodes=80, batches=12, per_batch=20)
    rng = np.random.default_rng(capacity)
    initial = rng.permutation(80)[: capacity if start == "full" else 0].astype(np.int64)
    for kernel, reference in [
        (bench.lru_hits, lru_reference),
        (bench.clock_hits, clock_reference),
        # which of two rows never read again leaves may differ; no later read can tell
        (bench.min_hits, min_reference),
    ]:
        expected = reference(trace, offsets, capacity, initial.tolist())
        assert kernel(trace, offsets, 80, capacity, initial).tolist() == expected, kernel.__name__


def test_belady_bounds_every_other_policy_and_a_tier_of_every_row_misses_only_first_reads(bench):
    num_nodes = 500
    trace, offsets = random_trace(1, num_nodes, batches=30, per_batch=60)
    rng = np.random.default_rng(0)
    for capacity in (10, 50, 200):
        for score in (np.bincount(trace, minlength=num_nodes), rng.random(num_nodes)):
            start = bench.top_rows(score, capacity)
            best = bench.min_hits(trace, offsets, num_nodes, capacity, start).sum()
            others = [
                bench.lru_hits(trace, offsets, num_nodes, capacity, start).sum(),
                bench.clock_hits(trace, offsets, num_nodes, capacity, start).sum(),
                bench.static_hits(trace, offsets, bench.as_mask(start, num_nodes)).sum(),  # never replaces
            ]
            assert best > max(others), (capacity, best, others)  # on a skewed trace the future pays
    empty = trace[:0]
    first_reads = np.unique(trace).size
    for kernel in (bench.lru_hits, bench.clock_hits, bench.min_hits):
        assert kernel(trace, offsets, num_nodes, num_nodes, empty).sum() == trace.size - first_reads


def test_hit_rates_count_reads_over_every_batch_and_after_the_first_epoch(bench):
    offsets = np.array([0, 10, 30, 40, 60])
    hits = np.array([0, 5, 5, 15])
    assert bench.hit_rates(hits, offsets, per_epoch=2) == (25 / 60, 20 / 30)
    assert bench.hit_rates(hits, offsets, per_epoch=4) == (25 / 60, 25 / 60)  # one epoch: all of it


def test_the_benchmark_replays_the_recipes_batches_and_writes_its_report(bench, tmp_path, capsys):
    rc = bench.main(
        [
            "--data",
            "generated:arxiv",
            "--scale",
            "0.05",
            "--epochs",
            "2",
            "--batch-size",
            "512",
            "--budgets",
            "0.05,0.5",
            "--out",
            str(tmp_path),
        ]  # fmt: skip
    )
    assert rc == 0
    run = json.loads((tmp_path / "host_policy.json").read_text())
    assert run["batches"] == 2 * run["batches_per_epoch"] and run["batches"] == len(run["reads"])
    for budget in run["budgets"]:
        rates = {p: v["hit_rate_after_first_epoch"] for p, v in budget["policies"].items()}
        assert set(rates) == set(bench.POLICIES)
        assert all(0.0 <= r <= 1.0 for r in rates.values())
        hits = {p: sum(v["hits"]) for p, v in budget["policies"].items()}
        assert hits["min"] >= max(hits["walk"], hits["lru"], hits["clock"])  # all start from walk's rows
        assert hits["hindsight"] >= max(hits["degree"], hits["walk"])  # the best static set for this trace
    assert (
        run["budgets"][1]["policies"]["walk"]["hit_rate"] > run["budgets"][0]["policies"]["walk"]["hit_rate"]
    )
    report = (tmp_path / "host_policy.md").read_text()
    assert "| 5% (" in report and "| 50% (" in report and "Replay bookkeeping" in report
    assert (tmp_path / "host_policy.png").stat().st_size > 0
    assert "Host tier policies" in capsys.readouterr().out


def test_unknown_policies_and_budgets_outside_a_share_are_refused(bench):
    with pytest.raises(SystemExit):
        bench.main(["--policies", "lru,fifo"])
    with pytest.raises(SystemExit):
        bench.main(["--budgets", "0,0.1"])
