"""``seeds=`` through the recipe: one run per seed, each in a folder of its own and equal to a run
of that seed alone, then their summary; ``ckpt_path=auto`` does not run a finished seed again;
and a ``-m seed=...`` sweep ends with the same summary of its jobs."""

import csv
import json
import math
import subprocess

import pytest
from helpers.recipe import TRAIN, assert_one_error_line, run_recipe

TINY = (
    "data.scale=0.02",  # 4 training batches an epoch
    "trainer.max_steps=8",
    "val_share=null",  # a validation every val_every_batches batches
    "val_every_batches=4",
)
SAME_IN_EVERY_RUN_OF_A_SEED = ("val", "test", "epochs", "batches", "feature_rows_per_batch")


@pytest.fixture(scope="module")
def seeded(tmp_path_factory):
    """``seeds=0,1`` of a tiny configuration, and a run of ``seed=1`` alone."""
    root = tmp_path_factory.mktemp("seeds")
    both = run_recipe(root / "both", *TINY, "seeds=0,1")
    assert both.returncode == 0, both.stderr[-3000:]
    alone = run_recipe(root / "alone", *TINY, "seed=1")
    assert alone.returncode == 0, alone.stderr[-3000:]
    return root, both


def read(path):
    return json.loads(path.read_text())


def test_each_seed_runs_in_a_folder_of_its_own(seeded):
    root, both = seeded
    run = root / "both"
    for seed in (0, 1):
        folder = run / f"seed_{seed}"
        assert read(folder / "result.json")["seed"] == seed
        assert (folder / "checkpoints" / "best.ckpt").is_file()
        assert (folder / "lightning_logs").is_dir()
    assert not (run / "checkpoints").exists() and not (run / "result.json").exists()
    printed = [line for line in both.stdout.splitlines() if line.startswith(("RESULT ", "SUMMARY "))]
    assert [line.split()[0] for line in printed] == ["RESULT", "RESULT", "SUMMARY"]
    for line, seed in zip(printed, (0, 1)):  # the RESULT line as printed, the file at full precision
        fields = dict(item.split("=", 1) for item in line.split()[1:])
        assert float(fields["val"]) == round(read(run / f"seed_{seed}" / "result.json")["result"]["val"], 4)


def test_a_seeds_run_equals_the_run_of_that_seed_alone_and_the_seeds_differ(seeded):
    root, _ = seeded
    zero, one = (read(root / "both" / f"seed_{s}" / "result.json") for s in (0, 1))
    alone = read(root / "alone" / "result.json")
    assert alone["seed"] == 1 and alone["config"] == one["config"] == sorted(TINY)
    for field in SAME_IN_EVERY_RUN_OF_A_SEED:
        assert one["result"][field] == alone["result"][field], field
    assert (zero["result"]["val"], zero["result"]["test"]) != (one["result"]["val"], one["result"]["test"])


def test_the_summary_is_the_mean_and_sample_std_of_the_runs_files(seeded):
    root, both = seeded
    run = root / "both"
    results = [read(run / f"seed_{s}" / "result.json")["result"] for s in (0, 1)]
    (group,) = read(run / "summary.json")["groups"]
    assert group["n"] == 2 and group["seeds"] == [0, 1] and group["config"] == sorted(TINY)
    assert [r["folder"] for r in group["runs"]] == ["seed_0", "seed_1"]
    rows = {row["row"]: row for row in csv.DictReader((run / "summary.csv").open())}
    for field in ("val", "test", "batch_time_ms", "train_time_s"):
        a, b = (r[field] for r in results)
        assert group["mean"][field] == pytest.approx((a + b) / 2, rel=1e-12)
        assert group["std"][field] == pytest.approx(abs(a - b) / math.sqrt(2), rel=1e-12)
        assert float(rows["mean"][field]) == group["mean"][field]
        assert float(rows["std"][field]) == group["std"][field]
    assert group["shared"]["model"] == "sage" and rows["mean"]["model"] == "sage"
    summary = [line for line in both.stdout.splitlines() if line.startswith("SUMMARY ")][0]
    assert summary.startswith("SUMMARY n=2 seeds=0,1 model=sage data=generated-arxiv-x0.02 val=")
    assert f"val={group['text']['val']} test={group['text']['test']} " in summary


@pytest.mark.slow  # a third recipe run
def test_ckpt_path_auto_does_not_run_a_finished_seed_again(seeded):
    root, both = seeded
    again = run_recipe(root / "both", *TINY, "seeds=0,1", "ckpt_path=auto")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "RESULT " not in again.stdout
    for seed in (0, 1):
        assert f"ckpt_path=auto: seed {seed} ended before" in again.stderr
    summary = [line for line in both.stdout.splitlines() if line.startswith("SUMMARY ")]
    assert [line for line in again.stdout.splitlines() if line.startswith("SUMMARY ")] == summary
    other = run_recipe(root / "both", *TINY, "seeds=0,1", "ckpt_path=auto", "loader.batch_size=256")
    assert_one_error_line(
        other, "seed_0/result.json is of a run with other overrides", "loader.batch_size=256"
    )


@pytest.mark.parametrize(
    ("overrides", "fragments"),
    [
        (("seeds=3",), ("seeds=3: give a list of seeds", "seed=3 runs one seed")),
        (("seeds=0,1,0",), ("seed 0 is given twice",)),
        (("seed=1", "seeds=0,1"), ("seed=1 and seeds=0,1",)),
        (("seeds=0,1", "ckpt_path=last.ckpt"), ("one checkpoint resumes one run", "ckpt_path=auto")),
    ],
)
def test_a_bad_seeds_value_is_one_error_line(tmp_path, overrides, fragments):
    assert_one_error_line(run_recipe(tmp_path, *overrides), *fragments)


def test_a_sweep_over_seed_ends_with_the_summary_of_its_jobs(seeded, tmp_path):
    root, _ = seeded
    cmd = [
        *TRAIN,
        "-m",
        "seed=0,1",
        *TINY,
        "trainer.enable_progress_bar=false",
        f"hydra.sweep.dir={tmp_path}",
    ]
    sweep = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    assert len([line for line in sweep.stdout.splitlines() if line.startswith("RESULT ")]) == 2
    seeds_run = read(root / "both" / "summary.json")["groups"][0]
    (group,) = read(tmp_path / "summary.json")["groups"]
    assert [r["folder"] for r in group["runs"]] == ["0", "1"] and group["config"] == seeds_run["config"]
    for field in ("val", "test"):
        assert group["mean"][field] == seeds_run["mean"][field]


@pytest.mark.slow  # two rank processes each import the stack, and fit twice
@pytest.mark.distributed
def test_two_ranks_run_each_seed_together_and_rank_0_alone_writes_and_prints(tmp_path):
    ranks = ("strategy=mqgnn", "trainer.accelerator=cpu", "trainer.devices=2")
    proc = run_recipe(tmp_path, *TINY, *ranks, "seeds=0,1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = [
        line.split()[0] for line in proc.stdout.splitlines() if line.startswith(("RESULT ", "SUMMARY "))
    ]
    assert printed == ["RESULT", "RESULT", "SUMMARY"]
    (group,) = read(tmp_path / "summary.json")["groups"]
    assert group["seeds"] == [0, 1] and group["shared"]["model"] == "sage"
    for seed in (0, 1):
        assert read(tmp_path / f"seed_{seed}" / "result.json")["result"]["staleness"] == 1
