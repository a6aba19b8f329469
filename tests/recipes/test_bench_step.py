"""The step benchmark splits a real step: GEMM time is found in both loops, and the optimiser's
share stays the optimiser's even though Lightning runs forward and backward inside its step."""

import subprocess
import sys

import pytest
from helpers.paths import REPO


@pytest.mark.slow  # the benchmark end to end, half a minute
def test_step_benchmark_splits_bare_and_trainer_steps(tmp_path):
    out = tmp_path / "step.md"
    cmd = [
        sys.executable,
        str(REPO / "recipes" / "bench.py"),
        "step",
        "--data",
        "generated",
        "--models",
        "sage,gcn",
    ]
    cmd += [
        "--steps",
        "6",
        "--warmup",
        "1",
        "--repeats",
        "2",
        "--extra",
        "data.scale=0.02",
        "--out",
        str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [
        line.split("|")[1:-1]
        for line in out.read_text().splitlines()
        if line.startswith("| sage") or line.startswith("| gcn")
    ]
    assert sorted((r[0].strip(), r[1].strip()) for r in rows) == [
        ("gcn", "bare"),
        ("gcn", "trainer"),
        ("sage", "bare"),
        ("sage", "trainer"),
    ]
    for row in rows:
        pairs = [float(c.strip().rstrip("x")) for c in row[-1].split(",")]
        assert len(pairs) == 2 and min(pairs) > 0
        step, gemm, *_, optimiser, _rest, ratio = (float(c.strip().rstrip("x")) for c in row[2:-1])
        # GEMM time comes from a second, profiled run: on a busy machine it can exceed the first
        # run's median step, though not by half
        assert step > 0 and 0 < gemm < 1.5 * step
        assert 0 < optimiser < 0.5 * step  # Adam on a few parameters, not the closure's whole step
        assert abs(ratio - step / gemm) < 0.02 * ratio


def test_compiled_cpu_loops_count_as_operators(monkeypatch):
    """The fused ReLU + dropout runs no torch operator of its own: its compiled loops (random words
    and the masked ReLU) are counted from their ``mqgnn::`` scope as elementwise work, not left to
    "rest"."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from lightning_mqgnn.models.dropout import ReLUDropout

    monkeypatch.syspath_prepend(str(REPO / "recipes"))
    from benchmarks.step import split_by_category

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        ReLUDropout(0.2, inplace=True)(torch.randn(1024, 256))
    scopes = {e.name: e.self_cpu_time_total * 1e-6 for e in prof.events() if e.name.startswith("mqgnn::")}
    assert set(scopes) == {"mqgnn::relu_dropout"}
    split = split_by_category(prof.events(), cuda=False)
    assert split["elementwise"] >= scopes["mqgnn::relu_dropout"] > 0


def test_the_fused_aggregation_backward_counts_as_aggregation(monkeypatch):
    """The backward of ReLU + dropout fused with the aggregation is one compiled loop: counted from
    its ``mqgnn::`` scope as aggregation, not left to "rest"."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from lightning_mqgnn.models.activated_aggregation import activated_aggregate
    from lightning_mqgnn.models.dropout import ReLUDropout
    from lightning_mqgnn.sampling.batch import Block

    monkeypatch.syspath_prepend(str(REPO / "recipes"))
    from benchmarks.step import split_by_category

    indptr = torch.arange(0, 2049, 2)
    block = Block(1024, 4096, indptr, torch.randint(0, 4096, (2048,)), torch.rand(2048), dst_in_src=True)
    z = torch.randn(4096, 256, requires_grad=True) * 1.0
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        activated_aggregate(block, z, ReLUDropout(0.5, inplace=True)).sum().backward()
    scopes = {e.name: e.self_cpu_time_total * 1e-6 for e in prof.events() if e.name.startswith("mqgnn::")}
    assert set(scopes) == {"mqgnn::relu_dropout", "mqgnn::masked_aggregation_backward"}
    split = split_by_category(prof.events(), cuda=False)
    assert split["aggregation"] >= scopes["mqgnn::masked_aggregation_backward"] > 0
