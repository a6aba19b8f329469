"""Two fits in a row from one rank-0 process whose rank 1 is a new process each time, as in a
notebook, an elastic agent, or Lightning's own test suite run in one process: Lightning's
subprocess launcher starts rank 1 for each fit, and between the fits the process group is
destroyed and the rank variables dropped, as Lightning's test fixtures do. Each fit trains two
epochs of ``BoringModel`` under ``MQGNNStrategy`` (2 CPU ranks), meeting the ranks at each
epoch's first batch. ``python fresh_peer_fits.py OUT STALENESS``; a launched rank gets the fit
to run as a third argument. Rank 0 writes ``fits.json``: per fit, whether it finished, its
epochs, its identifier and the meeting keys left in the store."""

import json
import os
import sys

import lightning.pytorch as pl
from lightning.fabric.utilities.distributed import _destroy_dist_connection
from lightning.pytorch.demos.boring_classes import BoringModel
from torch.distributed.distributed_c10d import _get_default_store

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from helpers.processes import RANK_VARIABLES  # noqa: E402
from lightning_mqgnn.strategy import MQGNNStrategy  # noqa: E402
from lightning_mqgnn.strategy.epoch_meeting import PREFIX  # noqa: E402

EPOCHS = 2


def fit(out: str, staleness: int) -> dict:
    strategy = MQGNNStrategy(staleness=staleness, step_timeout=10.0)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=strategy,
        max_epochs=EPOCHS,
        limit_train_batches=3,
        limit_val_batches=1,
        default_root_dir=out,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        logger=False,
    )
    trainer.fit(BoringModel())
    store = _get_default_store()
    keys = [f"{PREFIX}/{strategy._fit_id}/{e}" for e in range(EPOCHS)]
    return {
        "finished": trainer.state.finished,
        "epochs": trainer.current_epoch,
        "fit_id": strategy._fit_id,
        "keys_left": [k for k in keys if store.check([k]) or store.check([f"{k}/left"])],
    }


def main(out: str, staleness: int) -> None:
    if "LOCAL_RANK" in os.environ:  # a launched rank: the one fit it was started for
        fit(out, staleness)
        return
    results = []
    for index in range(2):
        sys.argv = [sys.argv[0], out, str(staleness), str(index)]  # the launcher starts rank 1 so
        results.append(fit(out, staleness))
        _destroy_dist_connection()
        for name in RANK_VARIABLES:
            os.environ.pop(name, None)
    with open(os.path.join(out, "fits.json"), "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
