"""Full-graph training on 4 gloo processes: graph-parallel equals single-process full-graph
training; stale and quantised modes keep their staleness bound; a dying rank fails fast."""

from __future__ import annotations

import io

import helpers.fullgraph_ranks as ranks
import pytest
import torch

from lightning_mqgnn.fullgraph import PartitionBook  # noqa: E402

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def equivalence_reports():
    reports = ranks.launch(ranks.equivalence_rank, timeout=120)
    errors = {r: p for r, (s, p) in reports.items() if s != "ok"}
    assert not errors, "\n".join(f"rank {r}:\n{p}" for r, p in errors.items())
    assert sorted(reports) == list(range(ranks.WORLD)), f"ranks reported: {sorted(reports)}"
    return {r: torch.load(io.BytesIO(p), weights_only=False) for r, (_, p) in reports.items()}


@pytest.mark.parametrize("conv", ["gcn", "sage"])
def test_graph_parallel_equals_single_process(equivalence_reports, conv):
    reference = ranks.reference_run(conv, steps=3)
    for rank, report in equivalence_reports.items():
        steps, ages, _, _ = report[("sync", conv)]
        for step, ((loss, grads), (ref_loss, ref_grads)) in enumerate(zip(steps, reference)):
            assert loss == pytest.approx(ref_loss, rel=1e-5), f"rank {rank} step {step}"
            for g, ref in zip(grads, ref_grads):
                torch.testing.assert_close(g, ref, rtol=1e-4, atol=1e-6)
        assert all(age == 0 for a in ages.values() for age in a)  # synchronous: never stale


def test_bytes_are_the_halo_rows_times_width(equivalence_reports):
    ds = ranks.small_dataset()
    book = PartitionBook.build(ds.graph, ranks.WORLD, "metis", seed=0)
    for rank, report in equivalence_reports.items():
        part = book.local(ds.graph, rank, "gcn")
        sent_rows = sum(int(i.numel()) for i in part.send_idx)
        # 3 steps x layers 1 and 2 (hidden 16, float32): features of sent rows, gradients of halo rows
        expected = 3 * 2 * (sent_rows + part.num_halo) * 16 * 4
        assert report[("sync", "gcn")][3] == expected


def test_stale_halo_is_exactly_one_epoch_old(equivalence_reports):
    reference = ranks.reference_run("gcn", steps=4)
    for report in equivalence_reports.values():
        steps, ages, _, _ = report["stale"]
        # first epoch fresh (no earlier halo), every later one uses the previous epoch's halo
        assert set(ages) == {(1, "forward"), (1, "backward"), (2, "forward"), (2, "backward")}
        assert all(a == [0, 1, 1, 1] for a in ages.values())
        assert steps[0][0] == pytest.approx(reference[0][0], rel=1e-5)  # the fresh first epoch is exact
        # later epochs see last epoch's halo, so they differ from the synchronous run
        assert any(
            not torch.allclose(g, r, rtol=1e-4, atol=1e-6) for g, r in zip(steps[2][1], reference[2][1])
        )


def test_smoothing_averages_the_stale_rows_from_the_second_stale_epoch(equivalence_reports):
    for report in equivalence_reports.values():
        plain, _, _, _ = report["stale"]
        smoothed, ages, _, _ = report["smoothed"]
        assert all(a == [0, 1, 1, 1] for a in ages.values())  # the newest rows: one epoch old
        # epoch 0 fresh, epoch 1 the first stale one (nothing to average yet): identical
        for epoch in (0, 1):
            assert smoothed[epoch][0] == pytest.approx(plain[epoch][0], rel=1e-6)
        assert smoothed[3][0] != pytest.approx(plain[3][0], rel=1e-6)


def test_pipeqs_sends_fewer_bytes_and_stays_close(equivalence_reports):
    reference = ranks.reference_run("gcn", steps=4)
    for report in equivalence_reports.values():
        steps, _, history, quantised_bytes = report["pipeqs"]
        _, _, _, stale_bytes = report["stale"]
        assert quantised_bytes < stale_bytes
        for bits, fresh, _ in (h for hs in history.values() for h in hs[1:]):
            assert bits in (2, 4, 8) and not fresh
        for (loss, _), (ref_loss, _) in zip(steps, reference):
            assert abs(loss - ref_loss) < 0.05 * ref_loss


def test_dying_rank_fails_fast_with_a_clear_error():
    ranks.assert_peers_fail_fast(ranks.dying_rank, dead=3)
