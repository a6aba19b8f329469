"""The layer stacks of full-graph models, cut into the pieces a layer pipeline schedules.

A stack is ``embed`` (rows any rank can compute from its input features: the first convolution's
input, and GCNII's initial representation H0; ``embed_dropped`` the same for inputs the caller
already dropped out with probability ``input_dropout``), ``num_convs`` convolutions ``conv(i,
block, h_src, h0_dst)`` and a ``head`` on the last convolution's rows. Graph-parallel training runs the pieces in
order on a partition; GNNPipe gives each pipeline stage a range of the convolutions.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lightning_mqgnn.models.gcnii import GCNIILayer, identity_mapping_strength
from lightning_mqgnn.models.layers import layer_dims, layer_stack
from lightning_mqgnn.sampling.batch import Block


class ConvStack(nn.Module):
    """GCN or SAGE layers (``layer_stack``, ``glorot`` its initialisation): the features are the
    first layer's input, ReLU and dropout follow every layer but the last, whose output is the
    logits."""

    def __init__(
        self,
        conv: str,
        in_dim: int,
        hidden: int,
        num_classes: int,
        num_layers: int,
        dropout: float,
        glorot: bool | None = None,
    ):
        super().__init__()
        self.layers = nn.ModuleList(layer_stack(conv, in_dim, hidden, num_classes, num_layers, glorot))
        self.widths = layer_dims(in_dim, hidden, num_classes, num_layers)
        self.dropout = nn.Dropout(dropout)

    @property
    def num_convs(self) -> int:
        return len(self.layers)

    input_dropout = 0.0

    def embed(self, x: Tensor) -> Tensor:
        return x

    def embed_dropped(self, x: Tensor) -> Tensor:
        return x

    def conv(self, i: int, block: Block, h_src: Tensor, h0_dst: Tensor) -> Tensor:
        h = self.layers[i](block, h_src)
        return self.dropout(torch.relu(h)) if i < self.num_convs - 1 else h

    def head(self, h: Tensor) -> Tensor:
        return h


class GCNIIStack(nn.Module):
    """GCNII (eq. 5-6): ``H0 = ReLU(dropout(X) W_in)``, ``num_layers`` GCNII convolutions of width
    ``hidden`` with α = ``alpha`` and β_l = ln(θ/l + 1), each followed by ReLU and dropout, and a
    linear head."""

    def __init__(
        self,
        in_dim: int,
        hidden: int,
        num_classes: int,
        num_layers: int,
        dropout: float,
        alpha: float = 0.1,
        theta: float = 0.5,
    ):
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {num_layers}")
        self.lin_in = nn.Linear(in_dim, hidden)
        self.layers = nn.ModuleList(
            GCNIILayer(hidden, alpha, identity_mapping_strength(theta, i + 1)) for i in range(num_layers)
        )
        self.lin_out = nn.Linear(hidden, num_classes)
        self.widths = [hidden] * (num_layers + 1)
        self.dropout = nn.Dropout(dropout)

    @property
    def num_convs(self) -> int:
        return len(self.layers)

    @property
    def input_dropout(self) -> float:
        return self.dropout.p

    def embed(self, x: Tensor) -> Tensor:
        return self.embed_dropped(self.dropout(x))

    def embed_dropped(self, x: Tensor) -> Tensor:
        """``embed`` of inputs already dropped out: a layer pipeline draws one input mask per epoch
        for all its stages, so every stage's H0 of a node is the same."""
        return torch.relu(self.lin_in(x))

    def conv(self, i: int, block: Block, h_src: Tensor, h0_dst: Tensor) -> Tensor:
        return self.dropout(torch.relu(self.layers[i](block, h_src, h0_dst)))

    def head(self, h: Tensor) -> Tensor:
        return self.lin_out(h)


Stack = ConvStack | GCNIIStack
