"""The rule that picks who produces an epoch's batches: workers first, then the training thread,
then whichever had the lower median batch time."""

import pytest

from lightning_mqgnn.pipeline.producer_choice import ProducerChoice


def feed(choice: ProducerChoice, producer: str, seconds: list[float]) -> None:
    for index, s in enumerate(seconds):
        choice.observe(producer, index, s)


@pytest.mark.parametrize(
    ("workers_s", "trainer_s", "chosen"), [(0.02, 0.03, "workers"), (0.03, 0.02, "trainer")]
)
def test_each_producer_is_timed_then_the_faster_is_kept(workers_s, trainer_s, chosen):
    choice = ProducerChoice(samples=4, skip=2)
    assert choice.producer() == "workers"
    feed(choice, "workers", [9.0, 9.0, workers_s, workers_s])  # the first two are not timed
    assert choice.producer() == "workers"
    feed(choice, "workers", [9.0, 9.0, workers_s, 5.0])  # one outlier does not move a median
    assert choice.producer() == "trainer"
    feed(choice, "trainer", [9.0, 9.0, trainer_s, trainer_s, trainer_s, trainer_s])
    assert choice.producer() == chosen
    feed(choice, "workers" if chosen == "trainer" else "trainer", [0.0] * 10)  # no more timing
    assert choice.producer() == chosen


def test_workers_policy_never_tries_the_trainer_and_bad_policies_are_refused():
    choice = ProducerChoice("workers", samples=1, skip=0)
    feed(choice, "workers", [1.0, 1.0])
    assert choice.producer() == "workers" and choice.times["workers"] == []
    with pytest.raises(ValueError, match="producer must be one of"):
        ProducerChoice("threads")
