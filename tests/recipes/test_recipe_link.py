"""The recipe's link task: ``task=link`` splits a graph's edges, trains edge batches through the
model's encoder and a pair decoder, and reports Hits@K, AUC and MRR on one RESULT line, on one
process or two ranks of the gradient queue, and resumes a stopped run exactly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from helpers.paths import REPO
from helpers.processes import start_job
from helpers.recipe import TRAIN, assert_one_error_line, assert_quiet, result_fields, run_recipe

SHORT = ("trainer.max_epochs=2", "data.num_nodes=2000")


def test_the_default_link_run_reports_hits_auc_and_mrr_on_its_planted_graph(tmp_path):
    proc = run_recipe(tmp_path, "task=link", *SHORT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_quiet(proc)
    fields = result_fields(proc.stdout)
    assert fields["task"] == "link" and fields["metric"] == "hits@50"
    assert fields["data"] == "generated-link-n2000"
    assert float(fields["val"]) > 0.2 and float(fields["test_auc"]) > 0.7 and float(fields["test_mrr"]) > 0.1
    split = [line for line in proc.stdout.splitlines() if "link split:" in line]
    assert len(split) == 1 and "100 own negatives each" in split[0] and "exclude reverse" in split[0], split


@pytest.mark.parametrize("model", ["gcn", "ladies_fd"])
def test_a_named_graph_trains_links_with_other_encoders_and_samplers(tmp_path, served_data, model):
    proc = run_recipe(tmp_path, "task=link", "data=cora", f"model={model}", "trainer.max_epochs=2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    fields = result_fields(proc.stdout)
    assert fields["data"] == "cora" and fields["model"] == model
    assert float(fields["test_auc"]) > 0.6


def test_two_ranks_of_the_gradient_queue_train_links(tmp_path):
    proc = run_recipe(
        tmp_path,
        "task=link",
        *SHORT,
        "strategy=mqgnn",
        "trainer.accelerator=cpu",
        "trainer.devices=2",
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    fields = result_fields(proc.stdout)
    assert fields["staleness"] == "1" and float(fields["test_auc"]) > 0.7


def test_a_full_graph_strategy_is_refused_for_links_in_one_line(tmp_path):
    proc = run_recipe(
        tmp_path, "task=link", "strategy=graph_parallel", "trainer.accelerator=cpu", "trainer.devices=2"
    )
    assert_one_error_line(proc, "task=link trains sampled edge batches")


RESUMED = (
    "task=link",
    "data.num_nodes=3000",
    "loader.batch_size=64",  # about 200 batches an epoch: the signal lands inside one
    "trainer.max_steps=-1",
    "trainer.max_epochs=2",
    "early_stopping.patience_batches=1000000",
    "last_checkpoint_every_s=0",
    "val_every_batches=0",
    "ckpt_path=auto",
    "trainer.enable_progress_bar=false",
)


def start(run_dir):
    return start_job([*TRAIN, *RESUMED, f"hydra.run.dir={run_dir}"], dict(os.environ), REPO)


@pytest.mark.slow
def test_a_stopped_link_run_resumes_as_if_never_stopped(tmp_path):
    straight = start(tmp_path / "straight")
    straight_out, _ = straight.communicate(timeout=300)
    assert straight.returncode == 0, straight_out[-3000:]
    job = tmp_path / "job"
    proc = start(job)
    last = job / "checkpoints" / "last.ckpt"
    deadline = time.monotonic() + 240
    while not last.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert last.exists(), "no epoch-end checkpoint before the signal"
    os.killpg(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, out[-3000:]
    again = start(job)
    out, _ = again.communicate(timeout=300)
    assert again.returncode == 0, out[-3000:]
    assert "ckpt_path=auto: resuming from" in out
    a = torch.load(tmp_path / "straight" / "checkpoints" / "last.ckpt", weights_only=True)
    b = torch.load(last, weights_only=True)
    assert a["global_step"] == b["global_step"] > 0
    for key in a["state_dict"]:
        assert torch.equal(a["state_dict"][key], b["state_dict"][key]), key
    fields_a, fields_b = result_fields(straight_out), result_fields(out)
    for key in ("val", "test", "test_auc", "test_mrr", "epochs", "batches"):
        assert fields_a[key] == fields_b[key], key


def test_a_link_run_in_memory_from_disk_and_on_the_device_loader_gives_one_result(tmp_path):
    """Edge batches through the sequential loader, from a dataset converted to disk, and through
    the device-resident loader (on the CPU): the same batches, the same RESULT."""
    small = ("data.num_nodes=1000", "trainer.max_epochs=1")
    converted = subprocess.run(
        [
            sys.executable,
            str(REPO / "recipes" / "convert.py"),
            "data=generated_links",
            small[0],
            f"out={tmp_path / 'disk'}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert converted.returncode == 0, converted.stderr[-3000:]
    runs = {
        "memory": ("task=link", *small),
        "disk": ("task=link", "data=ondisk", f"data.path={tmp_path / 'disk'}", small[1]),
        "device": ("task=link", "loader=device", *small),
    }
    results = {}
    for name, overrides in runs.items():
        proc = run_recipe(tmp_path / name, *overrides)
        assert proc.returncode == 0, (name, proc.stderr[-3000:])
        results[name] = {
            k: v for k, v in result_fields(proc.stdout).items() if k in ("val", "test", "test_mrr", "batches")
        }
    assert results["memory"] == results["disk"] == results["device"], results
