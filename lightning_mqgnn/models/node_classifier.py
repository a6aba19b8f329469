"""LightningModules for node classification on sampled blocks: the shared training and exact
inference, and ``NodeClassifier``, the GCN/SAGE stacks of all ten paper variants."""

from __future__ import annotations

import warnings
from functools import cached_property
from typing import Any

import lightning.pytorch as pl
import torch
from torch import Tensor, nn
from typing_extensions import override

from lightning_mqgnn.graph.dataset import GraphDataset
from lightning_mqgnn.models.cuda_graphs import CUDAGraphSteps
from lightning_mqgnn.models.dropout import ReLUDropout
from lightning_mqgnn.models.inference import FullGraphBatch, FullGraphInference
from lightning_mqgnn.models.layers import layer_stack
from lightning_mqgnn.models.metrics import make_metric, metric_input, node_loss
from lightning_mqgnn.models.optim import adam
from lightning_mqgnn.models.work import LayerWidth, batch_work, inference_work, layer_widths
from lightning_mqgnn.sampling.batch import Block, MiniBatch

AGGREGATION_OF_CONV = {"gcn": "gcn", "sage": "mean"}
# the attribute in which Lightning names the hook it is running (``LightningModule.log`` reads it)
HOOK_NAME_ATTRIBUTE = "_current_fx_name"
# A training step's first GEMM on [A X, X_dst] converts it to CSR and multiplies forward and back;
# on the 2-core VM that beat the dense product below about 3% non-zero (dblp 0.8%: 2.1x faster
# batches, cora 2.6%: 1.3x) and lost above it (citeseer 4.2%, coauthor_physics 7.7%, coauthor_cs 11%)
SPARSE_INPUT_DENSITY = 0.03


def autocast_on(device_type: str) -> bool:
    """Whether autocast is on for ``device_type`` ("cpu" or "cuda"); torch before 2.4 takes no
    device argument and asks about CUDA, with a function of its own for the CPU."""
    try:
        return torch.is_autocast_enabled(device_type)
    except TypeError:
        return torch.is_autocast_enabled() if device_type == "cuda" else torch.is_autocast_cpu_enabled()


def compiling() -> bool:
    """Whether torch.compile is tracing (torch before 2.3 has no public way to ask: False)."""
    is_compiling = getattr(torch.compiler, "is_compiling", None)
    return bool(is_compiling is not None and is_compiling())


# NodeClassifierBase moves its batches itself (``transfer_batch_to_device``), whether a DataModule
# or plain loaders feed it (recipes/benchmarks/step.py); fitted with a DataModule, Lightning warns
# on every fit that the module's hook is the one used, which is as intended
warnings.filterwarnings(
    "ignore",
    message=r"You have overridden `transfer_batch_to_device` in `LightningModule` but have passed in a"
    r" `LightningDataModule`\. It will use the implementation from `LightningModule` instance\.\Z",
    category=UserWarning,
    module=r"lightning\.pytorch\.trainer\.connectors\.data_connector\Z",
)


class NodeClassifierBase(pl.LightningModule):
    """Node classification on sampled blocks: training consumes ``MiniBatch``es, validation and
    test consume ``FullGraphBatch``es and run exact inference over the same ``layers``. Logged
    metrics: ``train/loss``, ``val/metric``, ``test/metric``.

    Subclasses build ``layers``, each called as ``layer(block, h_src, h_dst=None)``, and name the
    ``aggregation`` (``Sampler.aggregation``) whose block weights those layers expect.
    ``accepts_aggregated_inputs``: whether the module takes batches whose first layer the gather
    stage has aggregated (``MiniBatch.aggregated``); the DataModule only aggregates for modules
    that say so. ``cuda_graphs``: on a GPU, replay the step's forward and backward from CUDA graphs
    (``models/cuda_graphs.py``) in a single-process run without autocast; for subclasses whose
    ``forward(blocks, x)`` is made of capturable operations only.
    """

    accepts_aggregated_inputs: bool = False
    # whether every layer but the last ends in an operation whose backward does not read its
    # output (a linear map, a weighted sum), so ReLU + dropout may overwrite it
    activations_overwritable: bool = False

    def __init__(
        self,
        layers: list[nn.Module],
        aggregation: str,
        num_classes: int,
        dropout: float,
        lr: float,
        weight_decay: float,
        metric: str,
        multilabel: bool,
        cuda_graphs: bool = False,
    ):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.relu_dropout = ReLUDropout(dropout, inplace=self.activations_overwritable)
        self.aggregation = aggregation
        self.lr = lr
        self.weight_decay = weight_decay
        self.metric_name = metric
        self.multilabel = multilabel
        self.val_metric = make_metric(metric, num_classes, multilabel)
        self.test_metric = make_metric(metric, num_classes, multilabel)
        self._inference: FullGraphInference | None = None
        self._graph_steps = CUDAGraphSteps() if cuda_graphs else None

    @override
    def __setattr__(self, name: str, value: Any) -> None:
        """Lightning writes the running hook's name about 46 times a training step; through
        ``nn.Module.__setattr__``, which first looks for a parameter, buffer or submodule of that
        name, each write took microseconds. A string is none of those, so it goes where
        ``nn.Module`` would have put it, the instance's ``__dict__``, directly."""
        if name == HOOK_NAME_ATTRIBUTE:
            self.__dict__[name] = value
        else:
            super().__setattr__(name, value)

    @override
    def forward(self, blocks: list[Block], x: Tensor) -> Tensor:
        """Logits of the last block's destinations from the input rows ``x`` of the first block."""
        h = x
        for i, (layer, block) in enumerate(zip(self.layers, blocks)):
            h = layer(block, h)
            if i < len(self.layers) - 1:
                h = self.relu_dropout(h)
        return h

    def batch_logits(self, batch: MiniBatch) -> Tensor:
        if batch.aggregated is not None:
            raise ValueError(
                f"{type(self).__name__} reads input feature rows, but the mini-batch carries its first "
                "layer's aggregation: build the DataModule with LoaderSettings(aggregate_inputs=False)"
            )
        return self(batch.blocks, batch.input_features())

    @override
    def training_step(self, batch: MiniBatch, batch_idx: int) -> Tensor:
        if len(batch.blocks) != len(self.layers):
            raise ValueError(
                f"mini-batch has {len(batch.blocks)} blocks, model has {len(self.layers)} layers"
            )
        loss = self._graphed_loss(batch)
        if loss is None:
            loss = node_loss(self.batch_logits(batch), batch.labels, self.multilabel)
        if self._logging_step():
            # on the host: Lightning turns a progress-bar value into a number after every batch,
            # which for a GPU tensor is a wait for the device each step, not only on this one
            self.log("train/loss", loss.detach().cpu(), prog_bar=True, batch_size=batch.output_nodes.numel())
        return loss

    def _graphed_loss(self, batch: MiniBatch) -> Tensor | None:
        """The loss replayed from this module's CUDA graphs, or None where the step runs eagerly:
        graphs off, a batch on the host, autocast (whose cast cache a graph cannot hold), or several
        processes (gradient hooks of DDP-like strategies are not captured)."""
        if self._graph_steps is None or batch.labels is None or not batch.labels.is_cuda:
            return None
        if autocast_on("cuda") or (self._trainer is not None and self._trainer.world_size > 1):
            return None
        return self._graph_steps.loss(self, batch)

    def _logging_step(self) -> bool:
        """Whether this step reaches the logger: ``self.log`` costs Python time on every call, so
        the loss is logged once per ``Trainer(log_every_n_steps)``, on the steps the logger writes
        (the trainer counts the step in progress, hence the + 1), and on the first step, so the
        progress bar and ``trainer.callback_metrics`` have a loss from the start."""
        try:
            trainer = self.trainer
        except RuntimeError:  # not attached: a plain PyTorch loop
            return False
        every = trainer.log_every_n_steps
        step = trainer.global_step
        return every > 0 and (step == 0 or (step + 1) % every == 0)

    def _inference_of(self, dataset: GraphDataset) -> FullGraphInference:
        if self._inference is None or self._inference.dataset is not dataset:
            self._inference = FullGraphInference(dataset, self.aggregation)
        return self._inference

    @cached_property
    def layer_widths(self) -> list[LayerWidth]:
        """Each layer's widths and multiply-adds per row (``models.work``), read once."""
        return layer_widths(self.layers)

    def training_work(self, batch: MiniBatch) -> float:
        """The work of a training step on ``batch`` (``models.work.batch_work``): what
        ``ValidationWorkBudget`` weighs training by."""
        return batch_work(batch, self.layer_widths)

    def validation_work(self) -> float:
        """The work of one validation (``models.work.inference_work``): exact inference scoring
        the DataModule's validation nodes, over sparse features at the cost of their non-zeros
        where inference multiplies them so."""
        trainer = self.trainer
        dataset = trainer.datamodule.dataset
        inference = self._inference_of(dataset)
        rows = inference.rows_per_layer(self._validation_nodes(), len(self.layers))
        nonzeros = inference.input_nonzeros(self.layers[0], trainer.strategy.root_device)
        return inference_work(dataset.graph, rows, self.layer_widths, nonzeros)

    def _validation_nodes(self) -> Tensor:
        """The nodes a validation computes outputs for: the DataModule's validation split."""
        return self.trainer.datamodule.dataset.val_idx

    def _full_graph_logits(self, batch: FullGraphBatch) -> Tensor:
        return self._inference_of(batch.dataset).run(self.layers, torch.relu_, batch.nodes, self.device)

    @override
    def setup(self, stage: str) -> None:
        """Exact inference's one-time work on the data of a DataModule with a ``dataset`` (as
        ``MQGNNDataModule``), done with the data's set-up rather than inside the first validation
        (``FullGraphInference.prepare``)."""
        dataset = getattr(self.trainer.datamodule, "dataset", None)
        if stage != "predict" and isinstance(dataset, GraphDataset):
            self._inference_of(dataset).prepare(self.layers[0], self.trainer.strategy.root_device)

    def _score(self, batch: FullGraphBatch, metric, name: str) -> None:
        logits = self._full_graph_logits(batch)
        labels = batch.dataset.labels[batch.nodes].to(self.device)
        metric.update(metric_input(logits, self.metric_name, self.multilabel), labels.long())
        self.log(name, metric, prog_bar=True, batch_size=batch.nodes.numel())

    @override
    def validation_step(self, batch: FullGraphBatch, batch_idx: int) -> None:
        self._score(batch, self.val_metric, "val/metric")

    @override
    def test_step(self, batch: FullGraphBatch, batch_idx: int) -> None:
        self._score(batch, self.test_metric, "test/metric")

    @override
    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        """Here, not in ``MQGNNDataModule``: the module's batches come from plain loaders too, and
        Lightning's default would move a ``FullGraphBatch``'s whole dataset to the device."""
        if isinstance(batch, FullGraphBatch):
            return batch  # inference moves what it needs, one layer at a time
        if isinstance(batch, MiniBatch):
            # directly: Lightning's generic walk over the dataclass fields costs time every step
            on_device = batch.input_nodes is not None and batch.input_nodes.device == device
            return batch if on_device else batch.to(device)
        return super().transfer_batch_to_device(batch, device, dataloader_idx)

    @override
    def configure_optimizers(self) -> torch.optim.Optimizer:
        """Adam, fused (one kernel over every parameter instead of a loop of small ones per tensor)
        and stepped without torch's per-call Python around the kernel (``FusedAdam``), where torch
        has the kernel for this device (``adam``)."""
        return adam(self.parameters(), lr=self.lr, weight_decay=self.weight_decay)


class NodeClassifier(NodeClassifierBase):
    """A stack of GCN or SAGE layers (paper: 2 layers, hidden 256, Adam lr 1e-3).

    Trains on ``MiniBatch``es from any sampler whose ``aggregation`` matches the layer type, with
    feature rows or with the first layer aggregated in the gather stage; with ``cuda_graphs=True``
    its steps on a GPU replay CUDA graphs (``models/cuda_graphs.py``). ``glorot_init``: whether
    the layers start Glorot-uniform (``GCNLayer``, ``SAGELayer``); None, each kind's default: GCN
    layers do, SAGE layers start as ``nn.Linear``. FastGCN's configs turn it off.
    """

    accepts_aggregated_inputs = True
    activations_overwritable = True  # GCN and SAGE layers end in addmm, linear or a weighted sum

    def __init__(
        self,
        in_dim: int,
        num_classes: int,
        conv: str = "sage",
        hidden: int = 256,
        num_layers: int = 2,
        dropout: float = 0.2,
        lr: float = 1e-3,
        weight_decay: float = 0.0,
        metric: str = "accuracy",
        multilabel: bool = False,
        cuda_graphs: bool = False,
        glorot_init: bool | None = None,
    ):
        super().__init__(
            layer_stack(conv, in_dim, hidden, num_classes, num_layers, glorot=glorot_init),
            AGGREGATION_OF_CONV[conv],
            num_classes=num_classes,
            dropout=dropout,
            lr=lr,
            weight_decay=weight_decay,
            metric=metric,
            multilabel=multilabel,
            cuda_graphs=cuda_graphs,
        )
        self.save_hyperparameters()
        self._sparse_inputs: bool | None = None  # decided on a fit's first aggregated batch

    @override
    def on_fit_start(self) -> None:
        self._sparse_inputs = None

    @override
    def forward(self, blocks: list[Block], x: Tensor, aggregated: bool = False) -> Tensor:
        """Logits of the last block's destinations; ``aggregated``: ``x`` is the first block's
        aggregation of the inputs (``MiniBatch.aggregated``), not their feature rows."""
        h = x
        for i, (layer, block) in enumerate(zip(self.layers, blocks)):
            if aggregated and i == 0:
                h = layer.transform(self._first_product_input(h))
            else:  # ReLU + dropout of the previous layer's output, run with this layer's aggregation
                h = layer(block, h, activation=self.relu_dropout if i > 0 else None)
        return h

    def _first_product_input(self, aggregated: Tensor) -> Tensor:
        """``aggregated`` as a sparse CSR matrix where the fit's first such batch was at most
        ``SPARSE_INPUT_DENSITY`` non-zero, on the CPU in float32, eagerly: the first GEMM then
        costs its non-zeros instead of its width (bag-of-words features: dblp's ``[A X, X_dst]``
        is 0.8% non-zero). Denser inputs, a GPU, autocast and compiled graphs keep the dense
        product."""
        if aggregated.device.type != "cpu" or aggregated.dtype != torch.float32:
            return aggregated
        if autocast_on("cpu") or compiling():
            return aggregated
        if self._sparse_inputs is None:
            self._sparse_inputs = (
                int(torch.count_nonzero(aggregated)) <= SPARSE_INPUT_DENSITY * aggregated.numel()
            )
        # torch's one-time beta notice for CSR tensors is filtered where sampling.batch is imported
        return aggregated.to_sparse_csr() if self._sparse_inputs else aggregated

    @override
    def batch_logits(self, batch: MiniBatch) -> Tensor:
        if batch.aggregated is not None:
            return self(batch.blocks, batch.aggregated, aggregated=True)
        return self(batch.blocks, batch.input_features())
