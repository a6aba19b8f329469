"""``recipes/convert.py`` and ``data=ondisk``: a converted dataset trains as its in-memory original
does, through the sequential loader, spawned pipeline workers, the device-resident loader (on
the CPU here), the GNS cache, LABOR, a host tier of its rows and two ranks; features stored in half precision train as their float32 values; and
every bad input is one line."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from helpers.paths import REPO
from helpers.recipe import assert_one_error_line, result_fields, run_recipe

CONVERT = [sys.executable, str(REPO / "recipes" / "convert.py")]
SMALL = ("data.scale=0.02", "data.seed=1")
# validations after the same batches in both runs compared, not where the clock says
FIXED_VALIDATION = "val_share=null"


def convert(*overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CONVERT, *overrides], capture_output=True, text=True, timeout=300, cwd=REPO)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ondisk") / "arxiv_small"
    proc = convert(*SMALL, f"out={folder}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = proc.stdout.strip().splitlines()
    assert line.startswith("wrote generated-arxiv") and f"to {folder}: " in line and "MB/s" in line, line
    return folder


def _scores(proc: subprocess.CompletedProcess) -> tuple[str, ...]:
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = result_fields(proc.stdout)
    return result["data"], result["val"], result["test"], result["batches"], result["feature_rows_per_batch"]


@pytest.mark.parametrize(
    "setup",
    [
        ("loader=sequential",),
        pytest.param(
            (
                "loader=pipeline",
                "loader.num_workers=1",
                "loader.producer=workers",
                "loader.start_method=spawn",
            ),
            marks=pytest.mark.slow,
        ),
        pytest.param(("model=sage_gns",), marks=pytest.mark.slow),
        pytest.param(("model=labor_sage",), marks=pytest.mark.slow),
        ("loader=device",),
        pytest.param(("loader=device", "model=sage_gns"), marks=pytest.mark.slow),
        pytest.param(("loader=device", "loader.device_sampler=process"), marks=pytest.mark.slow),
    ],
    ids=["sequential", "spawned_workers", "gns", "labor", "device", "device_gns", "device_processes"],
)
def test_an_ondisk_dataset_trains_as_its_in_memory_original(converted, tmp_path, setup):
    """With the mapped pages bounded below what the libraries alone map: every process drops its
    pages as often as it checks, and the batches stay the same."""
    common = ("trainer.max_epochs=2", FIXED_VALIDATION, *setup)
    in_memory = run_recipe(tmp_path / "memory", *SMALL, *common)
    on_disk = run_recipe(
        tmp_path / "disk", "data=ondisk", f"data.path={converted}", "data.resident_gb=0.05", *common
    )
    assert _scores(on_disk) == _scores(in_memory)


@pytest.mark.parametrize(
    "setup",
    [
        ("loader=sequential", "loader.host_cache_policy=degree"),
        pytest.param(
            ("loader=pipeline", "loader.num_workers=2", "loader.producer=workers"), marks=pytest.mark.slow
        ),
        pytest.param(("model=sage_gns",), marks=pytest.mark.slow),
    ],
    ids=["sequential_degree", "workers_walk", "gns_walk"],
)
def test_a_host_tier_of_feature_rows_trains_as_the_features_alone(converted, tmp_path, setup):
    """The tier holds a third of the rows or so; what it serves is the same values, so the
    batches and the scores stay those of the in-memory run without it."""
    common = ("trainer.max_epochs=2", FIXED_VALIDATION, *setup)
    in_memory = run_recipe(tmp_path / "memory", *SMALL, *common)
    on_disk = run_recipe(
        tmp_path / "disk", "data=ondisk", f"data.path={converted}", "loader.host_cache_gb=0.0005", *common
    )
    assert _scores(on_disk) == _scores(in_memory)
    held = float(result_fields(on_disk.stdout)["host_cache_hit_rate"])
    assert 0 < held < 1
    assert "host_cache_hit_rate" not in result_fields(in_memory.stdout)


@pytest.fixture(scope="module")
def half_precision(converted, tmp_path_factory):
    """``folders(dtype)``: the small graph's features stored as ``dtype`` (float16 or bfloat16),
    beside its values widened back into a float32 dataset (a conversion of the half one), the
    reference to train; each converted once, when a test first asks for it."""
    root, made = tmp_path_factory.mktemp("half"), {}

    def folders(dtype: str) -> tuple:
        if dtype not in made:
            half, widened = root / dtype, root / f"{dtype}_as_float32"
            for args in (
                (f"data.path={converted}", f"out={half}", f"features_dtype={dtype}"),
                (f"data.path={half}", f"out={widened}"),
            ):
                proc = convert("data=ondisk", *args)
                assert proc.returncode == 0, proc.stderr[-3000:]
            size = (half / "features.npy").stat().st_size
            assert size * 2 < (converted / "features.npy").stat().st_size * 1.01
            made[dtype] = (half, widened)
        return made[dtype]

    return folders


@pytest.mark.parametrize(
    ("dtype", "setup"),
    [
        pytest.param("float16", ("loader=sequential",), marks=pytest.mark.slow),
        pytest.param(
            "bfloat16",
            (
                "loader=pipeline",
                "loader.num_workers=1",
                "loader.producer=workers",
                "loader.start_method=spawn",
                "loader.host_cache_gb=0.0003",
            ),
            marks=pytest.mark.slow,
        ),
        pytest.param("float16", ("model=sage_gns", "loader.host_cache_gb=0.0003"), marks=pytest.mark.slow),
        pytest.param("bfloat16", ("loader=device",), marks=pytest.mark.slow),
    ],
    ids=[
        "float16_sequential",
        "bfloat16_spawned_workers_host_tier",
        "float16_gns_host_tier",
        "bfloat16_device",
    ],
)
def test_half_precision_features_train_as_their_values_widened_to_float32(
    half_precision, tmp_path, dtype, setup
):
    """Rows, the first layer's aggregation, the host tier and the GNS device cache read half-precision
    features widened to float32: the run is the float32 run on the same values, score for score."""
    half, widened = half_precision(dtype)
    common = ("data=ondisk", "trainer.max_epochs=2", FIXED_VALIDATION, *setup)
    reference = run_recipe(tmp_path / "widened", f"data.path={widened}", *common)
    stored = run_recipe(tmp_path / "half", f"data.path={half}", *common)
    assert _scores(stored) == _scores(reference)


def test_convert_with_an_unknown_features_dtype_is_one_error_line(tmp_path):
    proc = convert(*SMALL, f"out={tmp_path / 'x'}", "features_dtype=int8")
    assert_one_error_line(
        proc, "features_dtype must be one of ('float32', 'float16', 'bfloat16'), got 'int8'"
    )
    assert not (tmp_path / "x").exists()


@pytest.mark.distributed
@pytest.mark.slow
def test_two_ranks_train_on_an_ondisk_dataset_as_in_memory(converted, tmp_path):
    common = (
        "trainer.max_epochs=2",
        FIXED_VALIDATION,
        "trainer.accelerator=cpu",
        "trainer.devices=2",
        "strategy=mqgnn",
    )
    in_memory = run_recipe(tmp_path / "memory", *SMALL, *common, timeout=600)
    on_disk = run_recipe(tmp_path / "disk", "data=ondisk", f"data.path={converted}", *common, timeout=600)
    assert _scores(on_disk) == _scores(in_memory)
    # with a host tier: one for the machine, filled by rank 0 and mapped by rank 1
    tiered = run_recipe(
        tmp_path / "tier",
        "data=ondisk",
        f"data.path={converted}",
        "loader.host_cache_gb=0.0003",
        *common,
        timeout=600,
    )
    assert _scores(tiered) == _scores(in_memory)
    tiers = re.findall(r"host tier: \d+ rows .* filled by pid (\d+), mapped by pid (\d+)", tiered.stdout)
    assert len(tiers) == 2, tiered.stdout[-3000:]
    (filled_0, mapped_0), (filled_1, mapped_1) = tiers
    assert filled_0 == filled_1 and mapped_0 != mapped_1


def test_ondisk_without_a_path_or_with_a_wrong_one_is_one_error_line(converted, tmp_path):
    assert_one_error_line(run_recipe(tmp_path / "a", "data=ondisk"), "data.path")
    missing = tmp_path / "nowhere"
    assert_one_error_line(
        run_recipe(tmp_path / "b", "data=ondisk", f"data.path={missing}"), f"{missing}: no such folder"
    )


def test_convert_refuses_an_existing_folder_in_one_line(converted):
    proc = convert(*SMALL, f"out={converted}")
    assert proc.returncode == 1, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: {converted}: already exists; pass overwrite=True (recipes/convert.py overwrite=true) to replace it"
    ]
    assert "Traceback" not in proc.stderr


def test_convert_without_out_is_one_error_line():
    proc = convert(*SMALL)
    assert_one_error_line(proc, "out")


def test_convert_with_an_unknown_data_config_is_one_error_line(tmp_path):
    proc = convert("data=nonexistent", f"out={tmp_path / 'x'}")
    assert_one_error_line(proc, "unknown data config 'nonexistent'", "products_like_1m")
    assert not (tmp_path / "x").exists()


def test_an_ondisk_dataset_trains_without_validation(converted, tmp_path):
    """+trainer.limit_val_batches=0, as a graph too large for exact inference trains: no metric."""
    proc = run_recipe(
        tmp_path,
        "data=ondisk",
        f"data.path={converted}",
        "trainer.max_epochs=1",
        "+trainer.limit_val_batches=0",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = result_fields(proc.stdout)
    assert result["val"] == "nan" and int(result["batches"]) > 0
    assert float(result["test"]) > 2 / 40  # twice chance among 40 classes after one epoch
