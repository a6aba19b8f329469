"""GNNPipe through Lightning on 4 forked CPU processes (gloo): with one chunk per partition there is
no history, so it must train exactly like one process; with chunks it reads history rows of bounded
age and still learns; the hybrid (2 ways x 2 stages) too, reading the rows of the other partition's
chunks fresh once they passed."""

from __future__ import annotations

import json

import helpers.fullgraph_ranks as ranks
import lightning.pytorch as pl
import pytest
import torch

from lightning_mqgnn.fullgraph import FullGraphDataModule, FullGraphNodeClassifier, GNNPipeStrategy
from lightning_mqgnn.sampling.exact import exact_operator, full_block

pytestmark = pytest.mark.distributed

LAYERS = 8


def gcnii(ds, dropout: float = 0.0, layers: int = LAYERS) -> FullGraphNodeClassifier:
    torch.manual_seed(0)
    return FullGraphNodeClassifier(
        ds.num_features, ds.num_classes, conv="gcnii", hidden=16, num_layers=layers, dropout=dropout, lr=1e-2
    )


class Report(pl.Callback):
    """Each rank writes its strategy's figures to ``directory`` (the ranks are child processes)."""

    def __init__(self, directory):
        self.directory = directory

    def on_train_end(self, trainer, pl_module):
        s = trainer.strategy
        stale = s.pipeline.staleness
        report = dict(
            losses=s.epoch_losses,
            bytes=s.epoch_bytes,
            reads=stale.reads,
            stale=stale.stale,
            max_age=stale.max_age,
            halo_reads=stale.halo_reads,
            halo_stale=stale.halo_stale,
            val=float(trainer.callback_metrics.get("val/metric", float("nan"))),
        )
        (self.directory / f"rank{trainer.global_rank}.json").write_text(json.dumps(report))


def reports(directory) -> list[dict]:
    return [json.loads((directory / f"rank{r}.json").read_text()) for r in range(ranks.WORLD)]


def fit(strategy, epochs: int, tmp_path, dropout: float = 0.0, layers: int = LAYERS, **trainer_kwargs):
    ds = ranks.small_dataset()
    model = gcnii(ds, dropout, layers)
    trainer = ranks.quiet_trainer(strategy, epochs, callbacks=[Report(tmp_path)], **trainer_kwargs)
    trainer.fit(model, datamodule=FullGraphDataModule(ds, aggregation=model.aggregation))
    return model, reports(tmp_path)


def reference_run(
    steps: int, stages: int = 4, layers: int = LAYERS
) -> tuple[list[float], list[torch.Tensor], list[list[int]]]:
    """Single-process full-graph GCNII of ``layers`` layers: the losses of ``steps`` Adam steps,
    the weights after, and per step the non-zero entries of the rows that ``stages`` equal layer
    stages would send on."""
    ds = ranks.small_dataset()
    model = gcnii(ds, layers=layers)
    block, _ = full_block(ds.graph, torch.arange(ds.num_nodes), exact_operator(ds.graph, "gcn"))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    stack = model.stack
    per_stage = stack.num_convs // stages
    losses, nonzeros = [], []
    for _ in range(steps):
        h0 = h = stack.embed(ds.features)
        nonzeros.append([])
        for i in range(stack.num_convs):
            h = stack.conv(i, block, h, h0)
            if (i + 1) % per_stage == 0 and i + 1 < stack.num_convs:
                nonzeros[-1].append(int((h != 0).sum()))
        loss = torch.nn.functional.cross_entropy(stack.head(h)[ds.train_idx], ds.labels[ds.train_idx])
        losses.append(float(loss.detach()))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return losses, [p.detach() for p in model.parameters()], nonzeros


@pytest.mark.parametrize("recompute", [True, False])
def test_one_chunk_per_stage_trains_like_one_process(recompute, tmp_path):
    """4 stages, one chunk: no history is read, so the pipeline is the single-process model cut
    into 4 pieces, and its weights after 3 steps match single-process training, whether the
    backward recomputes each chunk's forward or keeps it."""
    strategy = GNNPipeStrategy(num_chunks=1, recompute=recompute, start_method="fork")
    model, got = fit(strategy, 3, tmp_path, limit_val_batches=0)
    losses, weights, nonzeros = reference_run(3)
    for p, expected in zip(model.parameters(), weights):
        torch.testing.assert_close(p.detach(), expected, rtol=1e-4, atol=1e-5)
    # 3 stage boundaries, all 240 rows 16 wide: forward a bitmap (1 bit an entry) and the non-zero
    # float32 entries, back the gradients of those entries; epoch 0 adds the warm-up's forward
    # (dropout 0: the same rows as the first step's)
    bitmaps = 3 * 240 * 16 // 8
    sent = [bitmaps + 2 * 4 * sum(n) for n in nonzeros]
    sent[0] += bitmaps + 4 * sum(nonzeros[0])
    for rank in got:
        assert rank["losses"] == pytest.approx(losses, rel=1e-5)
        assert rank["reads"] == 0
        assert rank["bytes"] == pytest.approx(sent, abs=8 * 3)  # a few entries at ReLU's edge may differ
        assert max(rank["bytes"][1:]) < 2 * 3 * 240 * 16 * 4  # fewer than dense rows and gradients


@pytest.mark.parametrize(("stages", "chunks"), [(2, 1), (4, 4)])
def test_first_forward_is_exact(stages, chunks, tmp_path):
    """The warm-up's exact forward (chunk by chunk) fills the history exactly, so the first
    epoch's loss is the single-process loss; later ones read rows one epoch old: the halo rows of
    the hybrid (2 ways x 2 stages, one chunk each: the other partition's chunk passes at the same
    position, after the read), other chunks' rows of 4 stages with 4 chunks each."""
    _, got = fit(
        GNNPipeStrategy(stages=stages, num_chunks=chunks, start_method="fork"),
        2,
        tmp_path,
        limit_val_batches=0,
    )
    losses, _, _ = reference_run(2)
    assert got[0]["losses"][0] == pytest.approx(losses[0], rel=1e-5)
    assert got[0]["losses"][1] != pytest.approx(losses[1], rel=1e-5)
    assert max(r["max_age"] for r in got) == 1


@pytest.mark.parametrize(("stages", "layers"), [(4, 4), (2, 2)])
def test_complete_gradients_make_the_first_step_exact(stages, layers, tmp_path):
    """The first epoch's forward reads the warm-up's exact rows, so where a stage has one history
    layer, every gradient taken in its chunk's turn (the gathering pass first) makes the first
    step single-process training's: one convolution per stage, 4 stages of 4 chunks, and the
    hybrid (2 ways x 2 stages, 2 chunks each). The paper's one backward leaves the gradients of
    the rows read after their chunk's turn for the next epoch, so its first step differs."""
    _, expected, _ = reference_run(1, stages, layers)
    for complete in (True, False):
        directory = tmp_path / str(complete)
        directory.mkdir()
        strategy = GNNPipeStrategy(
            stages=stages, num_chunks=stages, complete_gradients=complete, start_method="fork"
        )
        model, _ = fit(strategy, 1, directory, layers=layers, limit_val_batches=0)
        close = [
            torch.allclose(p.detach(), w, rtol=1e-4, atol=1e-5) for p, w in zip(model.parameters(), expected)
        ]
        assert all(close) == complete, (complete, close)


@pytest.mark.parametrize("stages", [4, 2])
def test_chunked_pipeline_learns_with_bounded_staleness(stages, tmp_path):
    strategy = GNNPipeStrategy(stages=stages, num_chunks=4, start_method="fork")
    _, got = fit(strategy, 12, tmp_path, dropout=0.1)
    assert got[0]["val"] > 0.4  # 4 classes
    reads = sum(r["reads"] for r in got)
    stale = sum(r["stale"] for r in got)
    assert 0 < stale < reads
    assert max(r["max_age"] for r in got) == 1
    assert got[0]["losses"][-1] < got[0]["losses"][0]
    halo_reads = sum(r["halo_reads"] for r in got)
    halo_stale = sum(r["halo_stale"] for r in got)
    if stages == 2:  # the hybrid: a peer's rows are fresh once its chunk at an earlier position passed
        assert 0 < halo_stale < halo_reads
    else:
        assert halo_reads == 0
