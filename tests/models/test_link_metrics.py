"""Link metrics against OGB's own evaluator (its ``master.csv`` ships with the package: no
network), scikit-learn's ROC-AUC and a direct pair count."""

from __future__ import annotations

import pytest
import torch
from ogb.linkproppred import Evaluator
from sklearn.metrics import roc_auc_score

from lightning_mqgnn.models.link_metrics import hits_at_k, hits_at_rank, link_ranks, mrr, roc_auc


def scores(seed: int, *shape: int, ties: bool = False) -> torch.Tensor:
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed))
    return (x * 2).round() if ties else x  # ties: a handful of distinct values


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("ties", [False, True])
def test_hits_at_50_matches_ogbl_collab(seed, ties):
    evaluator = Evaluator("ogbl-collab")
    assert evaluator.eval_metric == "hits@50"
    pos, neg = scores(seed, 700, ties=ties) + 1.5, scores(seed + 100, 900, ties=ties)
    expected = evaluator.eval({"y_pred_pos": pos, "y_pred_neg": neg})["hits@50"]
    assert 0 < expected < 1  # a score the comparison can miss
    assert hits_at_k(pos, neg, 50) == pytest.approx(expected, abs=1e-12)


def test_hits_with_fewer_negatives_than_k_is_one_as_in_ogb():
    pos, neg = torch.zeros(5), torch.ones(49)
    assert Evaluator("ogbl-collab").eval({"y_pred_pos": pos, "y_pred_neg": neg})["hits@50"] == 1.0
    assert hits_at_k(pos, neg, 50) == 1.0
    assert hits_at_k(pos, torch.ones(50), 50) == 0.0


def test_hits_counts_only_strictly_higher_positives():
    neg = torch.arange(10.0)  # the 3rd highest negative is 7
    assert hits_at_k(torch.tensor([7.0, 7.5, 9.0, 6.0]), neg, 3) == 0.5


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("ties", [False, True])
def test_mrr_matches_ogbl_citation2(seed, ties):
    evaluator = Evaluator("ogbl-citation2")
    assert evaluator.eval_metric == "mrr"
    pos, neg = scores(seed, 300, ties=ties) + 1.0, scores(seed + 50, 300, 100, ties=ties)
    expected = evaluator.eval({"y_pred_pos": pos, "y_pred_neg": neg})
    assert mrr(pos, neg) == pytest.approx(float(expected["mrr_list"].double().mean()), rel=1e-6)
    for k in (1, 3, 10):
        assert hits_at_rank(pos, neg, k) == pytest.approx(
            float(expected[f"hits@{k}_list"].double().mean()), abs=1e-9
        )


def test_ties_count_half():
    pos = torch.tensor([1.0, 1.0])
    neg = torch.tensor([[1.0, 1.0, 0.0], [2.0, 1.0, 1.0]])
    # row 0: 0 above, 2 tied -> rank 1 + 1 = 2; row 1: 1 above, 2 tied -> rank 1 + 1 + 1 = 3
    assert torch.equal(link_ranks(pos, neg), torch.tensor([2.0, 3.0], dtype=torch.float64))
    assert mrr(pos, neg) == pytest.approx((1 / 2 + 1 / 3) / 2)


def pair_count_auc(pos: torch.Tensor, neg: torch.Tensor) -> float:
    diff = pos.double()[:, None] - neg.double()[None, :]
    return float(((diff > 0).double() + 0.5 * (diff == 0).double()).mean())


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("ties", [False, True])
def test_roc_auc_matches_sklearn_and_a_pair_count(seed, ties):
    pos, neg = scores(seed, 200, ties=ties) + 0.7, scores(seed + 9, 300, ties=ties)
    labels = torch.cat([torch.ones(200), torch.zeros(300)])
    expected = roc_auc_score(labels.numpy(), torch.cat([pos, neg]).numpy())
    assert roc_auc(pos, neg) == pytest.approx(expected, abs=1e-12)
    assert roc_auc(pos, neg) == pytest.approx(pair_count_auc(pos, neg), abs=1e-12)
    vessel = Evaluator("ogbl-vessel").eval({"y_pred_pos": pos, "y_pred_neg": neg})["rocauc"]
    assert roc_auc(pos, neg) == pytest.approx(vessel, abs=1e-12)


def test_bad_inputs_are_one_line():
    for call, match in (
        (
            lambda: hits_at_k(torch.zeros(3, 1), torch.zeros(3), 1),
            r"pos_scores must be 1-D scores, got shape \(3, 1\)",
        ),
        (lambda: hits_at_k(torch.zeros(3), torch.zeros(3), 0), "k must be a positive count, got 0"),
        (lambda: mrr(torch.zeros(3), torch.zeros(4, 2)), r"neg_scores must be \[E, k\] with E = 3"),
        (lambda: roc_auc(torch.zeros(3), torch.zeros(0)), "needs positives and negatives, got 3 and 0"),
    ):
        with pytest.raises(ValueError, match=match) as err:
            call()
        assert "\n" not in str(err.value)
