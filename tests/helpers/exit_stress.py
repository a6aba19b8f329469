"""Many short two-rank spawned fits in a row, with busy processes loading the CPUs: counts the fits
whose ranks did not exit cleanly (launched by tests/strategy/test_exit_stress.py).

A rank that dies at interpreter exit, after ``Trainer.fit`` returned in it, surfaces in the main
process as ``ProcessExitedException`` (its signal named) for a run that trained. Scenarios cycle
through staleness 0, staleness 1, and staleness 1 with ``sync_period=3``, each fitting the client
module of ``strategy_script`` (batch norm, validation with a synced metric, a per-step LR
schedule) with what a user's fit has: a best-validation checkpoint, gradient accumulation and
clipping. Prints one
JSON line: ``{"fits": n, "abnormal": [{"fit": i, "scenario": ..., "error": ...}, ...]}``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import tempfile
import time
import warnings

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint
from strategy_script import Client, synthetic_data
from torch.utils.data import DataLoader

from lightning_mqgnn.strategy import MQGNNStrategy

SCENARIOS = {"s0": dict(staleness=0), "s1": dict(staleness=1), "s1_sync3": dict(staleness=1, sync_period=3)}


def _spin(deadline: float) -> None:
    while time.time() < deadline:
        pass


def fit_once(scenario: str, root: str) -> None:
    data = synthetic_data(128)
    strategy = MQGNNStrategy(**SCENARIOS[scenario], start_method="spawn", process_group_backend="gloo")
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=strategy,
        max_epochs=2,
        accumulate_grad_batches=2,
        gradient_clip_val=1.0,
        default_root_dir=root,
        callbacks=[ModelCheckpoint(monitor="val_loss", save_top_k=1)],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(
        Client(),
        DataLoader(data, batch_size=16, shuffle=True),
        DataLoader(data, batch_size=32),
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fits", type=int, default=51)
    parser.add_argument("--load", type=int, default=3, help="busy processes spinning while the fits run")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    busy = [
        multiprocessing.get_context("fork").Process(target=_spin, args=(time.time() + 3600,), daemon=True)
        for _ in range(args.load)
    ]
    for process in busy:
        process.start()
    abnormal = []
    names = list(SCENARIOS)
    try:
        for i in range(args.fits):
            scenario = names[i % len(names)]
            try:
                with tempfile.TemporaryDirectory(prefix="mqgnn-exit-") as root:
                    fit_once(scenario, root)
            except Exception as error:  # the count is the point: every fit runs
                abnormal.append({"fit": i, "scenario": scenario, "error": f"{type(error).__name__}: {error}"})
    finally:
        for process in busy:
            process.kill()
            process.join()
    print(json.dumps({"fits": args.fits, "abnormal": abnormal}), flush=True)


if __name__ == "__main__":
    main()
