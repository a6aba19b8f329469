"""Where each rank sits in a layer-pipelined run: ``ways`` graph partitions × ``stages`` layer
ranges. A way's stages are consecutive ranks, so on a multi-GPU node the pipeline's activations
move between neighbouring devices, numbered from the last stage: rank 0 computes the loss and the
scores, so what rank 0 logs and prints (progress bar, metrics) comes from a rank that has them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PipelineLayout:
    """``world_size`` ranks as ``ways`` × ``stages`` over a model of ``num_convs`` convolutions.

    ``stages == world_size`` is pure layer pipelining (GNNPipe), ``stages == 1`` pure graph
    parallelism; in between the hybrid."""

    world_size: int
    stages: int
    num_convs: int

    def __post_init__(self) -> None:
        if self.stages < 1:
            raise ValueError(f"the pipeline needs at least one stage, got stages={self.stages}")
        if self.stages > self.num_convs:
            raise ValueError(
                f"{self.stages} pipeline stages for a model of {self.num_convs} graph convolutions: "
                "every stage needs at least one layer (use fewer stages or a deeper model)"
            )
        if self.world_size % self.stages:
            raise ValueError(
                f"{self.world_size} ranks cannot form pipelines of {self.stages} stages "
                "(world size must be a multiple of stages)"
            )

    @property
    def ways(self) -> int:
        return self.world_size // self.stages

    def way_of(self, rank: int) -> int:
        return rank // self.stages

    def stage_of(self, rank: int) -> int:
        return self.stages - 1 - rank % self.stages

    def rank_of(self, way: int, stage: int) -> int:
        return way * self.stages + self.stages - 1 - stage

    def layers_of(self, stage: int) -> range:
        """The convolutions of ``stage``: consecutive, balanced (the first ``num_convs % stages``
        stages take one more)."""
        base, extra = divmod(self.num_convs, self.stages)
        start = stage * base + min(stage, extra)
        return range(start, start + base + (1 if stage < extra else 0))
