"""ReLU + dropout on the CPU: our compiled pass against the same mask applied as tensors and
against torch's own dropout, in one process.

    python recipes/bench.py dropout --shape 5725,256 --rates 0.5,0.25,0.2 --repeats 200

Each form runs in place on a fresh copy of one activation (the copy is not timed), the three
forms alternating, in training mode:
- ``torch``: ``F.dropout(torch.relu_(h), p, inplace=True)`` (a Bernoulli draw per element);
- ``tensor mask``: ``random_keep_mask`` into a reused buffer, then ``h.mul_(mask).clamp_min_(0)``
  (the form bfloat16 activations take);
- ``compiled``: ``ReLUDropout(p, inplace=True)``, one compiled pass from the random words.
Cells are the median forward time; the ratios are torch's and the tensor mask's over ours.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.nn import functional as F

from benchmarks._report import machine_header, write_report
from lightning_mqgnn.models.dropout import MaskBuffer, ReLUDropout, mask_bits, random_keep_mask

REPO = Path(__file__).resolve().parents[2]


def forms(p: float) -> dict:
    """The three in-place forms of ReLU + dropout at rate ``p``."""
    buffer = MaskBuffer()
    layer = ReLUDropout(p, inplace=True)

    def tensor_mask(h: torch.Tensor) -> torch.Tensor:
        return h.mul_(random_keep_mask(h.shape, p, buffer=buffer)).clamp_min_(0.0)

    return {
        "torch": lambda h: F.dropout(torch.relu_(h), p, training=True, inplace=True),
        "tensor mask": tensor_mask,
        "compiled": layer,
    }


def time_forms(h0: torch.Tensor, p: float, repeats: int) -> dict[str, float]:
    """Median seconds of each form over ``repeats`` rounds, the forms' order rotating."""
    h = torch.empty_like(h0)
    runs = forms(p)
    times: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for r in range(repeats):
        turn = r % len(names)
        for name in names[turn:] + names[:turn]:
            h.copy_(h0)
            start = time.perf_counter()
            runs[name](h)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.py dropout", description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="5725,256", help="rows,columns of the activation")
    parser.add_argument("--rates", default="0.5,0.25,0.2")
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--out", type=Path, default=REPO / "bench_out" / "dropout.md")
    args = parser.parse_args(argv)
    rows, cols = (int(v) for v in args.shape.split(","))
    h0 = torch.randn(rows, cols, generator=torch.Generator().manual_seed(0))
    table = [
        "| rate p | bits an element | torch ms | tensor mask ms | compiled ms | torch / compiled | tensor mask / compiled |",
        "|---|---|---|---|---|---|---|",
    ]
    torch.manual_seed(0)
    for p in (float(v) for v in args.rates.split(",")):
        t = time_forms(h0, p, args.repeats)
        ms = {k: 1e3 * v for k, v in t.items()}
        table.append(
            f"| {p:g} | {mask_bits(p)} | {ms['torch']:.3f} | {ms['tensor mask']:.3f} | {ms['compiled']:.3f} | "
            f"{t['torch'] / t['compiled']:.2f}x | {t['tensor mask'] / t['compiled']:.2f}x |"
        )
        print(table[-1], flush=True)
    header = machine_header("dropout", argv)
    header.insert(2, f"- activation {rows} x {cols} float32, {torch.get_num_threads()} torch threads")
    write_report("ReLU + dropout forward on the CPU", header, table, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
