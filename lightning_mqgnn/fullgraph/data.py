"""The DataModule of full-graph training: every rank gets its partition of one graph."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from typing_extensions import override

from lightning_mqgnn.fullgraph.batch import PartitionBatch
from lightning_mqgnn.fullgraph.partition import (
    PARTITIONERS,
    PartitionBook,
    graph_fingerprint,
    import_pymetis,
    metis_partition,
    random_partition,
)
from lightning_mqgnn.graph.dataset import GraphDataset, split_mask
from lightning_mqgnn.graph.feature_dtypes import compute_dtype


def partition_batch(
    dataset: GraphDataset, book: PartitionBook, rank: int, aggregation: str
) -> PartitionBatch:
    """Rank ``rank``'s ``PartitionBatch`` of ``dataset`` under ``book``."""
    part = book.local(dataset.graph, rank, aggregation)
    n = dataset.num_nodes
    masks = [split_mask(n, idx)[part.inner] for idx in (dataset.train_idx, dataset.val_idx, dataset.test_idx)]
    return PartitionBatch(
        partition=part,
        block=part.block,
        features=dataset.features[part.local_ids()].to(compute_dtype(dataset.features.dtype)),
        labels=dataset.labels[part.inner],
        train_mask=masks[0],
        val_mask=masks[1],
        test_mask=masks[2],
        num_train_global=int(dataset.train_idx.numel()),
        world_size=book.num_parts,
    )


class PartitionLoader:
    """A loader of exactly one ``PartitionBatch`` (Lightning reads a list as several loaders)."""

    def __init__(self, batch: PartitionBatch):
        self.batch = batch

    def __len__(self) -> int:
        return 1

    def __iter__(self):
        yield self.batch


class FullGraphDataModule(pl.LightningDataModule):
    """Serves each rank its partition of ``dataset`` as the single batch of every epoch (training,
    validation and test alike; the masks pick the split).

    The partition book is loaded from ``book_path`` when that file exists (and refused when it was
    made for another graph or another number of ranks), else built by rank 0 with ``partitioner``
    ('metis', or 'random' as a fallback without pymetis), broadcast to every rank and saved to
    ``book_path`` when given. ``aggregation`` ('gcn' or 'mean') sets the exact edge weights and
    must match the model's layers.
    """

    full_graph = True

    def __init__(
        self,
        dataset: GraphDataset,
        aggregation: str = "gcn",
        partitioner: str = "metis",
        book_path: str | None = None,
        seed: int = 0,
    ):
        super().__init__()
        if partitioner not in PARTITIONERS:
            raise ValueError(f"unknown partitioner {partitioner!r}; expected one of {PARTITIONERS}")
        self.dataset = dataset
        self.aggregation = aggregation
        self.partitioner = partitioner
        self.book_path = Path(book_path) if book_path else None
        self.seed = seed
        self.book: PartitionBook | None = None
        self.batch: PartitionBatch | None = None

    def rank_and_world(self) -> tuple[int, int]:
        if self.trainer is None:
            return 0, 1
        return self.trainer.global_rank, self.trainer.world_size

    def partition_layout(self) -> tuple[int, int]:
        """(number of partitions, this rank's partition): one per rank, unless the strategy
        groups ranks (GNNPipe's pipeline stages share their way's partition)."""
        if self.trainer is None:
            return 1, 0
        layout = getattr(self.trainer.strategy, "partition_layout", None)
        if callable(layout):
            return layout()
        return self.trainer.world_size, self.trainer.global_rank

    def graph_stats(self) -> tuple[int, int]:
        return self.dataset.num_nodes, self.dataset.graph.num_edges

    @override
    def setup(self, stage: str) -> None:
        if self.batch is not None:
            return
        num_parts, part = self.partition_layout()
        self.book = self.partition_book(num_parts)
        self.batch = partition_batch(self.dataset, self.book, part, self.aggregation)

    def partition_book(self, world: int) -> PartitionBook:
        """The book of ``world`` partitions: loaded, or made on rank 0 and broadcast."""
        graph = self.dataset.graph
        if world > graph.num_nodes:
            raise ValueError(f"{world} partitions, but {self.dataset.name} has only {graph.num_nodes} nodes")
        if self.book_path is not None and self.book_path.exists():
            book = PartitionBook.load(self.book_path, graph)
            if book.num_parts != world:
                raise ValueError(
                    f"{self.book_path}: partition book has {book.num_parts} parts, the run needs {world}"
                )
            return book
        if self.partitioner == "metis":
            import_pymetis()  # on every rank: a rank-0-only failure would leave the others in the broadcast
        rank = self.rank_and_world()[0]
        if rank == 0:
            partition = metis_partition if self.partitioner == "metis" else random_partition
            parts = partition(graph, world, self.seed)
        else:
            parts = torch.empty(graph.num_nodes, dtype=torch.int64)
        if self.rank_and_world()[1] > 1 and dist.is_available() and dist.is_initialized():
            dist.broadcast(parts, src=0)
        book = PartitionBook(parts, world, graph_fingerprint(graph), self.partitioner)
        book.check_nonempty()
        if rank == 0 and self.book_path is not None:
            self.book_path.parent.mkdir(parents=True, exist_ok=True)
            book.save(self.book_path)
        return book

    def _loader(self) -> PartitionLoader:
        if self.batch is None:
            raise RuntimeError("FullGraphDataModule.setup() has not run")
        return PartitionLoader(self.batch)

    @override
    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        """The partition's tensors, moved once per device (not walked field by field every epoch)."""
        if not isinstance(batch, PartitionBatch):
            return super().transfer_batch_to_device(batch, device, dataloader_idx)
        if batch.features.device == device:
            return batch
        moved = batch.to(device)
        self.batch = moved  # later epochs start on the device
        return moved

    @override
    def train_dataloader(self) -> PartitionLoader:
        return self._loader()

    @override
    def val_dataloader(self) -> PartitionLoader:
        return self._loader()

    @override
    def test_dataloader(self) -> PartitionLoader:
        return self._loader()
