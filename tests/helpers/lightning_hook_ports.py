"""Lightning's own DDP comm-hook tests (``tests_pytorch/strategies/test_ddp_strategy_comm_hooks``:
fp16 compression, PowerSGD, PowerSGD under the fp16 wrapper, post-local SGD), ported to
``MQGNNStrategy`` at staleness 1 on 2 CPU ranks: the same ``BoringModel`` fit
(``sync_batchnorm=True``, ``fast_dev_run=True``), the hook counted instead of read from DDP's
logging data (there is no wrapper at staleness 1). Run by tests/strategy/test_lightning_comm_hooks.py
as ``python lightning_hook_ports.py OUT_DIR popen|spawn``; rank 0 writes ``results.json``."""

import functools
import json
import os
import sys

import lightning.pytorch as pl
from lightning.pytorch.demos.boring_classes import BoringModel
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from lightning_mqgnn.strategy import MQGNNStrategy  # noqa: E402


def counted(hook, calls: list):
    @functools.wraps(hook)
    def counting(state, bucket):
        calls.append(bucket.index())
        return hook(state, bucket)

    return counting


def fit(strategy, out_dir: str) -> bool:
    trainer = pl.Trainer(
        max_epochs=1,
        accelerator="cpu",
        devices=2,
        strategy=strategy,
        default_root_dir=out_dir,
        sync_batchnorm=True,
        fast_dev_run=True,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(BoringModel())
    return trainer.state.finished


def main(out_dir: str, start_method: str) -> None:
    results = {}
    cases = {
        "fp16_compress_comm_hook": dict(ddp_comm_hook=default_hooks.fp16_compress_hook),
        "sgd_comm_hook": dict(
            ddp_comm_state=powerSGD_hook.PowerSGDState(process_group=None),
            ddp_comm_hook=powerSGD_hook.powerSGD_hook,
        ),
        "fp16_compress_wrap_sgd_comm_hook": dict(
            ddp_comm_state=powerSGD_hook.PowerSGDState(process_group=None),
            ddp_comm_hook=powerSGD_hook.powerSGD_hook,
            ddp_comm_wrapper=default_hooks.fp16_compress_wrapper,
        ),
    }
    if start_method == "spawn":  # Lightning's spawn test: fp16 only
        cases = {"spawn_fp16_compress_comm_hook": cases["fp16_compress_comm_hook"]}
    for name, kwargs in cases.items():
        calls: list = []
        if start_method != "spawn":  # spawned ranks unpickle the strategy: the hook as it is
            kwargs = dict(kwargs, ddp_comm_hook=counted(kwargs["ddp_comm_hook"], calls))
        strategy = MQGNNStrategy(staleness=1, start_method=start_method, **kwargs)
        finished = fit(strategy, os.path.join(out_dir, name))
        results[name] = {"finished": finished, "calls": len(calls)}
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        try:  # post-local SGD averages DDP's models: refused without a wrapper, with the reason
            MQGNNStrategy(staleness=1, model_averaging_period=4, ddp_comm_hook=default_hooks.allreduce_hook)
            results["post_local_sgd_comm_hook"] = "accepted"
        except ValueError as err:
            results["post_local_sgd_comm_hook"] = str(err)
        with open(os.path.join(out_dir, f"results_{start_method}.json"), "w") as f:
            json.dump(results, f)


if __name__ == "__main__":
    main(*sys.argv[1:3])
