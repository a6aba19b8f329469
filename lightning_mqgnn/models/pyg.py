"""PyTorch Geometric layers on our blocks: ``PyGNodeClassifier`` trains any stack of PyG
``MessagePassing`` layers (``SAGEConv``, ``GCNConv``, ``GATConv``, user layers) on the pipeline's
mini-batches and scores it with the same exact full-graph inference as ``NodeClassifier``.

Each layer sees a block in PyG's bipartite form (``sampling.pyg_blocks``). Layers whose
``forward`` accepts a pair of tensors get ``((x_src, x_dst), edge_index)`` with
``x_dst = x_src[:num_dst]``; the others get ``x_src`` and their first ``num_dst`` output rows are
kept. Layers whose ``forward`` takes ``edge_weight`` get the block weights, which already carry
the sampler's normalisation (so ``GCNConv`` must be built with ``normalize=False``).

PyG is imported only by the layer-stack factories, so the module loads without it.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Iterable

import torch
from torch import Tensor, nn

from lightning_mqgnn.graph.pyg import import_pyg
from lightning_mqgnn.models.layers import layer_dims
from lightning_mqgnn.models.node_classifier import NodeClassifierBase
from lightning_mqgnn.sampling.batch import Block
from lightning_mqgnn.sampling.pyg_blocks import block_to_pyg

LayerStack = Iterable[nn.Module] | Callable[[int, int], Iterable[nn.Module]]


def _accepts_pair(annotation: object) -> bool:
    """Whether a ``forward``'s first annotation admits a tuple (PyG's ``PairTensor``)."""
    if annotation is tuple or typing.get_origin(annotation) is tuple:
        return True
    return any(_accepts_pair(a) for a in typing.get_args(annotation))


class PyGLayer(nn.Module):
    """A PyG ``MessagePassing`` layer called as ``layer(block, h_src, h_dst=None)``, the way
    every layer of ``NodeClassifierBase`` is.

    ``h_dst`` (exact inference) gives the destination rows when they are not the first sources;
    they are then put in front of the sources, so a layer that adds self loops by local id (as
    ``GATConv`` does) links each destination to its own row.
    """

    def __init__(self, conv: nn.Module):
        super().__init__()
        params = inspect.signature(conv.forward).parameters
        if not params:
            raise ValueError(
                f"{type(conv).__name__}.forward takes no arguments; expected (x, edge_index, ...)"
            )
        self.conv = conv
        first = next(iter(params.values()))
        try:  # resolves string annotations (modules with ``from __future__ import annotations``)
            annotation = typing.get_type_hints(conv.forward).get(first.name, first.annotation)
        except (NameError, TypeError):
            annotation = first.annotation
        self.pair_input = _accepts_pair(annotation)
        self.takes_edge_weight = "edge_weight" in params
        if self.takes_edge_weight and getattr(conv, "normalize", False) is True:
            raise ValueError(
                f"{type(conv).__name__}(normalize=True) would normalise the block weights again: they "
                "already carry the sampler's normalisation; build it with normalize=False"
            )

    def forward(self, block: Block, h_src: Tensor, h_dst: Tensor | None = None) -> Tensor:
        pyg = block_to_pyg(block)
        edge_index = pyg.edge_index
        if not block.dst_in_src:
            if h_dst is None:
                raise ValueError(
                    f"{type(self.conv).__name__} needs the destination rows: the block's destinations "
                    "are not a prefix of its sources (use a node-wise sampler)"
                )
            h_src = torch.cat([h_dst, h_src])
            edge_index = edge_index + torch.tensor([[block.num_dst], [0]], device=edge_index.device)
        kwargs = {"edge_weight": pyg.edge_weight} if self.takes_edge_weight else {}
        if self.pair_input:
            return self.conv((h_src, h_src[: block.num_dst]), edge_index, **kwargs)
        return self.conv(h_src, edge_index, **kwargs)[: block.num_dst]


class PyGNodeClassifier(NodeClassifierBase):
    """Node classification with a user-supplied stack of PyG layers, ReLU + dropout between them.

    ``layers``: the ``MessagePassing`` modules, input layer first, or a factory
    ``(in_dim, num_classes) -> layers`` (as the configs use, e.g. ``gat_stack``).
    ``aggregation``: the sampler's (``"mean"`` or ``"gcn"``), whose block weights the layers get
    and exact inference uses. Mini-batches must carry feature rows, so the DataModule does not
    aggregate the first layer for this module (``accepts_aggregated_inputs`` is False).
    """

    def __init__(
        self,
        in_dim: int,
        num_classes: int,
        layers: LayerStack,
        aggregation: str = "mean",
        dropout: float = 0.5,
        lr: float = 1e-3,
        weight_decay: float = 0.0,
        metric: str = "accuracy",
        multilabel: bool = False,
    ):
        layers = list(layers(in_dim, num_classes) if _is_factory(layers) else layers)
        if not layers:
            raise ValueError("PyGNodeClassifier needs at least one layer")
        super().__init__(
            [PyGLayer(conv) for conv in layers],
            aggregation,
            num_classes=num_classes,
            dropout=dropout,
            lr=lr,
            weight_decay=weight_decay,
            metric=metric,
            multilabel=multilabel,
        )
        self.save_hyperparameters(ignore=["layers"])


def _is_factory(layers: LayerStack) -> bool:
    return callable(layers) and not isinstance(layers, nn.Module)


def sage_stack(in_dim: int, num_classes: int, hidden: int = 256, num_layers: int = 2) -> list[nn.Module]:
    """PyG ``SAGEConv`` (mean) layers: GraphSAGE-mean (eq. 17), with ``aggregation="mean"``."""
    import_pyg()
    from torch_geometric.nn import SAGEConv

    dims = layer_dims(in_dim, hidden, num_classes, num_layers)
    return [SAGEConv(a, b, aggr="mean") for a, b in zip(dims[:-1], dims[1:])]


def gcn_stack(in_dim: int, num_classes: int, hidden: int = 256, num_layers: int = 2) -> list[nn.Module]:
    """PyG ``GCNConv`` layers on the block weights (eq. 1-3), with ``aggregation="gcn"``."""
    import_pyg()
    from torch_geometric.nn import GCNConv

    dims = layer_dims(in_dim, hidden, num_classes, num_layers)
    return [GCNConv(a, b, normalize=False, add_self_loops=False) for a, b in zip(dims[:-1], dims[1:])]


def gat_stack(
    in_dim: int,
    num_classes: int,
    hidden: int = 8,
    heads: int = 8,
    num_layers: int = 2,
    attention_dropout: float = 0.0,
) -> list[nn.Module]:
    """PyG ``GATConv`` layers (Veličković et al. 2018): ``heads`` concatenated heads of width
    ``hidden`` per hidden layer, one head for the output layer. Attention replaces the block
    weights, so any node-wise sampler's blocks serve (``aggregation="mean"``)."""
    import_pyg()
    from torch_geometric.nn import GATConv

    dims = layer_dims(in_dim, hidden, num_classes, num_layers)
    layers: list[nn.Module] = []
    width = in_dim
    for i, out in enumerate(dims[1:]):
        last = i == num_layers - 1
        layers.append(GATConv(width, out, heads=1 if last else heads, dropout=attention_dropout))
        width = out * heads
    return layers
