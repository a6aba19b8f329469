"""What every sampler shares: the ``Sampler`` protocol and the local-id relabelling."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from lightning_mqgnn.sampling.batch import Block, MiniBatch


def row_positions(starts: Tensor, counts: Tensor) -> Tensor:
    """``cat([arange(s, s + c) for s, c in zip(starts, counts)])``: the CSR positions of whole
    rows (empty rows allowed). On the CPU one cumulative sum: steps are 1 except where a row
    begins, where the step jumps from the previous row's last position to the row's start. On a
    GPU ``row_positions_by_repeat``, which waits for the device once (the total) instead of twice."""
    if starts.is_cuda:
        return row_positions_by_repeat(starts, counts)
    if not bool((counts > 0).all()):
        keep = counts > 0
        starts, counts = starts[keep], counts[keep]
    total = int(counts.sum())
    if total == 0:
        return torch.zeros(0, dtype=torch.int64, device=starts.device)
    step = torch.ones(total, dtype=torch.int64, device=starts.device)
    last_before = torch.cat([starts.new_zeros(1), (starts + counts)[:-1] - 1])  # before the first: 0
    step[torch.cumsum(counts, 0) - counts] = starts - last_before
    return step.cumsum_(0)


def row_positions_by_repeat(starts: Tensor, counts: Tensor) -> Tensor:
    """``row_positions`` as ``arange(total)`` shifted by each row's ``start - output start``:
    empty rows need no filtering, so the only host read is the total."""
    total = int(counts.sum())
    shift = starts - (torch.cumsum(counts, 0) - counts)
    out = torch.arange(total, dtype=torch.int64, device=starts.device)
    return out.add_(torch.repeat_interleave(shift, counts, output_size=total))


@runtime_checkable
class Sampler(Protocol):
    """Turns seed (output) node ids into a ``MiniBatch`` of ``num_layers`` blocks.

    Samplers are picklable and draw from ``rng.sampling_generator()`` (torch's default generator
    when none is set), so every loader seeds each batch alike. They create every tensor on their
    graph's device, so a sampler moved to a GPU (``pipeline.device_loader.to_device``) samples there. ``aggregation`` names the exact operator the sampled
    blocks estimate (``"gcn"``: D^-1/2 (A+I) D^-1/2, eq. 2; ``"mean"``: neighbour mean, eq. 17),
    which validation and test inference then use without sampling.
    """

    num_layers: int
    aggregation: str

    def sample(self, seeds: Tensor) -> MiniBatch: ...


class Relabeler:
    """Maps global node ids to block-local ids with a reusable scratch array.

    Keeps the destination nodes as a prefix of the sources (for SAGE's self features) in O(batch)
    time: no sort over all ``N`` nodes, no hash map. One instance per process; not thread-safe.
    """

    def __init__(self, num_nodes: int):
        self.num_nodes = num_nodes
        self._slot: Tensor | None = None

    def __getstate__(self) -> dict:
        return {"num_nodes": self.num_nodes, "_slot": None}  # the scratch array is not shipped

    def __call__(self, prefix: Tensor, others: Tensor) -> tuple[Tensor, Tensor]:
        """Return ``(nodes, local)``: ``nodes`` = ``prefix`` then the new ids of ``others`` in
        ascending order, and ``local`` = the position of every entry of ``others`` in ``nodes``.
        ``prefix`` must hold distinct ids."""
        device = prefix.device
        if self._slot is None or self._slot.device != device:
            self._slot = torch.full((self.num_nodes,), -1, dtype=torch.int64, device=device)
        slot = self._slot  # index_select/index_fill_ below: 1-D fancy indexing is much slower
        slot.index_copy_(0, prefix, torch.arange(prefix.numel(), device=device))
        new = torch.unique(others[slot.index_select(0, others) < 0])
        slot.index_copy_(0, new, torch.arange(prefix.numel(), prefix.numel() + new.numel(), device=device))
        local = slot.index_select(0, others)
        nodes = torch.cat([prefix, new])
        slot.index_fill_(0, nodes, -1)  # leave the scratch clean for the next call
        return nodes, local


def sample_top_down(
    seeds: Tensor, fanouts: Sequence[int], sample_layer: Callable[[Tensor, int], tuple[Block, Tensor]]
) -> MiniBatch:
    """The node-wise samplers' loop: from the output layer down, ``sample_layer(dst, fanout)``
    returns a layer's block and its sources, which are the next layer's destinations; the blocks
    come out input layer first."""
    seeds = seeds.to(torch.int64)
    dst = seeds
    blocks: list[Block] = []
    for fanout in reversed(fanouts):
        block, dst = sample_layer(dst, fanout)
        blocks.append(block)
    blocks.reverse()
    return MiniBatch(input_nodes=dst, output_nodes=seeds, blocks=blocks)
