"""MQGNNStrategy with 2 CPU (gloo) processes through Lightning, launched as real subprocesses.

One launch of ``_strategy_script.py`` runs every popen scenario in the same two processes (Lightning
reuses them across ``Trainer.fit`` calls); spawn and torchrun multi-node are launched separately.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from helpers.paths import HELPERS, REPO
from helpers.processes import free_port, launcher_env, rank_process, run_concurrently, two_node_torchrun
from helpers.strategy_script import RESUME_COMBOS, RESUME_EPOCHS, SCENARIOS, resume_name

pytestmark = pytest.mark.distributed


SCRIPT = HELPERS / "strategy_script.py"


def _run_all(commands: list[list[str]], timeout: float) -> list[subprocess.CompletedProcess]:
    return run_concurrently(commands, REPO, timeout)


def _load(root: Path, scenario: str) -> list[dict]:
    files = sorted((root / scenario).glob("rank*.pt"))
    return [torch.load(f, weights_only=False) for f in files]


# Resume cases of the default run, (staleness, sync_period, accumulate, per-step LR schedule), start epoch;
# the slow test covers every combination from every epoch.
DEFAULT_RESUMES = [((0, 1, 2, True), 1), ((1, 3, 1, True), 1), ((2, 3, 2, True), 0)]
SLOW_RESUMES = [
    (combo, start)
    for combo in RESUME_COMBOS
    for start in range(RESUME_EPOCHS - 1)
    if (combo, start) not in DEFAULT_RESUMES
]
BASE_SCENARIOS = [name for name in SCENARIOS if not name.startswith(("resume_s", "unused_err", "stopped_"))]


def _resume_scenarios(cases) -> list[str]:
    names = []
    for combo, start in cases:
        names += [n for n in (resume_name(combo, None), resume_name(combo, start)) if n not in names]
    return names


@pytest.fixture(scope="module")
def popen_runs(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("mqgnn_popen")
    # the failing scenarios last: each ends its Trainer.fit with an error on both ranks
    scenarios = BASE_SCENARIOS + _resume_scenarios(DEFAULT_RESUMES) + ["unused_err_s0", "unused_err_s1"]
    _run_all(
        [[sys.executable, str(SCRIPT), "--out", str(out), "--scenarios", ",".join(scenarios)]], timeout=600
    )
    return out


@pytest.fixture(scope="module")
def slow_resume_runs(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("mqgnn_resume")
    scenarios = _resume_scenarios(SLOW_RESUMES)
    _run_all(
        [[sys.executable, str(SCRIPT), "--out", str(out), "--scenarios", ",".join(scenarios)]], timeout=1800
    )
    return out


def test_staleness_zero_equals_ddp(popen_runs):
    """Same seeds, SGD with momentum, 16 steps: identical parameters. Tolerance 1e-6 absolute; observed 0.0
    (with 2 ranks, DDP's x/2 + y/2 and our (x/2 + y/2) are the same float operations)."""
    ddp, mq = _load(popen_runs, "ddp_sgd"), _load(popen_runs, "s0_sgd")
    assert ddp[0]["strategy"] == "DDPStrategy" and mq[0]["strategy"] == "MQGNNStrategy"
    assert len(ddp) == len(mq) == 2 and mq[0]["global_step"] == ddp[0]["global_step"] == 16
    assert mq[0]["stats"]["applied_steps"] == 16 and mq[0]["stats"]["skipped_steps"] == 0
    for rank in range(2):
        assert torch.allclose(mq[rank]["params"], ddp[rank]["params"], rtol=0, atol=1e-6)
        assert mq[rank]["losses"] == pytest.approx(ddp[rank]["losses"], abs=1e-6)


def test_staleness_zero_equals_ddp_with_batch_norm_buffers(popen_runs):
    """Like DDP, staleness 0 broadcasts rank 0's buffers before every forward: same parameters and buffers."""
    ddp, mq = _load(popen_runs, "ddp_bn"), _load(popen_runs, "s0_bn")
    for rank in range(2):
        assert torch.allclose(mq[rank]["params"], ddp[rank]["params"], rtol=0, atol=1e-6)


def test_a_rank_late_at_an_epochs_start_is_waited_for_beyond_the_step_timeout(popen_runs):
    """Rank 1 takes 3 s over each epoch's first batch, twice the 1.5 s step timeout: the ranks meet
    at an epoch's start under the group's own timeout, so the fit ends normally, as fast as it
    trains (the hung-rank recipe test shows the step timeout ending a run)."""
    runs = _load(popen_runs, "late_epoch_start_s1")
    assert len(runs) == 2 and all(run["error"] is None for run in runs)
    assert runs[0]["global_step"] == runs[1]["global_step"] == 8  # 2 epochs of 4 batches a rank
    assert torch.equal(runs[0]["params"], runs[1]["params"])


def test_a_rank_stopped_at_an_epochs_start_ends_the_other_after_the_step_timeout(tmp_path):
    """Rank 1 stops (SIGSTOP) while drawing the second epoch's first batch: rank 0, waiting for it
    at the epoch's meeting, gives up after the 2 s step timeout rather than the group's 30 minutes,
    with one line naming rank 1."""
    log = tmp_path / "stderr.log"
    with log.open("w") as stderr:  # a file: the stopped rank would hold a pipe open
        proc = subprocess.Popen(
            [sys.executable, str(SCRIPT), "--out", str(tmp_path), "--scenarios", "stopped_epoch_start_s1"],
            cwd=REPO,
            env=launcher_env(MASTER_PORT=str(free_port())),
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 120
        stopped = False
        while not stopped and time.monotonic() < deadline and proc.poll() is None:
            pid = rank_process(proc.pid, 1)
            stopped = pid is not None and psutil.Process(pid).status() == psutil.STATUS_STOPPED
            time.sleep(0.05)
        assert stopped, log.read_text()[-3000:]
        stopped_at = time.monotonic()
        proc.wait(timeout=60)
        took = time.monotonic() - stopped_at
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the stopped rank, and rank 0 if it is still there
    runs = _load(tmp_path, "stopped_epoch_start_s1")
    assert len(runs) == 1, log.read_text()[-3000:]  # rank 0's; rank 1 never got there
    error = runs[0]["error"]
    assert error.startswith(
        "rank 0 of 2: training failed: rank 1 died or stopped answering (rank 1 stopped"
    ), error
    assert runs[0]["global_step"] == 4  # the first epoch's 4 steps a rank, none of the second's
    assert 2.0 <= took < 2.0 + 10, took


def test_plain_module_with_string_mqgnn_converges(popen_runs):
    """``strategy="mqgnn"`` (staleness 1) on a non-GNN MLP regression: the loss falls and ranks agree."""
    runs = _load(popen_runs, "s1_string")
    assert len(runs) == 2 and runs[0]["world_size"] == 2 and runs[0]["strategy"] == "MQGNNStrategy"
    stats = runs[0]["stats"]
    assert stats["steps"] == 40 and stats["skipped_steps"] == 1 and stats["applied_steps"] == 39
    assert runs[0]["logged"]["comm/steps"] == 40 and runs[0]["logged"]["comm/syncs"] == 0  # CommStatsMonitor
    assert _load(popen_runs, "ddp_sgd")[0]["logged"] == {}
    for run in runs:
        assert run["final_loss"] < 0.3 * run["init_loss"]
    assert torch.equal(runs[0]["params"], runs[1]["params"])


def test_parameters_identical_across_ranks_after_each_sync(popen_runs):
    """With batch norm the running statistics are rank-local and drift between syncs; every sync (every 3
    steps) must leave parameters, buffers and all ranks bit-identical."""
    run = _load(popen_runs, "sync_bn")[0]
    assert run["sync_period"] == 3 and run["stats"]["syncs"] == 4
    after_sync = [diff for step, _, diff in run["records"] if step % 3 == 0]
    between = [diff for step, _, diff in run["records"] if step % 3 != 0]
    assert len(after_sync) == 4 and all(d == 0.0 for d in after_sync)
    assert max(between) > 0.0  # the check can see a difference: buffers do diverge between syncs


def test_gradient_accumulation_with_staleness(popen_runs):
    runs = _load(popen_runs, "accumulate")
    assert runs[0]["global_step"] == 6 and runs[0]["stats"]["steps"] == 6  # 12 batches / 2 accumulated
    assert all(diff == 0.0 for _, _, diff in runs[0]["records"])
    assert runs[0]["final_loss"] < runs[0]["init_loss"]


def test_resume_from_mid_run_checkpoint_matches_uninterrupted(popen_runs):
    """Checkpoint after epoch 2 (step 8, one queued gradient, next sync at step 9), resume to step 16."""
    full, resumed = _load(popen_runs, "resume_full"), _load(popen_runs, "resume_half")
    assert resumed[0]["records"][0][0] == 9  # really resumed mid-run
    assert resumed[0]["stats"]["steps"] == full[0]["stats"]["steps"] == 16
    assert resumed[0]["stats"]["syncs"] == full[0]["stats"]["syncs"] == 5
    for rank in range(2):
        assert torch.equal(resumed[rank]["params"], full[rank]["params"])
        assert resumed[rank]["losses"] == full[rank]["losses"][8:]


def _check_resume(root: Path, combo: tuple, start: int) -> None:
    _check_resumed(root, resume_name(combo, None), resume_name(combo, start), start, combo[0])


def _check_resumed(root: Path, full_name: str, resumed_name: str, start: int, staleness: int) -> None:
    """Parameters, buffers (every rank's), the per-batch cross-rank differences, the losses and the
    strategy's counters of the resumed run are bit-identical to the uninterrupted run's."""
    full, resumed = _load(root, full_name), _load(root, resumed_name)
    assert len(full) == len(resumed) == 2
    assert resumed[0]["global_step"] == full[0]["global_step"]
    if staleness > 0:  # counters are strategy state from staleness 1 on
        timings = {k: resumed[0]["stats"][k] for k in ("grad_wait_s", "sync_s")}
        assert resumed[0]["stats"] == {**full[0]["stats"], **timings}
    for rank in range(2):
        batches_before = len(full[rank]["losses"]) * (start + 1) // RESUME_EPOCHS
        assert 0 < len(resumed[rank]["losses"]) == len(full[rank]["losses"]) - batches_before  # mid-run
        assert resumed[rank]["losses"] == full[rank]["losses"][batches_before:]
        assert resumed[rank]["records"] == full[rank]["records"][batches_before:]
        assert torch.equal(resumed[rank]["params"], full[rank]["params"])
        assert torch.equal(resumed[rank]["buffers"], full[rank]["buffers"])


@pytest.mark.parametrize(("combo", "start"), DEFAULT_RESUMES, ids=lambda v: str(v))
def test_resume_is_bit_identical(popen_runs, combo, start):
    _check_resume(popen_runs, combo, start)


def test_predicted_weights_agree_across_ranks_and_resume_bit_identical(popen_runs):
    """``predict_weights=True`` (staleness 1, sync every 3 steps, an LR schedule): every rank computes
    its gradients at the same predicted weights, so the ranks stay identical (parameters always,
    batch-norm buffers after each sync), the trajectory is not the plain queue's, and resuming from
    epoch 1 (the last update is strategy state) is exact."""
    predicted, plain = _load(popen_runs, "predicted_s1_full"), _load(popen_runs, "resume_s1_p3_a1_lr_full")
    after_sync = [diff for step, _, diff in predicted[0]["records"] if step % 3 == 0]
    assert len(after_sync) >= 4 and all(diff == 0.0 for diff in after_sync)
    assert torch.equal(predicted[0]["params"], predicted[1]["params"])
    assert not torch.equal(predicted[0]["params"], plain[0]["params"])
    assert predicted[0]["final_loss"] < predicted[0]["init_loss"]
    _check_resumed(popen_runs, "predicted_s1_full", "predicted_s1_from1", 1, 1)


@pytest.mark.slow  # every (staleness, sync_period, accumulation, LR schedule) from every epoch: ~80 fits
@pytest.mark.parametrize(("combo", "start"), SLOW_RESUMES, ids=lambda v: str(v))
def test_resume_is_bit_identical_every_combination(slow_resume_runs, combo, start):
    _check_resume(slow_resume_runs, combo, start)


# ------------------------------------------------------------------ Lightning's DDP contracts
def test_model_is_wrapped_in_ddp_at_staleness_zero(popen_runs):
    """configure_ddp / wrapper contract: ``trainer.model`` is DistributedDataParallel with ``.module`` the
    LightningModule at staleness 0, as under DDPStrategy; at staleness 1 the queue replaces the wrapper."""
    for name in ("client_ddp", "client_s0"):
        for run in _load(popen_runs, name):
            assert run["contract"]["wrapper"] == "DistributedDataParallel"
            assert run["contract"]["module_is_lightning_module"] is True
    for run in _load(popen_runs, "client_s1"):
        assert (
            run["contract"]["wrapper"] == "Client" and run["contract"]["module_is_lightning_module"] is False
        )


def test_no_sync_and_user_comm_hook_at_staleness_zero(popen_runs):
    """``block_backward_sync`` enters DDP's ``no_sync``; a comm hook the user registers on ``trainer.model``
    runs once per optimiser step (accumulation skips the all-reduce of the other micro-batches)."""
    ddp, s0 = _load(popen_runs, "client_ddp"), _load(popen_runs, "client_s0")
    for run in ddp + s0:
        assert run["contract"]["grad_sync_inside_block"] is False
        assert run["contract"]["grad_sync_outside_block"] is True
        assert run["contract"]["hook_calls"] == run["global_step"] == 6


def test_batch_norm_validation_checkpoint_metric_equals_ddp_at_staleness_zero(popen_runs):
    """Batch norm, validation logging ``val_loss`` with sync_dist, ModelCheckpoint(monitor="val_loss"),
    accumulation 2, clipping, per-step LR schedule: every observable equals DDPStrategy's bit for bit."""
    ddp, s0 = _load(popen_runs, "client_ddp"), _load(popen_runs, "client_s0")
    for rank in range(2):
        a, b = ddp[rank], s0[rank]
        assert a["contract"]["val_loss"] == b["contract"]["val_loss"] and len(a["contract"]["val_loss"]) == 4
        for key in ("best_score", "best_path", "validate", "test"):
            assert a["after_fit"][key] == b["after_fit"][key], key
        assert torch.equal(a["after_fit"]["predict"], b["after_fit"]["predict"])
        assert torch.equal(a["params"], b["params"]) and torch.equal(a["buffers"], b["buffers"])


@pytest.mark.parametrize("name", ["client_ddp", "client_s0", "client_s1"])
def test_buffers_identical_across_ranks_wherever_evaluation_runs(popen_runs, name):
    """Validation in fit (3 epochs), validate, test, predict, and after fit: max |rank_i - rank_0| of the
    buffers the evaluation used is 0 (staleness 1: broadcast before each evaluation loop)."""
    for run in _load(popen_runs, name):
        stages = [stage for stage, _ in run["contract"]["eval_buffer_diffs"]]
        assert stages == ["fit", "fit", "fit", "validate", "test", "predict"]
        assert all(diff == 0.0 for _, diff in run["contract"]["eval_buffer_diffs"])
        assert run["after_fit"]["buffer_diff"] == 0.0
    runs = _load(popen_runs, name)
    assert runs[0]["contract"]["val_loss"] == runs[1]["contract"]["val_loss"]
    assert runs[0]["after_fit"]["best_path"] == runs[1]["after_fit"]["best_path"]
    assert (
        torch.equal(runs[0]["after_fit"]["predict"], runs[1]["after_fit"]["predict"]) is False
    )  # own shards


def test_rank_local_buffers_in_evaluation_when_broadcast_is_off(popen_runs):
    """``broadcast_buffers=False`` at staleness 1: validation during fit sees each rank's own statistics
    (they differ between syncs), which is what the default broadcast prevents."""
    for run in _load(popen_runs, "client_s1_local"):
        in_fit = [diff for stage, diff in run["contract"]["eval_buffer_diffs"] if stage == "fit"]
        assert len(in_fit) == 3 and max(in_fit) > 0.0


def test_manual_optimisation(popen_runs):
    """Two optimisers, manual_backward: staleness 0 equals DDPStrategy; staleness 1 (each optimiser.step goes
    through its gradient queue) equals automatic optimisation at staleness 1 with one equivalent SGD."""
    ddp, s0 = _load(popen_runs, "manual_ddp"), _load(popen_runs, "manual_s0")
    s1, auto = _load(popen_runs, "manual_s1"), _load(popen_runs, "auto_sgd_s1")
    assert s1[0]["stats"]["skipped_steps"] == 2  # one queue-fill step per optimiser
    for rank in range(2):
        assert (
            torch.equal(ddp[rank]["params"], s0[rank]["params"]) and ddp[rank]["losses"] == s0[rank]["losses"]
        )
        assert torch.equal(s1[rank]["params"], auto[rank]["params"])
        assert s1[rank]["final_loss"] < s1[rank]["init_loss"]


def test_static_graph_with_manual_optimisation_equals_ddp(popen_runs):
    """``static_graph=True`` passes through to the wrapper at staleness 0 (including DDPStrategy's
    first-iteration flush for manual optimisation): same parameters as DDPStrategy(static_graph=True)."""
    ddp, s0 = _load(popen_runs, "manual_ddp_static"), _load(popen_runs, "manual_s0_static")
    plain = _load(popen_runs, "manual_ddp")
    for rank in range(2):
        assert (
            torch.equal(ddp[rank]["params"], s0[rank]["params"]) and ddp[rank]["losses"] == s0[rank]["losses"]
        )
        assert torch.allclose(s0[rank]["params"], plain[rank]["params"], rtol=0, atol=1e-6)


def test_unused_parameters(popen_runs):
    """Without find_unused_parameters a never-used parameter is an error naming the remedy (staleness 0:
    DDP's own, staleness 1: naming the parameters); with it, training runs and its gradient stays None."""
    for run in _load(popen_runs, "unused_err_s0"):
        assert (
            "find_unused_parameters=True" in run["error"]
            and "were not used in producing the loss" in run["error"]
        )
    for run in _load(popen_runs, "unused_err_s1"):  # DDP's words, as Lightning rewrites them, and the names
        assert "were not used in producing the loss" in run["error"]
        assert "unused.weight (0/2 ranks), unused.bias (0/2 ranks)" in run["error"]
        assert "find_unused_parameters=True" in run["error"]
    # both raise in the second step: the first whose gradients DDP's reducer (or the queue) awaits
    for name in ("unused_err_s0", "unused_err_s1"):
        assert [run["global_step"] for run in _load(popen_runs, name)] == [1, 1], name
    for name in ("unused_ok_s0", "unused_ok_s1"):
        for run in _load(popen_runs, name):
            assert run["error"] is None and run["after_fit"]["unused_grad_is_none"] is True
            assert run["final_loss"] < run["init_loss"]


@pytest.mark.slow  # three interpreters import lightning: ~20 s idle, ~100 s on a loaded 2-core box
def test_spawn_registry_name(tmp_path):
    """``strategy="mqgnn_spawn"``: the trained weights come back to the main process."""
    _run_all(
        [
            [
                sys.executable,
                str(SCRIPT),
                "--out",
                str(tmp_path),
                "--scenarios",
                "s1_string",
                "--strategy",
                "mqgnn_spawn",
            ]
        ],
        timeout=300,
    )
    run = _load(tmp_path, "s1_string")[0]
    assert run["strategy"] == "MQGNNStrategy" and run["world_size"] == 2
    assert run["final_loss"] < 0.3 * run["init_loss"]


def test_torchrun_two_nodes(tmp_path):
    """``torchrun --nnodes=2 --nproc_per_node=1`` on localhost: two rendezvous "nodes", num_nodes=2."""
    commands = two_node_torchrun(
        SCRIPT, "--devices", "1", "--num-nodes", "2", "--scenarios", "resume_full", "--out", str(tmp_path)
    )
    _run_all(commands, timeout=300)
    runs = _load(tmp_path, "resume_full")
    assert len(runs) == 2 and all(r["world_size"] == 2 for r in runs)
    assert runs[0]["global_step"] == 16 and runs[0]["stats"]["syncs"] == 5
    assert torch.equal(runs[0]["params"], runs[1]["params"])


def _bytes_per_step(run: dict) -> float:
    return run["stats"]["grad_bytes"] / run["stats"]["grad_reductions"]


def test_comm_hooks_reduce_the_gradient_queue(popen_runs):
    """DDP's comm hooks on the gradient queue's buckets at staleness 1: torch's all-reduce hook gives
    the queue's own floats; fp16, PowerSGD (alone and under the fp16 wrapper) and the 4-bit
    quantisation hook give every rank the same averaged gradient, train, send fewer bytes and stay
    near the uncompressed run."""
    base = _load(popen_runs, "auto_sgd_s1")
    full = _bytes_per_step(base[0])
    assert full == base[0]["params"].numel() * 4  # every gradient in float32, once a step
    allreduce = _load(popen_runs, "hook_allreduce_s1")
    for rank in range(2):
        assert torch.equal(allreduce[rank]["params"], base[rank]["params"])
    assert _bytes_per_step(allreduce[0]) == full
    for name, most in [
        ("hook_fp16_s1", 0.5),
        ("hook_powersgd_s1", 0.6),
        ("hook_fp16_powersgd_s1", None),  # a wrapped hook: its traffic is not known
        ("hook_quant4_s1", 1 / 7),
        ("hook_quant4_ef_s1", 1 / 7),
    ]:
        runs = _load(popen_runs, name)
        assert torch.equal(runs[0]["params"], runs[1]["params"]), name  # the same average on each rank
        assert not torch.equal(runs[0]["params"], base[0]["params"]), name  # the hook did reduce
        assert float((runs[0]["params"] - base[0]["params"]).abs().max()) < 0.05, name
        assert runs[0]["final_loss"] < runs[0]["init_loss"], name
        sent = _bytes_per_step(runs[0])
        assert math.isnan(sent) if most is None else sent <= most * full, (name, sent, full)


def test_a_user_comm_hook_runs_at_every_staleness(popen_runs):
    """A hook of the user's own is called on every bucket: at staleness 1 by the queue (tiny buckets:
    several a step), at staleness 0 by DDP's reducer on the CPU too (Lightning registers hooks on
    CUDA only). The quantisation hook also works under DDP."""
    queue = _load(popen_runs, "hook_count_s1")[0]
    steps = int(queue["stats"]["steps"])
    assert queue["hook_calls"] % steps == 0 and queue["hook_calls"] // steps >= 2
    assert torch.equal(queue["params"], _load(popen_runs, "auto_sgd_s1")[0]["params"])
    ddp = _load(popen_runs, "hook_count_s0")[0]
    assert ddp["hook_calls"] >= int(ddp["stats"]["steps"]) > 0
    quantised, plain = _load(popen_runs, "hook_quant4_s0"), _load(popen_runs, "s0_sgd")
    assert torch.equal(quantised[0]["params"], quantised[1]["params"])
    assert quantised[0]["final_loss"] < quantised[0]["init_loss"]
    assert _bytes_per_step(quantised[0]) <= _bytes_per_step(plain[0]) / 7


def test_auto_staleness_rises_behind_a_slow_link_and_stays_low_on_a_fast_one(popen_runs):
    """``staleness="auto"`` (at most 3, decided every 6 steps): all-reduces 400 ms late raise it to the
    maximum, one step at a time; on the plain gloo link it stays at the staleness that hides the
    reduction. Both ranks agree on it at every decision. The delay is long enough that three
    steps cannot hide it even on a loaded machine (steps there took over 40 ms, and 80 ms late
    reductions were hidden at staleness 2)."""
    slow, fast = _load(popen_runs, "auto_slow"), _load(popen_runs, "auto_fast")
    for rank in range(2):
        assert slow[rank]["stats"]["staleness"] == 3 and slow[rank]["stats"]["staleness_changes"] == 2
        assert fast[rank]["stats"]["staleness"] <= 2
        assert math.isfinite(slow[rank]["final_loss"])
    for run in (slow, fast):
        assert run[0]["stats"]["staleness_changes"] == run[1]["stats"]["staleness_changes"]
        assert run[0]["stats"]["skipped_steps"] == run[1]["stats"]["skipped_steps"]
