"""Point-to-point transport of one halo exchange: one message to and from every peer."""

from __future__ import annotations

import torch.distributed as dist
from torch import Tensor


class HaloExchangeError(RuntimeError):
    """A halo exchange failed: a peer rank died, or the link broke or timed out."""


class Transport:
    """Sends ``sends[p]`` to and receives ``recvs[p]`` (preallocated) from every peer ``p`` with
    ``isend``/``irecv`` on ``group``, and counts the bytes it sends. Empty messages are not sent
    (both sides know the sizes). Subclass and override ``exchange`` to model a different link.

    ``rank`` and the peers are positions ``0 .. world_size - 1`` of a layout (partitions, pipeline
    stages); ``global_ranks[p]`` is the process rank behind position ``p`` (default: ``p``).
    """

    def __init__(
        self,
        rank: int,
        world_size: int,
        group: dist.ProcessGroup | None = None,
        global_ranks: list[int] | None = None,
    ):
        self.rank = rank
        self.world_size = world_size
        self.group = group
        self.global_ranks = list(global_ranks) if global_ranks is not None else list(range(world_size))
        if len(self.global_ranks) != world_size:
            raise ValueError(f"Transport: {len(self.global_ranks)} global ranks for {world_size} peers")

    def exchange(self, sends: list[Tensor], recvs: list[Tensor], tag: int) -> None:
        works = []
        try:
            for peer in range(self.world_size):
                if peer == self.rank:
                    continue
                other = self.global_ranks[peer]
                if recvs[peer].numel():
                    works.append(dist.irecv(recvs[peer], src=other, group=self.group, tag=tag))
                if sends[peer].numel():
                    works.append(dist.isend(sends[peer], dst=other, group=self.group, tag=tag))
            for work in works:
                work.wait()
        except RuntimeError as err:
            raise HaloExchangeError(
                f"rank {self.rank}: halo exchange failed ({str(err).splitlines()[0]}); "
                "a peer rank probably died or the link timed out"
            ) from err
