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
