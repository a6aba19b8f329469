"""The Hydra recipe end to end, and its one-line errors on bad input."""

import os
import shutil
import subprocess
import time

import numpy as np
import pytest
from helpers.recipe import TRAIN, assert_one_error_line, recipe_config, result_fields, run_recipe


def test_default_recipe_trains_on_the_generated_graph(tmp_path):
    proc = run_recipe(tmp_path, "data.scale=0.02", "trainer.max_epochs=4")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = result_fields(proc.stdout)
    assert result["model"] == "sage"
    # 40 classes: chance is 0.025; the generated graph is learnable
    assert float(result["test"]) > 0.2
    assert float(result["val"]) > 0.2
    assert int(result["batches"]) > 0
    assert float(result["feature_rows_per_batch"]) > 0 and "cache_hit_rate" not in result  # no cache


def test_run_shorter_than_the_validation_interval_scores_its_last_weights(tmp_path):
    """max_steps below val_every_batches: no checkpoint was saved, yet the run reports val and test."""
    proc = run_recipe(
        tmp_path,
        "data.scale=0.02",  # 4 training batches an epoch
        "val_every_batches=10",
        "val_share=null",
        "trainer.max_epochs=-1",
        "trainer.max_steps=5",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = result_fields(proc.stdout)
    assert int(result["batches"]) == 5
    assert 0.0 <= float(result["val"]) <= 1.0 and 0.0 <= float(result["test"]) <= 1.0


@pytest.mark.parametrize("model", ["sage", "gcn"])
def test_the_time_to_accuracy_preset_overrides_the_defaults_and_yields_to_the_command_line(model):
    from hydra.utils import instantiate

    plain = recipe_config(f"model={model}")
    cfg = recipe_config("preset=time_to_accuracy", f"model={model}", "loader.batch_size=1024")
    assert (plain.val_every_batches, plain.val_share, plain.val_budget, plain.model.module.lr) == (
        1,
        0.25,
        "work",
        0.01,
    )
    assert (cfg.val_every_batches, cfg.val_share, cfg.early_stopping) == (1, 0.25, plain.early_stopping)
    assert cfg.model.module.lr == 0.03 and {**cfg.model.module, "lr": 0.01} == plain.model.module
    assert cfg.loader.batch_size == 1024 and cfg.model.sampler.fanouts == plain.model.sampler.fanouts
    assert recipe_config("preset=time_to_accuracy", "model.module.lr=0.01").model.module.lr == 0.01
    net = instantiate(cfg.model.module)(in_dim=12, num_classes=3)
    hidden = {"sage": 128, "gcn": 256}[model]
    assert [{w.shape[0] for w in layer.parameters() if w.dim() == 2} for layer in net.layers] == [
        {hidden},
        {3},
    ]


@pytest.mark.parametrize("model", ["sage", "labor_gcn", "ladies_fd"])
def test_the_paper_preset_restores_mq_gnns_protocol_for_every_model(model):
    cfg = recipe_config("preset=paper", f"model={model}")
    assert (cfg.val_every_batches, cfg.val_share, cfg.early_stopping.min_delta) == (50, None, 0.01)
    assert cfg.early_stopping.patience_batches == recipe_config().early_stopping.patience_batches
    assert cfg.model.module.lr == 1e-3
    assert recipe_config("preset=paper", f"model={model}", "model.module.lr=0.02").model.module.lr == 0.02


def test_the_time_to_accuracy_preset_trains(tmp_path):
    proc = run_recipe(tmp_path, "preset=time_to_accuracy", "data.scale=0.02", "trainer.max_epochs=2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = result_fields(proc.stdout)
    assert float(result["val"]) > 0.2 and float(result["test"]) > 0.2


def test_a_module_key_the_module_does_not_take_is_one_error_line_before_the_dataset_loads(tmp_path):
    # keys of model=sage's network, which PyG's layer stacks set inside model.module.layers
    sage_keys = ["+model.module.hidden=128", "+model.module.glorot_init=true"]
    proc = run_recipe(tmp_path, "model=gat_pyg", *sage_keys, "data=cora", "data.download=false")
    line = assert_one_error_line(proc, "gat_pyg", "PyGNodeClassifier", "model.module.hidden")
    assert "model.module.glorot_init" in line and "nodes" not in proc.stdout  # before the dataset loads


def test_unknown_config_name_is_one_error_line(tmp_path):
    proc = run_recipe(tmp_path, "model=nonexistent_model")
    line = assert_one_error_line(proc, "model", "nonexistent_model")
    assert "sage" in line  # lists the available options


def test_an_override_of_a_key_the_config_lacks_is_one_error_line(tmp_path):
    proc = run_recipe(tmp_path, "data=cora", "data.pth=/data/cora.npz")
    assert_one_error_line(proc, "data.pth: no such config key", "+data.pth=")
    assert "not in struct" not in proc.stderr  # Hydra's own report is not printed


def write_npz(path, **overrides):
    n = 6
    arrays = dict(
        indptr=np.array([0, 1, 2, 3, 4, 5, 6]),
        indices=np.array([1, 0, 3, 2, 5, 4]),
        x_indptr=np.arange(n + 1),
        x_indices=np.zeros(n, dtype=np.int64),
        x_data=np.ones(n, dtype=np.float32),
        x_shape=np.array([n, 2]),
        y=np.array([0, 1, 0, 1, 0, 1]),
        train_idx=np.array([0, 1]),
        val_idx=np.array([2, 3]),
        test_idx=np.array([4, 5]),
        metric=np.array("accuracy"),
    )
    arrays.update(overrides)
    np.savez(path, **arrays)
    return path


@pytest.mark.parametrize(
    "override,fragments",
    [
        ({"indices": np.array([1, 0, 3, 2, 5, 9])}, ["indices", "9"]),
        ({"x_data": np.array([1, 1, np.nan, 1, 1, 1], dtype=np.float32)}, ["x_data", "nan", "node 2"]),
        ({"y": np.array([0, 1, 0, 1, 0, -3])}, ["label", "-3"]),
    ],
)
def test_malformed_npz_is_one_error_line(tmp_path, override, fragments):
    bad = write_npz(tmp_path / "bad.npz", **override)
    proc = run_recipe(tmp_path, "data=npz", f"data.path={bad}", "data.name=bad")
    line = assert_one_error_line(proc)
    low = line.lower()
    for fragment in fragments:
        assert fragment.lower() in low, line


def test_missing_ogb_files_are_one_error_line(tmp_path):
    env = {"MQGNN_DATA_ROOT": str(tmp_path / "nowhere")}
    proc = run_recipe(tmp_path, "data=arxiv", "data.download=false", env=env)
    assert_one_error_line(proc, "nowhere", "download=false", "arxiv.zip")


def test_a_named_dataset_without_mirror_or_download_is_one_line_naming_url_and_place(tmp_path):
    """A fresh machine without the files: the line says what to fetch from where and where it goes."""
    env = {"MQGNN_DATA_ROOT": str(tmp_path / "cache"), "MQGNN_DATA_MIRROR": ""}
    start = time.monotonic()
    proc = run_recipe(tmp_path, "model=gcn", "data=cora", "data.download=false", env=env)
    seconds = time.monotonic() - start
    line = assert_one_error_line(
        proc,
        "cora: not downloaded yet and downloads are off (download=false)",
        "https://github.com/kimiyoung/planetoid/raw/master/data/",
        f"into {tmp_path / 'cache' / 'raw' / 'cora'}/",
        "MQGNN_DATA_MIRROR",
    )
    assert "ind.cora.test.index" in line
    assert seconds < 30, seconds  # the target is 10 s on a quiet machine; tests share the cores


def test_own_files_are_a_config_of_their_own(tmp_path):
    """data=npz takes a file in the npz layout, data=arrays plain array files: no data=cora needed."""
    npz = write_npz(tmp_path / "mine.npz")
    proc = run_recipe(tmp_path / "npz", "data=npz", f"data.path={npz}", "trainer.max_steps=3", "test=false")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "mine: 6 nodes" in proc.stdout
    missing = run_recipe(tmp_path / "missing", "data=npz")
    assert_one_error_line(missing, "data.path")


def test_gns_model_trains_through_the_pipeline(tmp_path):
    """The sampler's GNS cache reaches the pipelined DataModule, which keeps it on the device."""
    overrides = ["model=sage_gns", "model.sampler.fraction=0.1", "loader=pipeline", "data.scale=0.02"]
    proc = run_recipe(tmp_path, *overrides, "trainer.max_epochs=4")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = result_fields(proc.stdout)
    assert result["model"] == "sage_gns"
    assert float(result["test"]) > 0.2  # 40 classes: chance is 0.025
    rates = [line for line in proc.stdout.splitlines() + proc.stderr.splitlines() if "cache hit rate" in line]
    assert len(rates) == 1, proc.stdout[-2000:]
    per_epoch = [float(r) for r in rates[0].split(":")[1].split(",")]
    assert len(per_epoch) == 4 and all(0.0 < r < 1.0 for r in per_epoch)
    # the RESULT line carries the trade: rows and bytes moved per batch, and the last hit rate
    assert float(result["cache_hit_rate"]) == pytest.approx(per_epoch[-1], abs=1e-3)
    rows, mb = float(result["feature_rows_per_batch"]), float(result["feature_mb_per_batch"])
    assert rows > 0 and mb == pytest.approx(rows * 128 * 4 / 2**20, rel=0.01)  # 128 float32 features


@pytest.mark.slow  # two rank processes each import the stack; the strategy itself is tested on forked ranks
@pytest.mark.distributed
def test_full_graph_strategy_trains_on_partitions(tmp_path):
    """strategy=pipeqs picks the fullgraph loader and model through Hydra defaults, runs 2 gloo
    ranks and reports the halo bytes per epoch."""
    proc = run_recipe(
        tmp_path,
        "strategy=pipeqs",
        "data.scale=0.01",
        "trainer.accelerator=cpu",
        "trainer.devices=2",
        "trainer.max_epochs=3",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = result_fields(proc.stdout)
    assert int(result["batches"]) == 3  # one step per epoch: the partition
    assert int(result["comm_bytes"]) > 0
    assert 0.0 <= float(result["test"]) <= 1.0


def test_full_graph_model_with_a_sampled_loader_is_one_error_line(tmp_path):
    proc = run_recipe(tmp_path, "strategy=graph_parallel", "loader=sequential", "data.scale=0.01")
    assert_one_error_line(proc, "do not fit", "strategy=graph_parallel")


@pytest.mark.slow  # two rank processes each import the stack; the strategy itself is tested on forked ranks
@pytest.mark.distributed
def test_gnnpipe_recipe_reports_bytes_staleness_and_memory(tmp_path):
    """strategy=gnnpipe with a deep GCNII on 2 ranks (2 stages): the RESULT line carries the bytes
    per epoch, the share of stale history reads and every rank's peak memory."""
    proc = run_recipe(
        tmp_path,
        "strategy=gnnpipe",
        "model=gcnii_8",
        "data.scale=0.01",
        "strategy.num_chunks=4",
        "trainer.accelerator=cpu",
        "trainer.devices=2",
        "trainer.max_epochs=3",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = result_fields(proc.stdout)
    assert int(result["batches"]) == 3
    assert int(result["comm_bytes"]) > 0
    assert 0.0 < float(result["stale_reads"]) < 1.0
    assert result["max_staleness"] == "1"
    assert len(result["peak_rss_mb"].split("/")) == 2
    assert 0.0 <= float(result["test"]) <= 1.0


@pytest.mark.slow  # four 2-rank recipe runs; the hooks and their bytes: tests/strategy
@pytest.mark.distributed
def test_compressed_gradient_queues_report_their_bytes(tmp_path):
    """strategy=mqgnn_q4 (4-bit quantised buckets) and mqgnn_powersgd on 2 ranks: the RESULT line
    gives the staleness and the gradient megabytes and wait per step; 4 bits send at most a
    seventh of the float32 queue's bytes."""
    results = {}
    for strategy in ("mqgnn", "mqgnn_q4", "mqgnn_powersgd"):
        proc = run_recipe(
            tmp_path / strategy,
            f"strategy={strategy}",
            "data.scale=0.02",
            "trainer.accelerator=cpu",
            "trainer.devices=2",
            "trainer.max_epochs=3",
            "trainer.max_steps=-1",
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        results[strategy] = result_fields(proc.stdout)
        assert results[strategy]["staleness"] == "1"
        assert float(results[strategy]["grad_wait_ms_per_step"]) >= 0.0
    plain, quantised = (float(results[s]["grad_mb_per_step"]) for s in ("mqgnn", "mqgnn_q4"))
    assert 0 < quantised <= plain / 7
    # PowerSGD's first 10 steps are a plain all-reduce (start_powerSGD_iter): 6 steps here
    assert float(results["mqgnn_powersgd"]["grad_mb_per_step"]) == pytest.approx(plain, rel=1e-3)


def test_impossible_pipeline_layout_is_one_error_line(tmp_path):
    """More stages than the model has convolutions: one error line naming both numbers."""
    proc = run_recipe(tmp_path, "strategy=gnnpipe", "model=gcnii_8", "strategy.stages=9", "data.scale=0.01")
    assert_one_error_line(proc, "9 pipeline stages", "8 graph convolutions")


RESUME = (
    "data.scale=0.02",
    "trainer.max_steps=-1",
    "early_stopping.patience_batches=1000000",
    "last_checkpoint_every_s=0",
    "val_share=null",  # validations every val_every_batches, whatever they cost
    "val_every_batches=3",  # inside the 4-batch epochs: best.ckpt is written mid-epoch
)


@pytest.fixture(scope="module")
def resumed_runs(tmp_path_factory):
    """Four epochs straight through; two epochs; the two-epoch run resumed to four, with the
    pipelined loader (its batches are the sequential loader's)."""
    root = tmp_path_factory.mktemp("resume")
    through = run_recipe(root / "through", *RESUME, "trainer.max_epochs=4")
    first_half = run_recipe(root / "half", *RESUME, "trainer.max_epochs=2")
    resumed = run_recipe(
        root / "resumed",
        *RESUME,
        "trainer.max_epochs=4",
        "loader=pipeline",
        f"ckpt_path={root / 'half' / 'checkpoints' / 'last.ckpt'}",
    )
    for proc in (through, first_half, resumed):
        assert proc.returncode == 0, proc.stderr[-3000:]
    return root, through, resumed


def test_a_resumed_run_trains_bit_for_bit_as_one_that_ran_through(resumed_runs):
    import torch

    root, through, resumed = resumed_runs
    a = torch.load(root / "through" / "checkpoints" / "last.ckpt", weights_only=True)
    # the resumed run goes on writing into the folder of the run it resumed
    b = torch.load(root / "half" / "checkpoints" / "last.ckpt", weights_only=True)
    assert a["global_step"] == b["global_step"] == 16
    assert a["state_dict"].keys() == b["state_dict"].keys()
    for key in a["state_dict"]:
        assert torch.equal(a["state_dict"][key], b["state_dict"][key]), key
    adam_a, adam_b = a["optimizer_states"][0]["state"], b["optimizer_states"][0]["state"]
    for i in adam_a:
        for key in adam_a[i]:
            assert torch.equal(adam_a[i][key], adam_b[i][key]), (i, key)
    # the whole run's figures: best validation and its checkpoint's test score, all 16 batches
    fields_a, fields_b = result_fields(through.stdout), result_fields(resumed.stdout)
    for key in ("val", "test", "epochs", "batches"):
        assert fields_a[key] == fields_b[key], key


def test_a_run_under_the_default_cap_ends_at_an_epochs_end_and_resumes(resumed_runs, tmp_path):
    """The recipe's cap is whole epochs: 6 batches at least, of 4-batch epochs, is 2 epochs. That
    run, resumed under a cap of 4 epochs, trains as the run of 4 epochs straight through."""
    root, through, _ = resumed_runs
    default_cap = tuple(o for o in RESUME if not o.startswith("trainer.max_steps"))
    half = run_recipe(tmp_path / "half", *default_cap, "step_cap.min_steps=6", "step_cap.epochs=1")
    assert half.returncode == 0, half.stderr[-3000:]
    assert result_fields(half.stdout)["batches"] == "8"
    last = tmp_path / "half" / "checkpoints" / "last.ckpt"
    resumed = run_recipe(
        tmp_path / "resumed", *default_cap, "step_cap.min_steps=0", "step_cap.epochs=4", f"ckpt_path={last}"
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    _last_checkpoints_equal(root / "through" / "checkpoints" / "last.ckpt", last)
    fields_a, fields_b = result_fields(through.stdout), result_fields(resumed.stdout)
    for key in ("val", "test", "epochs", "batches"):
        assert fields_a[key] == fields_b[key], key


@pytest.mark.parametrize(
    "case, fragments",
    [
        ("best", ["best.ckpt", "weights only", "resume from checkpoints/last.ckpt"]),
        ("mid_epoch", ["mid_epoch.ckpt", "inside an epoch", "step 15"]),
        ("missing", ["nope.ckpt", "no such file"]),
        ("not_a_checkpoint", ["config.yaml", "not a readable checkpoint"]),
        ("other_model", ["different model", "hidden=128 (this run: 64)"]),
        pytest.param(
            "other_settings",
            ["other settings", "loader.batch_size=512 (this run: 300)"],
            marks=pytest.mark.slow,
        ),
        pytest.param(
            "other_validation",
            ["other settings", "val_every_batches=3 (this run: 5)"],
            marks=pytest.mark.slow,
        ),
        pytest.param("full_graph", ["full-graph strategies do not resume"], marks=pytest.mark.slow),
        pytest.param(
            "step_bounded",
            ["only a run bounded by epochs resumes", "not trainer.max_steps=100"],
            marks=pytest.mark.slow,
        ),
    ],
)
def test_a_checkpoint_that_does_not_continue_this_run_is_one_error_line(
    resumed_runs, tmp_path, case, fragments
):
    root = resumed_runs[0]
    last = root / "through" / "checkpoints" / "last.ckpt"
    moved = tmp_path / "moved.ckpt"
    shutil.copy(last, moved)
    if case == "mid_epoch":  # a full checkpoint another callback wrote inside an epoch
        import torch

        checkpoint = torch.load(last, weights_only=True)
        torch.save({**checkpoint, "global_step": 15}, tmp_path / "mid_epoch.ckpt")
    overrides = {
        "best": [f"ckpt_path={root / 'through' / 'checkpoints' / 'best.ckpt'}"],
        "mid_epoch": [f"ckpt_path={tmp_path / 'mid_epoch.ckpt'}"],
        "missing": [f"ckpt_path={root / 'through' / 'checkpoints' / 'nope.ckpt'}"],
        "not_a_checkpoint": [f"ckpt_path={root / 'through' / '.hydra' / 'config.yaml'}"],
        # moved out of its run folder, where no saved config says how it was started: the
        # checkpoint's own hyperparameters still do
        "other_model": [f"ckpt_path={moved}", "model.module.hidden=64"],
        "other_settings": [f"ckpt_path={last}", "loader.batch_size=300"],
        "other_validation": [f"ckpt_path={last}", "val_every_batches=5"],
        "full_graph": [f"ckpt_path={last}", "strategy=graph_parallel", "trainer.accelerator=cpu"],
        "step_bounded": [f"ckpt_path={last}", "trainer.max_steps=100"],
    }[case]
    proc = run_recipe(tmp_path, *RESUME, "trainer.max_epochs=6", *overrides)
    assert_one_error_line(proc, *fragments)


def _last_checkpoints_equal(a_path, b_path) -> None:
    import torch

    a, b = torch.load(a_path, weights_only=True), torch.load(b_path, weights_only=True)
    assert a["global_step"] == b["global_step"] > 0
    for key in a["state_dict"]:
        assert torch.equal(a["state_dict"][key], b["state_dict"][key]), key


def _resumed_as_straight(tmp_path, *overrides: str):
    """A run of 4 epochs straight through, one of 2, and that one resumed to 4 (all under
    ``overrides``): their processes, after checking that the resumed run ends with the straight
    run's last checkpoint."""
    through = run_recipe(tmp_path / "through", *overrides, "trainer.max_epochs=4")
    half = run_recipe(tmp_path / "half", *overrides, "trainer.max_epochs=2")
    last = tmp_path / "half" / "checkpoints" / "last.ckpt"
    resumed = run_recipe(tmp_path / "resumed", *overrides, "trainer.max_epochs=4", f"ckpt_path={last}")
    for proc in (through, half, resumed):
        assert proc.returncode == 0, proc.stderr[-3000:]
    _last_checkpoints_equal(tmp_path / "through" / "checkpoints" / "last.ckpt", last)
    return through, resumed


@pytest.mark.slow  # two more recipe runs beside the default resume tests
def test_a_run_resumed_to_a_later_end_validates_where_it_would_have(tmp_path):
    """Validation every 3 epochs of 4 batches: the two-epoch half ends before its first validation,
    and the run resumed to 4 epochs validates after its third, as the straight run does (a schedule
    that depended on the run's length would differ, and Lightning resumes an epoch-end checkpoint
    under another schedule one batch off)."""
    through, resumed = _resumed_as_straight(tmp_path, *RESUME[:-1], "val_every_batches=10")
    fields_a, fields_b = result_fields(through.stdout), result_fields(resumed.stdout)
    for key in ("val", "test", "epochs", "batches"):
        assert fields_a[key] == fields_b[key], key


@pytest.mark.slow  # three recipe runs; the budget itself: tests/callbacks/test_validation_budget.py
def test_a_run_validating_within_a_share_of_its_time_resumes_exactly(tmp_path):
    """Under val_budget=time the validations fall where the clock says, the batches trained on do
    not: the run resumed from its second epoch ends with the straight run's parameters."""
    by_clock = (*(o for o in RESUME if not o.startswith("val_share")), "val_share=0.5", "val_budget=time")
    through, resumed = _resumed_as_straight(tmp_path, *by_clock)
    assert result_fields(resumed.stdout)["batches"] == result_fields(through.stdout)["batches"]


# a model of the user's that prints how many validations a fit ran
COUNTING_MODEL = """
from lightning_mqgnn.models import NodeClassifier


class CountingClassifier(NodeClassifier):
    validations = 0

    def on_validation_epoch_end(self):
        if not self.trainer.sanity_checking:
            self.validations += 1

    def on_fit_end(self):
        print(f"VALIDATIONS {self.validations}")
"""


def test_a_validation_per_epoch_is_kept_under_the_default_share(tmp_path):
    """val_every_batches=0 asks for a validation at each epoch's end: the default share, which
    checks every val_every_batches batches, does not apply to it."""
    (tmp_path / "counting_model.py").write_text(COUNTING_MODEL)
    proc = run_recipe(
        tmp_path / "run",
        "data.scale=0.02",  # 4 training batches an epoch
        "model.module._target_=counting_model.CountingClassifier",
        "trainer.max_epochs=3",
        "val_every_batches=0",
        env={"PYTHONPATH": os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert recipe_config().val_share is not None
    assert "VALIDATIONS 3" in proc.stdout.splitlines()


def test_settings_wrong_in_themselves_are_one_error_line_before_the_dataset_loads(tmp_path):
    """A dataset folder that does not exist would be the error if the recipe loaded it first."""
    missing = ("data=ondisk", f"data.path={tmp_path / 'missing'}")
    ckpt = tmp_path / "last.ckpt"
    ckpt.write_bytes(b"")
    proc = run_recipe(tmp_path, *missing, f"ckpt_path={ckpt}", "trainer.max_steps=100")
    line = assert_one_error_line(proc, "only a run bounded by epochs resumes", "trainer.max_steps=100")
    assert "missing" not in line
    proc = run_recipe(tmp_path, *missing, "strategy=mqgnn", "+trainer.accumulate_grad_batches=2")
    line = assert_one_error_line(proc, "predict_weights=True with accumulate_grad_batches=2")
    assert "missing" not in line
    proc = run_recipe(tmp_path, *missing, "loader=pipeline", "loader.num_workers=0")
    line = assert_one_error_line(proc, "num_workers must be >= 1 (or None for auto), got 0")
    assert "missing" not in line


@pytest.mark.slow  # six rank processes each import the stack
@pytest.mark.distributed
@pytest.mark.parametrize("strategy", ["ddp", "mqgnn"])
def test_a_resumed_two_rank_run_trains_as_one_that_ran_through(tmp_path, strategy):
    """Two gloo ranks: rank 0 decides when to write and writes, both restore from its file."""

    ranks = ("trainer.accelerator=cpu", "trainer.devices=2", f"strategy={strategy}")
    through, resumed = _resumed_as_straight(tmp_path, *RESUME, *ranks)
    assert result_fields(through.stdout)["test"] == result_fields(resumed.stdout)["test"]


def test_ckpt_path_auto_starts_a_run_then_resumes_it_in_its_folder(resumed_runs, tmp_path):
    """The same command twice in one folder, as a requeued job runs it: the first starts (no
    checkpoint yet), the second resumes its last.ckpt and ends as the run that went straight
    through; the settings it was started with are still checked (Hydra rewrites the folder's
    .hydra/config.yaml on the second start)."""
    root, through, _ = resumed_runs
    job = tmp_path / "job"
    first = run_recipe(job, *RESUME, "trainer.max_epochs=2", "ckpt_path=auto")
    assert first.returncode == 0, first.stderr[-3000:]
    assert "ckpt_path=auto: no " in first.stderr and "starting the run" in first.stderr
    again = run_recipe(job, *RESUME, "trainer.max_epochs=4", "ckpt_path=auto")
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"ckpt_path=auto: resuming from {job / 'checkpoints' / 'last.ckpt'}" in again.stderr
    _last_checkpoints_equal(root / "through" / "checkpoints" / "last.ckpt", job / "checkpoints" / "last.ckpt")
    assert result_fields(through.stdout)["test"] == result_fields(again.stdout)["test"]
    other = run_recipe(job, *RESUME, "trainer.max_epochs=4", "ckpt_path=auto", "loader.batch_size=300")
    assert_one_error_line(other, "other settings", "loader.batch_size=512 (this run: 300)")


def test_a_checkpoint_the_disk_cannot_hold_is_one_error_line(tmp_path):
    """A file-size limit below a checkpoint's size stands for a full disk: the run stops at its
    first checkpoint with one line naming the file, exit status 1, no partial file left."""
    import resource

    def limit_file_size():
        resource.setrlimit(resource.RLIMIT_FSIZE, (512 * 1024, resource.RLIM_INFINITY))

    cmd = [
        *TRAIN,
        *RESUME,
        "trainer.max_epochs=2",
        "trainer.enable_progress_bar=false",
        f"hydra.run.dir={tmp_path}",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, preexec_fn=limit_file_size)
    assert proc.returncode == 1, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert f"error: checkpoint {tmp_path / 'checkpoints'}" in errors[0] and "writing it failed" in errors[0]
    assert "no earlier checkpoint is there" in errors[0]
    assert not [p for p in (tmp_path / "checkpoints").iterdir() if p.suffix == ".partial"]
