"""``bench loaders``: the recipe's loaders fitted alternately in one process, each round's ratio to
the reference loader, and who produced the pipelined batches."""

import re

import pytest
from helpers.paths import REPO


@pytest.fixture
def loaders(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "recipes"))
    from benchmarks import loaders

    return loaders


def test_the_order_of_a_rounds_fits_rotates(loaders):
    assert [loaders.rotated(["a", "b", "c"], r) for r in range(4)] == [
        ["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"],
    ]  # fmt: skip


def test_fits_alternate_in_one_process_and_each_round_is_compared(loaders, tmp_path, capsys):
    out = tmp_path / "loaders.md"
    args = ["--data", "generated", "--model", "sage", "--rounds", "2", "--epochs", "1", "--out", str(out)]
    assert loaders.main(args) == 0
    text = out.read_text()
    rows = {line.split(" | ")[0].strip("| "): line for line in text.splitlines() if line.startswith("| ")}
    sequential, pipeline = rows["sequential"], rows["pipeline"]
    assert "| 1.000x | 0 of 2 | - |" in sequential  # the reference against itself
    times = [float(t) for t in pipeline.split(" | ")[2].split(", ")]
    assert len(times) == 2 and all(t > 0 for t in times)
    assert re.search(r"\| \d+\.\d{3}x \| [0-2] of 2 \| (trainer|workers|undecided)", pipeline)
    assert "bench.py loaders --data generated" in text


def test_a_single_loader_is_refused(loaders):
    with pytest.raises(SystemExit):
        loaders.main(["--loaders", "sequential"])
