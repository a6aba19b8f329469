"""``bench compressed``: fits of the gradient queue and DDP behind a simulated link, with and
without compression hooks, reported per configuration; the link's model of a wire."""

from __future__ import annotations

import json
import time

import pytest
from helpers.paths import REPO


@pytest.fixture
def compressed(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "recipes"))
    from benchmarks import compressed

    return compressed


def test_the_link_carries_messages_in_order_then_adds_its_latency(compressed):
    link = compressed.Link(gbit_s=8.0, latency_ms=2.0)  # 1e9 bytes a second
    start = time.perf_counter()
    first = link.delivered_at(start, 1e6)  # 1 ms on the wire
    second = link.delivered_at(start, 1e6)  # queued behind the first
    assert first == pytest.approx(start + 0.001 + 0.002)
    assert second == pytest.approx(start + 0.002 + 0.002)
    later = link.delivered_at(start + 1.0, 0)  # an idle wire: latency alone
    assert later == pytest.approx(start + 1.002)


@pytest.mark.distributed
def test_two_ranks_report_bytes_wait_epoch_and_test_per_configuration(compressed, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    args = ["--data", "generated:arxiv", "--scale", "0.02", "--ranks", "2", "--epochs", "2"]
    args += ["--configs", "DDP,s1,s1 q4", "--links", "1:1", "--out", str(tmp_path)]
    table = compressed.main(args)
    records = json.loads((tmp_path / "compressed.json").read_text())
    assert sorted((r["config"], r["rank"]) for r in records) == [
        ("DDP", 0), ("DDP", 1), ("s1", 0), ("s1", 1), ("s1 q4", 0), ("s1 q4", 1),
    ]  # fmt: skip
    by = {(r["config"], r["rank"]): r for r in records}
    assert by[("DDP", 0)]["bytes_per_step"] == by[("s1", 0)]["bytes_per_step"] > 0  # float32, once a step
    assert by[("s1", 0)]["bytes_per_step"] / by[("s1 q4", 0)]["bytes_per_step"] > 7
    assert all(r["epoch_s"] > 0 and 0 <= r["test"] <= 1 for r in records)
    assert [r["staleness"] for r in records if r["config"] != "DDP"] == [1, 1, 1, 1]
    assert "| 1:1 | s1 q4 |" in table and "bench.py compressed --data generated:arxiv" in table
    assert (tmp_path / "compressed.md").read_text() == table


def test_an_unknown_configuration_is_refused(compressed):
    with pytest.raises(SystemExit):
        compressed.main(["--configs", "DDP,s9"])
    with pytest.raises(SystemExit):  # DDP has no stale gradient to predict weights for
        compressed.main(["--configs", "DDP predicted"])


def test_a_predicted_configuration_is_its_queue_with_weight_prediction(compressed):
    assert compressed.parse_config("s1 q4 predicted") == (1, "q4", True)
    assert compressed.parse_config("auto predicted") == ("auto", None, True)
    assert compressed.parse_config("s1 q4") == (1, "q4", False)


@pytest.mark.parametrize(
    ("name", "bits", "feedback"), [("q4", 4, False), ("q4ef", 4, True), ("q2ef", 2, True)]
)
def test_a_quantising_configuration_names_its_bits_and_error_feedback(compressed, name, bits, feedback):
    from lightning_mqgnn.strategy import quantize_hook

    hook, state, gathers = compressed._hook_and_state(name)
    assert hook is quantize_hook and gathers
    assert (state.bits, state.error_feedback) == (bits, feedback)
