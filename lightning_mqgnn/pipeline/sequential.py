"""The sequential training loader: sample → gather → hand over, one batch at a time, no overlap."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from lightning_mqgnn.pipeline.plan import EpochPlan, Planned
from lightning_mqgnn.pipeline.source import BatchSource
from lightning_mqgnn.sampling.batch import MiniBatch
from lightning_mqgnn.sampling.feature_cache import merge_cached_rows, resident_rows


class SequentialLoader(Planned):
    """The batches of ``source``, made in the training process (the baseline every pipeline figure
    is compared against). ``plan``: as ``PipelinedLoader``'s. Stage times go to ``batch.meta``;
    ``wait_s`` is the whole sample + gather time, since the training loop waits for all of it.
    """

    def __init__(self, source: BatchSource, plan: EpochPlan | Callable[[], EpochPlan] | None = None):
        super().__init__(plan)
        self.source = source

    def __len__(self) -> int:
        return self.source.num_batches(self.plan().world_size)

    def __iter__(self) -> Iterator[MiniBatch]:
        source = self.source
        plan = self.plan()
        epoch = plan.epoch
        cache = source.feature_cache
        resident = None
        if cache is not None:
            cache.refresh_(epoch)
            resident = resident_rows(cache, source.dataset.features)
        batches = source.epoch_seeds(epoch, plan.rank, plan.world_size)
        for i in range(self.first_batch(plan, len(batches)), len(batches)):
            t0 = time.perf_counter()
            batch = source.produce_here(epoch, i, batches[i])
            if resident is not None:
                merge_cached_rows(batch, resident)
            batch.meta.update(wait_s=time.perf_counter() - t0, epoch=epoch)
            self.handed_out(i)
            yield batch
