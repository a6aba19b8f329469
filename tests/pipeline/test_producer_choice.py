"""The rule that picks who produces an epoch's batches: the training thread first, then a few
steps on the threads the workers would leave, then the workers only where those leave them room,
then whichever had the lower median batch time."""

import pytest

from lightning_mqgnn.pipeline.producer_choice import ProducerChoice


def feed(choice: ProducerChoice, producer: str, seconds: list[float]) -> None:
    for index, s in enumerate(seconds):
        choice.observe(producer, index, s)


def probe(choice: ProducerChoice, seconds: list[float]) -> None:
    for s in seconds:
        assert choice.probing()
        choice.observe_narrow_step(s)


def test_workers_are_never_started_when_a_narrow_step_is_slower_than_a_whole_batch():
    choice = ProducerChoice(samples=4, probes=2, skip=2)
    assert choice.producer() == "trainer" and not choice.probing()
    feed(choice, "trainer", [9.0, 9.0, 0.02, 0.02, 0.02])  # the first two are not timed
    assert choice.producer() == "trainer" and not choice.probing()
    feed(choice, "trainer", [9.0, 9.0, 0.02])
    assert choice.probing() and choice.producer() == "trainer"
    feed(choice, "trainer", [9.0, 9.0, 5.0])  # batch times are not taken while probing
    probe(choice, [0.017, 0.0165])
    # 0.017 s: faster than a 0.02 s batch, but not by the margin (20%) workers lose beside it;
    # settled at the last probe, so the rest of the epoch is no longer timed
    assert not choice.probing() and choice.chosen == "trainer"
    feed(choice, "trainer", [9.0, 9.0, 0.03])
    assert choice.producer() == "trainer"
    assert choice.times == {"workers": [], "trainer": [0.02] * 4}


@pytest.mark.parametrize(("workers_s", "chosen"), [(0.015, "workers"), (0.03, "trainer")])
def test_workers_are_timed_when_they_could_win_and_the_faster_is_kept(workers_s, chosen):
    choice = ProducerChoice(samples=4, probes=2, skip=2)
    feed(choice, "trainer", [9.0, 9.0, 0.02, 0.02, 0.02, 0.02])
    probe(choice, [0.012, 0.012])  # narrow steps well under a batch: the workers may win
    assert choice.producer() == "workers" and choice.chosen is None
    feed(choice, "workers", [9.0, 9.0, workers_s, workers_s])
    assert choice.producer() == "workers"
    feed(choice, "workers", [9.0, 9.0, workers_s, 5.0])  # one outlier does not move a median
    assert choice.producer() == chosen == choice.chosen
    feed(choice, "trainer", [0.0] * 10)  # no more timing
    assert choice.producer() == chosen


def test_workers_policy_never_tries_the_trainer_and_bad_policies_are_refused():
    choice = ProducerChoice("workers", samples=1, skip=0)
    feed(choice, "workers", [1.0, 1.0])
    assert choice.producer() == "workers" and choice.times["workers"] == []
    assert not choice.probing()
    with pytest.raises(ValueError, match="producer must be one of"):
        ProducerChoice("threads")


@pytest.mark.parametrize(("produce_s", "chosen"), [(0.003, "trainer"), (0.005, None)])
def test_the_training_thread_is_kept_without_probes_where_production_is_minor(produce_s, chosen):
    # workers save at most the 3 ms of sampling and gathering in a 20 ms batch: under the 20%
    # margin, settled at the samples-th batch time; 5 ms (25%) leaves room, so the probes run
    choice = ProducerChoice(samples=4, probes=2, skip=2)
    for index in range(6):
        choice.observe("trainer", index, 0.02, produce_s)
    assert choice.chosen == chosen
    assert choice.probing() == (chosen is None)
    assert choice.produce_times == [produce_s] * 4


def test_without_production_times_the_probes_decide():
    choice = ProducerChoice(samples=4, probes=2, skip=2)
    feed(choice, "trainer", [9.0, 9.0, 0.02, 0.02, 0.02, 0.02])
    assert not choice.production_is_minor() and choice.probing()


def test_the_choice_is_logged_once_when_made_and_reported_in_result_fields(caplog):
    choice = ProducerChoice(samples=2, probes=2, skip=0)
    assert choice.result_fields() == " producer=undecided probes=0"
    with caplog.at_level("INFO", logger="lightning_mqgnn.pipeline.producer_choice"):
        for index in range(4):
            choice.observe("trainer", index, 0.02, 0.001)
        choice.producer()
    assert [r.getMessage() for r in caplog.records] == [
        "pipeline: the training thread produces the batches: sampling and gathering are a minor "
        "share of a batch (medians: batch_ms 20.00, produce_ms 1.00)"
    ]
    assert choice.result_fields() == " producer=trainer probes=0"
