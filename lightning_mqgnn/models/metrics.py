"""The score of a dataset, chosen by its ``metric`` field, and the matching loss."""

from __future__ import annotations

import torch
import torchmetrics
from torch import Tensor
from torch.nn import functional as F


def make_metric(metric: str, num_classes: int, multilabel: bool) -> torchmetrics.Metric:
    """accuracy / micro-F1 (multi-class) or ROC-AUC (binary: score of class 1; multi-label: mean
    over tasks, as OGB scores ogbn-proteins)."""
    if metric == "rocauc":
        if multilabel:
            return torchmetrics.classification.MultilabelAUROC(num_labels=num_classes, average="macro")
        if num_classes != 2:
            raise ValueError(f"metric 'rocauc' needs a binary or multi-label task, got {num_classes} classes")
        return torchmetrics.classification.BinaryAUROC()
    if multilabel:
        raise ValueError(f"metric {metric!r} is not defined for multi-label tasks; use 'rocauc'")
    if metric == "accuracy":
        return torchmetrics.classification.MulticlassAccuracy(num_classes=num_classes, average="micro")
    if metric == "micro_f1":
        return torchmetrics.classification.MulticlassF1Score(num_classes=num_classes, average="micro")
    raise ValueError(f"unknown metric {metric!r}; expected accuracy, micro_f1 or rocauc")


def metric_input(logits: Tensor, metric: str, multilabel: bool) -> Tensor:
    """What the metric scores: class-1 probability for binary ROC-AUC, logits otherwise."""
    if metric == "rocauc" and not multilabel:
        return torch.softmax(logits, dim=-1)[:, 1]
    return logits


def node_loss(logits: Tensor, labels: Tensor, multilabel: bool, reduction: str = "mean") -> Tensor:
    """Cross-entropy, or the per-task binary cross-entropy of eq. 19 for multi-label tasks.
    ``reduction="sum"`` sums over nodes (tasks stay averaged): what full-graph ranks add up."""
    if multilabel:
        loss = F.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype), reduction=reduction)
        return loss / max(1, labels.shape[1]) if reduction == "sum" else loss
    return F.cross_entropy(logits, labels, reduction=reduction)
