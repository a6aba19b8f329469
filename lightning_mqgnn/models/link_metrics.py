"""Link-prediction scores as OGB defines them (``ogb.linkproppred.Evaluator``), so a number here
is comparable with the OGB leaderboards: Hits@K over one shared pool of negatives (ogbl-collab,
ogbl-ddi, ogbl-ppa), MRR over per-source negatives (ogbl-citation2), and ROC-AUC (ogbl-vessel).
Scores are higher-is-more-likely; each function returns a Python float.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _one_d(name: str, scores: Tensor) -> Tensor:
    if scores.dim() != 1:
        raise ValueError(f"{name} must be 1-D scores, got shape {tuple(scores.shape)}")
    return scores.detach()


def hits_at_k(pos_scores: Tensor, neg_scores: Tensor, k: int) -> float:
    """The fraction of positives scored strictly above the ``k``-th highest negative (OGB's
    Hits@K: every positive is ranked against the same negatives). With fewer than ``k``
    negatives every positive counts as a hit, as in OGB."""
    pos, neg = _one_d("pos_scores", pos_scores), _one_d("neg_scores", neg_scores)
    if k < 1:
        raise ValueError(f"k must be a positive count, got {k}")
    if pos.numel() == 0:
        raise ValueError("pos_scores is empty: Hits@K needs at least one positive")
    if neg.numel() < k:
        return 1.0
    kth = torch.topk(neg, k).values[-1]
    return float((pos > kth).sum()) / pos.numel()


def link_ranks(pos_scores: Tensor, neg_scores: Tensor) -> Tensor:
    """The rank of each positive among its own negatives (row ``i`` of ``neg_scores [E, k]``),
    from 1; a tie with ``t`` negatives counts half of them, the mean of the optimistic and the
    pessimistic rank, as OGB ranks for ogbl-citation2."""
    pos = _one_d("pos_scores", pos_scores)
    if neg_scores.dim() != 2 or neg_scores.shape[0] != pos.numel():
        raise ValueError(
            f"neg_scores must be [E, k] with E = {pos.numel()} (one row per positive), got shape "
            f"{tuple(neg_scores.shape)}"
        )
    neg = neg_scores.detach()
    pos = pos.to(neg.device).unsqueeze(1)
    above = (neg > pos).sum(1)
    at_least = (neg >= pos).sum(1)
    return 1.0 + 0.5 * (above + at_least).to(torch.float64)


def mrr(pos_scores: Tensor, neg_scores: Tensor) -> float:
    """Mean reciprocal rank of each positive among its per-source negatives ``[E, k]``
    (``link_ranks``; OGB's ogbl-citation2 MRR)."""
    ranks = link_ranks(pos_scores, neg_scores)
    if ranks.numel() == 0:
        raise ValueError("pos_scores is empty: MRR needs at least one positive")
    return float(ranks.reciprocal().mean())


def hits_at_rank(pos_scores: Tensor, neg_scores: Tensor, k: int) -> float:
    """The fraction of positives whose ``link_ranks`` rank is at most ``k`` (OGB's per-source
    Hits@1/3/10 for ogbl-citation2)."""
    ranks = link_ranks(pos_scores, neg_scores)
    if ranks.numel() == 0:
        raise ValueError("pos_scores is empty: Hits@K needs at least one positive")
    return float((ranks <= k).to(torch.float64).mean())


def roc_auc(pos_scores: Tensor, neg_scores: Tensor) -> float:
    """The probability that a random positive outscores a random negative, a tie counting half
    (the Mann-Whitney statistic, which is the area under the ROC curve: OGB's rocauc via
    scikit-learn), from mid-ranks of the pooled scores in one sort."""
    pos, neg = _one_d("pos_scores", pos_scores), _one_d("neg_scores", neg_scores)
    if pos.numel() == 0 or neg.numel() == 0:
        raise ValueError(f"ROC-AUC needs positives and negatives, got {pos.numel()} and {neg.numel()} scores")
    scores = torch.cat([pos.to(torch.float64), neg.to(pos.device, torch.float64)])
    _, inverse, counts = torch.unique(scores, return_inverse=True, return_counts=True)
    ends = torch.cumsum(counts, 0).to(torch.float64)
    mid_rank = ends - (counts.to(torch.float64) - 1) / 2  # ranks from 1; ties share their mean
    n_pos, n_neg = pos.numel(), neg.numel()
    pos_rank_sum = mid_rank[inverse[:n_pos]].sum()
    return float((pos_rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))
