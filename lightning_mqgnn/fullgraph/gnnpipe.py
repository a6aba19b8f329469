"""The GNNPipe Lightning strategy: layer-pipelined model parallelism over graph chunks, and its
hybrid with graph parallelism (``LayerPipeline``)."""

from __future__ import annotations

import math
from typing import Any

import torch
from lightning.fabric.strategies import _StrategyRegistry
from lightning.pytorch import Trainer
from torch import Tensor
from torch.optim import Optimizer
from typing_extensions import override

from lightning_mqgnn.fullgraph.batch import PartitionBatch
from lightning_mqgnn.fullgraph.layer_pipeline import LayerPipeline, Staleness
from lightning_mqgnn.fullgraph.layout import PipelineLayout
from lightning_mqgnn.fullgraph.reduce import reduce_gradients
from lightning_mqgnn.fullgraph.strategy_base import FullGraphStrategyBase, TransportFactory

CHUNKS_PER_STAGE = 4


class GNNPipeStrategy(FullGraphStrategyBase):
    """Each rank computes a consecutive range of the model's graph convolutions for every chunk
    of its graph partition; chunks stream through the stages forward and backward (see
    ``layer_pipeline``; the strategy runs the forward phase in ``training_step`` and the backward
    phase in ``backward``). ``stages`` pipeline stages per way (None: every rank, pure GNNPipe);
    the world size over ``stages`` is the number of ways, i.e. graph partitions (the hybrid).

    Every rank keeps the whole model: after the backward the gradients are summed over ranks in one
    all-reduce (each rank contributes its layers' and its partition's share) and every rank applies
    the same optimizer step, so weights are never stale and any rank can be checkpointed. The
    model must be a ``FullGraphNodeClassifier`` (its ``stack`` is cut into stages) trained by a
    ``FullGraphDataModule``.

    Args:
        stages: pipeline stages per way.
        num_chunks: chunks per partition (the pipeline's micro-batches); None: 4 per stage, as
            GNNPipe runs (more chunks: smaller bubbles and less activation memory, more history rows).
        chunking: 'metis' or 'random' cut of a partition into chunks.
        shuffle: a new chunk order every epoch, the same on every rank.
        recompute: keep only each chunk's input and recompute its forward in the backward.
        complete_gradients: run each stage's backward twice, a first pass gathering the gradients
            of the rows read stale, so that every chunk's backward takes all of its epoch's
            gradients (a longer epoch; in the hybrid the halo gradients travel in both passes);
            False: the paper's one backward, whose late gradients are applied in the next epoch.
        halo_timeout_s: how long a transfer waits for a silent peer before failing.
        transport: builds a ``Transport`` from (position, size, group, global ranks); benchmarks
            pass one that models a slower link.
        seed: seeds the chunking and the chunk orders.
        **kwargs: passed to ``DDPStrategy`` (accelerator, start_method, timeout, ...).
    """

    def __init__(
        self,
        stages: int | None = None,
        num_chunks: int | None = None,
        chunking: str = "metis",
        shuffle: bool = True,
        recompute: bool = True,
        complete_gradients: bool = True,
        halo_timeout_s: float = 60.0,
        transport: TransportFactory | None = None,
        seed: int = 0,
        **kwargs: Any,
    ) -> None:
        if stages is not None and stages < 1:
            raise ValueError(f"GNNPipeStrategy: stages must be >= 1 (or None for one per rank), got {stages}")
        if num_chunks is not None and num_chunks < 1:
            raise ValueError(f"GNNPipeStrategy: num_chunks must be >= 1 (or None), got {num_chunks}")
        super().__init__(halo_timeout_s, transport, seed, **kwargs)
        self.stages = stages
        self.num_chunks = num_chunks
        self.chunking = chunking
        self.shuffle = shuffle
        self.recompute = recompute
        self.complete_gradients = complete_gradients
        self.pipeline: LayerPipeline | None = None
        self._batch: PartitionBatch | None = None
        self.staleness = Staleness()  # of every pipeline this strategy ran
        self.transfer_wait_s = 0.0  # the training thread's waits for transfers, of closed pipelines

    def layout(self) -> PipelineLayout:
        module = self.lightning_module
        stack = getattr(module, "stack", None)
        if stack is None:
            raise TypeError(
                f"GNNPipeStrategy pipelines a FullGraphNodeClassifier's layer stack, got {type(module).__name__}"
            )
        return PipelineLayout(self.world_size, self.stages or self.world_size, stack.num_convs)

    def partition_layout(self) -> tuple[int, int]:
        """(graph partitions, this rank's partition) for ``FullGraphDataModule``: one per way."""
        layout = self.layout()
        return layout.ways, layout.way_of(self.global_rank)

    @override
    def setup(self, trainer: Trainer) -> None:
        super().setup(trainer)
        self.layout()  # refuse an impossible layout before the first transfer

    def _pipeline_for(self, batch: Any) -> LayerPipeline:
        batch = self.partition_batch(batch)
        if self.pipeline is None:
            module = self.lightning_module
            self.pipeline = LayerPipeline(
                batch,
                module.stack.widths,
                self.layout(),
                self.global_rank,
                self.transport_factory,
                self._group,
                num_chunks=self.num_chunks or CHUNKS_PER_STAGE * self.layout().stages,
                chunking=self.chunking,
                seed=self.seed,
                shuffle=self.shuffle,
                recompute=self.recompute,
                staleness=self.staleness,
                complete_gradients=self.complete_gradients,
            )
        return self.pipeline

    @override
    def training_step(self, *args: Any, **kwargs: Any) -> Tensor:
        batch = args[0]
        pipeline = self._pipeline_for(batch)
        module = self.lightning_module
        self._batch = batch
        self.start_epoch_clock()
        loss = pipeline.forward_phase(module.stack, batch, module.trainer.current_epoch)
        # the last stages hold the loss, summed over their nodes / all training nodes: sum over ranks
        module.log("train/loss", loss, prog_bar=True, batch_size=1, sync_dist=True, reduce_fx="sum")
        return loss

    @override
    def backward(
        self, closure_loss: Tensor, optimizer: Optimizer | None, *args: Any, **kwargs: Any
    ) -> Tensor:
        """The pipeline's backward over every chunk instead of ``closure_loss.backward()``."""
        assert self.pipeline is not None and self._batch is not None
        module = self.lightning_module
        self.pre_backward(closure_loss)
        closure_loss = self.precision_plugin.pre_backward(closure_loss, module)  # on_before_backward hooks
        self.pipeline.backward_phase(module.stack, self._batch)
        closure_loss = self.precision_plugin.post_backward(closure_loss, module)
        self.post_backward(closure_loss)
        return closure_loss

    @override
    def reduce_after_backward(self, optimizer: Optimizer, loss: Any) -> None:
        """Sum the gradients over ranks: each holds its layers' share of its partition's."""
        pipeline = self.pipeline
        assert pipeline is not None
        extra = torch.tensor(
            [
                float(loss.detach()) if loss is not None else math.nan,
                float(pipeline.bytes_sent - self._bytes_mark),
            ],
            dtype=torch.float64,
        )
        self._bytes_mark = pipeline.bytes_sent
        summed = reduce_gradients(optimizer, extra, self.world_size, divide_by=1)
        self.record_epoch(float(summed[0]), int(summed[1]))

    def evaluate(self, batch: Any, splits: tuple[str, ...]) -> None:
        """Score ``splits`` ('val', 'test') of the partition with one exact pipelined forward."""
        module = self.lightning_module
        logits = self._pipeline_for(batch).exact_forward(module.stack, batch)
        for split in splits:
            name, metric = f"{split}/metric", getattr(module, f"{split}_metric")
            if logits is None:  # not a last stage: add nothing, but take part in the metric's sync
                module.log(name, metric, prog_bar=True, batch_size=1)
            else:
                mask = getattr(batch, f"{split}_mask")
                module.score(logits[mask], batch.labels[mask], metric, name)

    @override
    def validation_step(self, *args: Any, **kwargs: Any) -> None:
        self.evaluate(args[0], ("val",))

    @override
    def test_step(self, *args: Any, **kwargs: Any) -> None:
        self.evaluate(args[0], ("test",))

    def result_fields(self) -> str:
        """For the recipe's RESULT line: mean activation and halo bytes per training epoch (all
        ranks), the share of historical rows read that were from an earlier epoch (and of the halo
        rows among them, in the hybrid), and rank 0's wait for transfers."""
        mean_bytes = self.mean_epoch_bytes()
        if mean_bytes is None:
            return ""
        stale = self.staleness
        wait = self.transfer_wait_s + (self.pipeline.wait_s if self.pipeline is not None else 0.0)
        halo = f" stale_halo_reads={stale.halo_stale_fraction:.3f}" if stale.halo_reads else ""
        return (
            f" comm_bytes={mean_bytes:.0f} stale_reads={stale.stale_fraction:.3f}{halo}"
            f" max_staleness={stale.max_age} transfer_wait_s={wait:.2f}"
        )

    @override
    def teardown(self) -> None:
        if self.pipeline is not None:
            self.pipeline.close()
            self.transfer_wait_s += self.pipeline.wait_s
            self._bytes_mark = 0
            self.pipeline = None
        super().teardown()

    @override
    def __getstate__(self) -> dict:
        state = super().__getstate__()
        state["pipeline"] = None
        state["_batch"] = None
        return state

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
        if "gnnpipe" not in strategy_registry:
            strategy_registry.register(
                "gnnpipe",
                cls,
                description="GNNPipe: layer-pipelined full-graph training over graph chunks",
                start_method="popen",
            )


__all__ = ["GNNPipeStrategy"]
