"""The summary of runs over seeds: the mean and sample std, their text, the seeds ``seeds=``
takes, each run's ``result.json`` and the summary files and table read from them."""

import csv
import json
import math

import pytest


@pytest.fixture
def recipes():
    from lightning_mqgnn.recipe import seed_runs, seed_stats, summarize

    return seed_stats, seed_runs, summarize


def test_the_std_is_the_sample_std(recipes):
    stats, _, _ = recipes
    s = stats.spread([1.0, 2.0, 3.0, 4.0])
    assert (s.mean, s.n) == (2.5, 4)
    assert s.std == pytest.approx(math.sqrt(5 / 3), rel=1e-15)  # squares 2.25+0.25+0.25+2.25 over n - 1
    assert s.variance == pytest.approx(5 / 3, rel=1e-15)
    one = stats.spread([0.5])
    assert one.mean == 0.5 and math.isnan(one.std)
    assert math.isnan(stats.spread([0.5, math.nan]).mean)  # a missing metric is not averaged away
    with pytest.raises(ValueError):
        stats.spread([])


@pytest.mark.parametrize(
    ("mean", "std", "n", "decimals", "text"),
    [
        (0.92114, 0.00213, 3, None, "0.9211 ± 0.0021"),
        (0.92114, 0.0213, 3, None, "0.921 ± 0.021"),
        (2.831, 0.0009999999999998899, 3, None, "2.8310 ± 0.0010"),  # the std rounds up a decade
        (0.5, 0.00996, 3, None, "0.500 ± 0.010"),
        (11.52, 1.54, 3, None, "11.5 ± 1.5"),
        (594.0, 12.3, 3, None, "594 ± 12"),
        (8.0, 0.0, 2, None, "8 ± 0"),
        (0.16474, 0.0, 2, None, "0.1647 ± 0.0000"),
        (0.9318, math.nan, 1, None, "0.9318"),
        (0.92114, 0.00213, 3, 2, "0.92 ± 0.00"),
    ],
)
def test_the_text_shows_the_std_to_two_digits(recipes, mean, std, n, decimals, text):
    stats, _, _ = recipes
    assert stats.format_spread(stats.Spread(mean, std, n), decimals) == text


@pytest.mark.parametrize(
    ("arg", "written"),
    [
        ("seeds=0,1,2", "seeds=[0,1,2]"),
        ("+seeds=3,4", "+seeds=[3,4]"),
        ("seeds=range(3)", "seeds=[0,1,2]"),
        ("seeds=range(2, 9, 3)", "seeds=[2,5,8]"),
        ("seeds=[4,5]", "seeds=[4,5]"),
        ("seeds=7", "seeds=7"),
        ("seed=0,1", "seed=0,1"),  # a sweep of -m, left to Hydra
        ("model=gcn,sage", "model=gcn,sage"),
    ],
)
def test_seeds_given_as_a_sweep_are_one_list(recipes, arg, written):
    _, runs, _ = recipes
    assert runs.seeds_as_list([arg]) == [written]


def test_the_seeds_are_distinct_whole_numbers(recipes):
    _, runs, _ = recipes
    assert runs.seed_list(None) is None
    assert runs.seed_list([3, 0]) == [3, 0]
    assert runs.seed_list("0, 1") == [0, 1]
    for value, fragment in [
        (3, "give a list of seeds"),
        ([], "at least one seed"),
        ([0, 0], "seed 0 is given twice"),
        ([-1], "not -1"),
        ([2**32], f"not {2**32}"),
        ([True], "not True"),
        (["a"], "not 'a'"),
        ("0,x", "not 'x'"),
    ]:
        with pytest.raises(ValueError, match=fragment):
            runs.seed_list(value)


def test_the_configuration_leaves_out_the_seed_and_where_a_run_writes(recipes):
    _, runs, _ = recipes
    overrides = [
        "seeds=[0,1]",
        "model=gcn",
        "seed=3",
        "ckpt_path=auto",
        "hydra.run.dir=x",
        "trainer.enable_progress_bar=false",
        "+trainer.limit_val_batches=2",
        "data=cora",
    ]
    assert runs.configuration(overrides) == ("+trainer.limit_val_batches=2", "data=cora", "model=gcn")


def test_result_fields_are_numbers_where_they_are_numbers(recipes):
    _, runs, _ = recipes
    fields = runs.result_fields(
        "RESULT model=sage val=0.9318 test=nan epochs=33 peak_rss_mb=521/518 staleness=auto:2"
    )
    assert fields["model"] == "sage" and fields["val"] == 0.9318 and math.isnan(fields["test"])
    assert fields["epochs"] == 33 and isinstance(fields["epochs"], int)
    assert (fields["peak_rss_mb"], fields["staleness"]) == ("521/518", "auto:2")


def run(runs, folder, seed, config=("model=sage",), **fields):
    return runs.RunResult(seed, tuple(config), {"model": "sage", "data": "cora", **fields}, folder)


def test_a_result_reads_back_as_written_nan_as_null(recipes, tmp_path):
    _, runs, _ = recipes
    written = run(runs, tmp_path / "seed_4", 4, val=0.81, test=math.nan, batches=12, producer="workers")
    path = runs.write_result(written)
    assert json.loads(path.read_text())["result"]["test"] is None
    back = runs.read_result(path)
    assert (back.seed, back.config, back.folder) == (4, ("model=sage",), tmp_path / "seed_4")
    assert back.fields["val"] == 0.81 and back.fields["batches"] == 12 and math.isnan(back.fields["test"])
    assert [p.name for p in path.parent.iterdir()] == ["result.json"]  # no partial file left


def test_the_summary_spreads_numbers_and_keeps_the_text_the_runs_share(recipes, tmp_path):
    stats, runs, _ = recipes
    a = run(runs, tmp_path / "seed_0", 0, val=0.80, batches=10, producer="workers", peak_rss_mb="500/510")
    b = run(runs, tmp_path / "seed_1", 1, val=0.84, batches=12, producer="trainer", peak_rss_mb="520/505")
    summary = runs.summarize([a, b])
    assert summary.spreads["val"] == stats.spread([0.80, 0.84]) and summary.spreads["batches"].mean == 11
    assert summary.shared == {"model": "sage", "data": "cora"}  # producer and peak_rss_mb differ
    line = runs.summary_line(summary)
    assert line == "SUMMARY n=2 seeds=0,1 model=sage data=cora val=0.820 ± 0.028 batches=11.0 ± 1.4"
    with pytest.raises(ValueError, match="2 configurations"):
        runs.summarize([a, run(runs, tmp_path / "x", 2, config=("model=gcn",), val=0.5)])


def test_the_summary_files_hold_every_run_and_the_mean_and_std(recipes, tmp_path):
    stats, runs, _ = recipes
    sage = [run(runs, tmp_path / f"seed_{s}", s, val=v) for s, v in [(0, 0.80), (1, 0.84), (2, 0.83)]]
    gcn = [run(runs, tmp_path / "gcn" / "0", 0, config=("model=gcn",), val=0.7)]
    summaries = runs.group_by_configuration([sage[0], gcn[0], sage[1], sage[2]])
    assert [len(s.runs) for s in summaries] == [3, 1]
    csv_file, json_file = runs.write_summaries(summaries, tmp_path)
    rows = list(csv.DictReader(csv_file.open()))
    assert [(r["row"], r["seed"], r["folder"]) for r in rows] == [
        ("run", "0", "seed_0"),
        ("run", "1", "seed_1"),
        ("run", "2", "seed_2"),
        ("mean", "", ""),
        ("std", "", ""),
        ("run", "0", "gcn/0"),
        ("mean", "", ""),
        ("std", "", ""),
    ]
    expected = stats.spread([0.80, 0.84, 0.83])
    assert float(rows[3]["val"]) == expected.mean and float(rows[4]["val"]) == expected.std
    assert rows[3]["model"] == "sage" and rows[3]["n"] == "3" and rows[0]["config"] == "model=sage"
    assert rows[7]["val"] == "nan"  # one run: no spread
    groups = json.loads(json_file.read_text())["groups"]
    assert groups[0]["mean"]["val"] == expected.mean and groups[0]["std"]["val"] == expected.std
    assert groups[0]["text"]["val"] == "0.823 ± 0.021" and groups[0]["seeds"] == [0, 1, 2]
    assert groups[1]["std"]["val"] is None and groups[1]["runs"][0]["folder"] == "gcn/0"


def test_the_table_has_a_row_per_model_and_a_column_per_dataset(recipes, tmp_path):
    _, runs, _ = recipes

    def group(model, data, values, extra=()):
        config = (f"model={model}", f"data={data}", *extra)
        return runs.summarize(
            [
                runs.RunResult(s, config, {"model": model, "data": data, "test": v}, tmp_path)
                for s, v in enumerate(values)
            ]
        )

    summaries = [
        group("gcn", "cora", [0.80, 0.82]),
        group("gcn", "citeseer", [0.70, 0.71]),
        group("sage", "cora", [0.81, 0.85, 0.83]),
        group("sage", "cora", [0.60, 0.62], extra=("loader.batch_size=64",)),
    ]
    assert runs.table(summaries, "test", decimals=3) == [
        "| test | cora | citeseer |",
        "|---|---|---|",
        "| gcn | 0.810 ± 0.014 | 0.705 ± 0.007 |",
        "| sage | 0.830 ± 0.020 (n=3) |  |",
        "| sage loader.batch_size=64 | 0.610 ± 0.014 |  |",
        "",
        "Mean ± sample standard deviation over 2 runs (seeds) per cell.",
    ]
    with pytest.raises(ValueError, match="two configurations fall in one cell"):
        runs.table([*summaries, group("sage", "cora", [0.5], extra=("data.scale=0.5",))], "test")


def test_summarize_writes_the_summary_and_prints_the_table(recipes, tmp_path, capsys):
    _, runs, summarize = recipes
    for model, values in [("gcn", [0.80, 0.82]), ("sage", [0.84, 0.86])]:
        for seed, value in enumerate(values):
            folder = tmp_path / model / runs.seed_folder(seed)
            runs.write_result(
                runs.RunResult(
                    seed, (f"model={model}",), {"model": model, "data": "cora", "test": value}, folder
                )
            )
    assert summarize.main([str(tmp_path), "--table", "test", "--out", str(tmp_path / "table.md")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[:2] == [
        "SUMMARY n=2 seeds=0,1 model=gcn data=cora test=0.810 ± 0.014",
        "SUMMARY n=2 seeds=0,1 model=sage data=cora test=0.850 ± 0.014",
    ]
    assert "| gcn | 0.810 ± 0.014 |" in out and (tmp_path / "table.md").read_text().startswith(
        "| test | cora |"
    )
    assert len(json.loads((tmp_path / "summary.json").read_text())["groups"]) == 2
    assert summarize.main([str(tmp_path), "--table", "tset"]) == 2
    assert "not a numeric field of these runs (test)" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert summarize.main([str(empty)]) == 2
    assert "no result.json under" in capsys.readouterr().err
