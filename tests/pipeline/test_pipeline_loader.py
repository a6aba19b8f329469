"""The pipelined loader delivers exactly the sequential loop's batches, in order, and serves the
device feature cache."""

import lightning.pytorch as pl
import pytest
import torch
from helpers.pipeline import (
    SlowSampler,
    ThreadsAtValidation,
    cores_and_threads,
    live_children,
    make_trainer,
    seeded_module,
    small_dataset,
    worker_pipeline,
)

from lightning_mqgnn.data import LoaderSettings, MQGNNDataModule
from lightning_mqgnn.pipeline.packing import SlotArena
from lightning_mqgnn.pipeline.produce import produce_batch
from lightning_mqgnn.pipeline.sequential import SequentialLoader
from lightning_mqgnn.pipeline.workers import SamplerWorkerPool
from lightning_mqgnn.sampling.neighbor import NeighborSampler


@pytest.fixture(scope="module")
def ds():
    return small_dataset()


class JitterSampler(SlowSampler):
    """Uneven sampling times so two workers finish out of order."""

    def sample(self, seeds):
        import time

        time.sleep(0.03 * int(seeds[0] % 3))
        return NeighborSampler.sample(self, seeds)


def test_pipeline_yields_the_sequential_batches_in_order(ds):
    before = live_children()
    seq = MQGNNDataModule(ds, NeighborSampler(ds.graph, [5, 5]), LoaderSettings(batch_size=128, seed=3))
    pipe = worker_pipeline(
        ds,
        JitterSampler(ds.graph, [5, 5], 0.0),
        batch_size=128,
        seed=3,
        num_workers=2,
    )
    expected = list(SequentialLoader(seq.source))
    loader = pipe.train_dataloader()
    try:
        got = list(loader)
        workers = {b.meta["worker"] for b in got}
        again = list(loader)  # a second pass: the persistent workers serve it
    finally:
        pipe.shutdown_pipeline()
    n = -(-ds.train_idx.numel() // 128)
    assert len(got) == len(expected) == len(loader) == n >= 5
    assert workers == {0, 1}
    for a, b in zip(expected, got):
        assert a.meta["index"] == b.meta["index"]
        assert torch.equal(a.output_nodes, b.output_nodes)
        assert torch.equal(a.input_nodes, b.input_nodes)  # same per-batch sampler seed
        assert torch.equal(a.features, b.features) and torch.equal(a.labels, b.labels)
        for x, y in zip(a.blocks, b.blocks):
            assert torch.equal(x.indices, y.indices) and torch.equal(x.weights, y.weights)
    assert [b.meta["index"] for b in again] == list(range(n))
    assert all(b.meta["wait_s"] >= 0 and b.meta["transfer_s"] >= 0 for b in got)
    assert live_children() - before == set()


def test_reused_slots_never_overwrite_a_batch_still_held(ds):
    """Workers gather into lent shared-memory slots; a slot is lent again only once no tensor of
    its batch is alive. Holding every batch of two epochs (far more than the slots) must keep
    each one intact, and dropping them must return every slot."""
    seq = MQGNNDataModule(ds, NeighborSampler(ds.graph, [5, 5]), LoaderSettings(batch_size=64, seed=5))
    pipe = worker_pipeline(
        ds,
        batch_size=64,
        seed=5,
        num_workers=2,
        cpu_queue_size=2,
        queue_size=1,
    )
    loader = pipe.train_dataloader()
    try:
        held = list(loader)
        arena = loader.pool.arena
        in_slots = arena.max_slots - arena.num_free
        streamed = sum(int(b.features.sum() != 0) for b in loader)  # dropped as soon as read
        free_while_holding = arena.num_free
        expected = list(SequentialLoader(seq.source))
        for a, b in zip(expected, held, strict=True):
            assert torch.equal(a.features, b.features) and torch.equal(a.input_nodes, b.input_nodes)
            assert torch.equal(a.blocks[0].indices, b.blocks[0].indices)
        del held, b
        free_after = arena.num_free
    finally:
        pipe.shutdown_pipeline()
    assert len(expected) > 3 * arena.max_slots // 2 and streamed == len(expected)
    assert in_slots >= 1  # some batches really travelled in slots while others were held
    assert free_while_holding == arena.max_slots - in_slots  # streaming reused the freed slots only
    assert free_after == arena.max_slots


class SlotSpy:
    """Counts, for every ``SlotArena`` and worker pool of a test, the tasks sent without a slot,
    the tasks that carried a slot's tensor, and the batches that did not fit the slot they were
    lent."""

    def __init__(self, monkeypatch):
        self.without_slot = self.slot_tensors_sent = self.outgrown = 0
        acquire, observe = SlotArena.acquire, SlotArena.observe

        def acquiring(arena):
            lent = acquire(arena)
            self.without_slot += lent is None
            return lent

        def observing(arena, nbytes, slot_id=-1):
            self.outgrown += slot_id >= 0
            return observe(arena, nbytes, slot_id)

        monkeypatch.setattr(SlotArena, "acquire", acquiring)
        monkeypatch.setattr(SlotArena, "observe", observing)

    def watch_tasks(self, pool: SamplerWorkerPool) -> None:
        """Count the tasks of the started ``pool`` that carry a slot's tensor (the last field)."""
        for tasks in pool._tasks:
            put = tasks.put

            def putting(task, *args, _put=put, **kwargs):
                self.slot_tensors_sent += task[-1] is not None
                return _put(task, *args, **kwargs)

            tasks.put = putting


def test_workers_fill_regrown_slots_and_tasks_name_held_slots_by_number(ds, monkeypatch):
    """A slot's tensor goes to a worker once per allocation; later tasks send only its number.
    Batches that outgrow the slots make the arena reallocate them, and the workers must then
    write into the new ones: every batch must still equal the one made in this process."""
    spy = SlotSpy(monkeypatch)
    sampler = NeighborSampler(ds.graph, [5, 5])
    # pin_slots without CUDA: the slots stay plain shared memory and everything else holds
    pool = SamplerWorkerPool(sampler, ds.features, ds.labels, num_workers=2, max_slots=3, pin_slots=True)
    sizes = [16] * 12 + [128] * 12 + [16] * 12  # the jump to 128 seeds outgrows every slot
    pool.start()
    spy.watch_tasks(pool)
    try:
        for index, size in enumerate(sizes):
            seeds = ds.train_idx[index : index + size]
            pool.submit(0, index, seeds, rng_seed=index)
            if pool.in_flight == 2 or index == len(sizes) - 1:
                while pool.in_flight:
                    got = pool.get(timeout=30).batch
                    i = got.meta["index"]
                    want = produce_batch(
                        sampler, ds.train_idx[i : i + sizes[i]], ds.features, ds.labels, i, i
                    )
                    assert torch.equal(got.input_nodes, want.input_nodes)
                    assert torch.equal(got.features, want.features)
                    assert torch.equal(got.blocks[0].indices, want.blocks[0].indices)
                    del got
    finally:
        pool.stop()
    assert spy.outgrown >= 1  # a batch did outgrow its slot
    # at most one send per (worker, slot, allocation): 2 x 3 x 2, far fewer than the tasks
    assert 1 <= spy.slot_tensors_sent <= 12 < len(sizes)


def test_the_first_tasks_already_get_slots(ds, monkeypatch):
    # one batch sampled in the trainer at start sizes the slots, so the tasks sent before any
    # result came back do not each need a fresh shared-memory segment
    spy = SlotSpy(monkeypatch)
    dm = worker_pipeline(
        ds,
        batch_size=64,
        num_workers=2,
        cpu_queue_size=6,
    )
    loader = dm.train_dataloader()
    try:
        n = len(list(loader))
        pool = loader.pool
    finally:
        dm.shutdown_pipeline()
    assert n > 6 and pool.arena.slot_bytes > 0
    assert spy.without_slot == 0


class TinyCache:
    """A feature cache with the GNS cache's interface: shared ``nodes``/``slot`` refreshed in place."""

    def __init__(self, num_nodes: int, size: int):
        self.nodes = torch.zeros(size, dtype=torch.int64)
        self.slot = torch.full((num_nodes,), -1, dtype=torch.int64)
        self.refreshed: list[int] = []

    def refresh_(self, epoch: int) -> None:
        gen = torch.Generator().manual_seed(100 + epoch)
        self.nodes.copy_(torch.randperm(self.slot.numel(), generator=gen)[: self.nodes.numel()])
        self.slot.fill_(-1)
        self.slot[self.nodes] = torch.arange(self.nodes.numel())
        self.refreshed.append(epoch)


class Capture(pl.Callback):
    def __init__(self):
        self.rows = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.rows.append(
            (trainer.current_epoch, batch.input_nodes, batch.features, batch.cache_slots, batch.meta)
        )


@pytest.mark.parametrize("mode", ["sequential", "pipeline"])
def test_feature_cache_is_refreshed_each_epoch_and_merged_before_the_model(ds, mode):
    cache = TinyCache(ds.num_nodes, 300)
    dm = worker_pipeline(ds, mode=mode, batch_size=256, feature_cache=cache)
    cap = Capture()
    trainer = make_trainer([cap], max_epochs=2)
    trainer.fit(seeded_module(ds), dm)
    assert cache.refreshed == [0, 1]
    if mode == "pipeline":  # a cache is redrawn while the workers idle: no head start across epochs
        assert not any(meta.get("head_start") for *_, meta in cap.rows)
    for epoch, nodes, feats, slots, meta in cap.rows:
        assert slots is None  # the model never sees the cache
        assert torch.equal(feats, ds.features[nodes])
        if mode == "pipeline":  # the workers read the slots of *this* epoch's cache
            gen = torch.Generator().manual_seed(100 + epoch)
            cached = torch.randperm(ds.num_nodes, generator=gen)[:300]
            assert meta["cache_hits"] == int(torch.isin(nodes, cached).sum()) > 0


def test_gns_cache_and_sampler_train_identically_in_both_modes(ds):
    from lightning_mqgnn.sampling.feature_cache import GNSCache
    from lightning_mqgnn.sampling.gns import GNSSampler

    out = {}
    for mode in ("sequential", "pipeline"):
        cache = GNSCache(ds.graph, ds.train_idx, fraction=0.05, fanouts=(5, 5), seed=0)
        dm = worker_pipeline(
            ds, GNSSampler(ds.graph, [5, 5], cache), mode, batch_size=256, feature_cache=cache
        )
        cap = Capture()
        trainer = make_trainer([cap], max_epochs=2)
        model = seeded_module(ds, seed=3)
        trainer.fit(model, dm)
        out[mode] = (cap.rows, torch.cat([p.detach().flatten() for p in model.parameters()]))
    (rows_a, params_a), (rows_b, params_b) = out["sequential"], out["pipeline"]
    assert len(rows_a) == len(rows_b) > 0
    for a, b in zip(rows_a, rows_b):
        assert torch.equal(a[1], b[1]) and torch.equal(a[2], b[2])  # same nodes, same merged features
    assert sum(r[4].get("cache_hits", 0) for r in rows_b) > 0
    assert torch.equal(params_a, params_b)


def test_training_threads_leave_the_workers_their_cores(monkeypatch):
    from lightning_mqgnn.pipeline import workers

    with cores_and_threads(monkeypatch, cores=8, threads=4):
        # 8 cores, 2 ranks on the node -> 4 per rank; 1 worker x 2 threads leaves 2
        assert workers.limit_training_threads(2, num_workers=1, worker_threads=2) == 2
        assert workers.limit_training_threads(1, num_workers=1, worker_threads=1) == 2  # never raised
        assert workers.limit_training_threads(1, num_workers=8, worker_threads=1) == 1  # at least one


def test_an_epoch_trains_on_the_free_cores_and_gives_the_threads_back(ds, monkeypatch):
    dm = worker_pipeline(
        ds,
        NeighborSampler(ds.graph, [3]),
        batch_size=256,
        num_workers=2,
        worker_threads=3,
    )
    with cores_and_threads(monkeypatch, cores=8, threads=4):
        try:
            seen = [torch.get_num_threads() for _ in dm.train_dataloader()]
            threads_after = torch.get_num_threads()
        finally:
            dm.shutdown_pipeline()
    assert set(seen[:-1]) == {2}  # 8 cores - 2 workers x 3 threads
    # the last batch leaves the workers idle: its step, and the validation Lightning starts
    # without asking past the end of a sized loader, get every thread back
    assert seen[-1] == 4 and threads_after == 4


def test_validation_inside_fit_runs_with_every_thread(ds, monkeypatch):
    dm = worker_pipeline(
        ds,
        NeighborSampler(ds.graph, [3, 3]),
        batch_size=256,
        num_workers=2,
    )
    probe = ThreadsAtValidation()
    with cores_and_threads(monkeypatch, cores=4, threads=3):
        try:
            trainer = make_trainer([probe], max_epochs=2, limit_val_batches=1.0, num_sanity_val_steps=0)
            trainer.fit(seeded_module(ds), dm)
        finally:
            dm.shutdown_pipeline()
        threads_after = torch.get_num_threads()
    assert probe.at_validation == [3, 3] and threads_after == 3


def test_multi_threaded_workers_never_fork():
    """OpenMP in a forked child can deadlock once the parent ran parallel kernels: workers with
    more than one thread start from a clean process, and asking to fork them is refused."""
    from lightning_mqgnn.pipeline.workers import choose_start_method

    assert choose_start_method("auto", worker_threads=1) == "fork"
    assert choose_start_method("auto", worker_threads=3) == "forkserver"
    with pytest.raises(ValueError, match="worker_threads=2 with start_method='fork'"):
        choose_start_method("fork", worker_threads=2)
