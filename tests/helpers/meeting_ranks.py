"""One rank of a two-rank gloo group on localhost that meets its peer at epoch meetings
(``python meeting_ranks.py RANK PORT MODE OUT``). ``same``: two fits of three epochs each, at
the same meetings; rank 0 then writes whether any meeting key is left in the store. ``apart``:
each rank waits at a meeting of its own (rank r at epoch r), as ranks that count their meetings
apart would; each writes the one line it raised and after how long."""

import json
import sys
import time
from datetime import timedelta

import torch.distributed as dist
from torch.distributed.distributed_c10d import _get_default_store

from lightning_mqgnn.strategy.epoch_meeting import PREFIX, Meeting, agree_on_fit, meet
from lightning_mqgnn.strategy.rank_failure import RankFailure, remember_peers

STOPPED_AFTER_S = 1.0


def main(rank: int, port: int, mode: str, out: str) -> None:
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2, timeout=timedelta(seconds=60)
    )
    remember_peers()
    if mode == "same":
        fits = []
        for _ in range(2):
            fit = agree_on_fit()
            for epoch in range(3):
                meet(Meeting(fit, epoch), "training", STOPPED_AFTER_S, 60.0)
            fits.append(fit)
        dist.barrier()  # every rank has left every meeting
        store = _get_default_store()
        left = [f"{fit}/{e}" for fit in fits for e in range(3) if store.check([f"{PREFIX}/{fit}/{e}"])]
        result = {"fits": fits, "keys_left": left}
    else:
        fit = agree_on_fit()
        start = time.monotonic()
        try:
            meet(Meeting(fit, rank), "training", STOPPED_AFTER_S, 60.0)
            result = {"error": None}
        except RankFailure as err:
            result = {
                "error": str(err),
                "failed_ranks": err.failed_ranks,
                "after_s": time.monotonic() - start,
            }
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])
