from lightning_mqgnn.models.inference import (
    FullGraphBatch,
    FullGraphInference,
    FullGraphLoader,
    LinkEvalBatch,
)
from lightning_mqgnn.models.layers import GCNLayer, SAGELayer
from lightning_mqgnn.models.link_predictor import LinkPredictor
from lightning_mqgnn.models.node_classifier import NodeClassifier

__all__ = [
    "FullGraphBatch",
    "FullGraphInference",
    "FullGraphLoader",
    "GCNLayer",
    "LinkEvalBatch",
    "LinkPredictor",
    "NodeClassifier",
    "SAGELayer",
]
