"""Sampler speed on a generated graph of >= 1M nodes, and GNS's feature-gather savings.

For every sampler: seeds per second over the same random training batches. For the eight
layer-wise variants also a straightforward scipy.sparse implementation of the same algorithm in the
style of Chen et al.'s reference code (``L[prev, :]``, ``np.random.choice(N, s, replace=False,
p=p)``, ``U[:, S].multiply(w)``, the O(s²) debias loop), run in the same script on the same graph;
the ratio is ours / scipy seeds per second. GNS: bytes of feature rows gathered from host memory per
batch with the 1% cache (only uncached rows) against the plain node-wise sampler (all input rows).
Measures only; asserts nothing about timings.

    python recipes/benchmarks/samplers.py --nodes 1000000 --batch-size 512 --out samplers.md
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections.abc import Callable

import numpy as np
import scipy.sparse as sp
import torch

from lightning_mqgnn.graph.csr import CSRGraph
from lightning_mqgnn.sampling.exact import edge_weights
from lightning_mqgnn.sampling.fastgcn import FastGCNSampler
from lightning_mqgnn.sampling.feature_cache import GNSCache
from lightning_mqgnn.sampling.gns import GNSSampler
from lightning_mqgnn.sampling.ladies import LADIESSampler
from lightning_mqgnn.sampling.neighbor import NeighborSampler

VARIANTS = [
    (fam, flat, debias) for fam in ("fastgcn", "ladies") for flat in (False, True) for debias in (False, True)
]


def variant_name(fam: str, flat: bool, debias: bool) -> str:
    suffix = ("f" if flat else "") + ("d" if debias else "")
    return fam + (f"_{suffix}" if suffix else "")


def build_graph(num_nodes: int, mean_degree: float, seed: int) -> tuple[CSRGraph, torch.Tensor, int]:
    """A products-shaped power-law graph (``generate_graph``), with its training split."""
    from lightning_mqgnn.graph.generated import generate_graph

    ds = generate_graph("products", num_nodes=num_nodes, mean_degree=mean_degree, seed=seed)
    return ds.graph, ds.train_idx, ds.num_features


# ---- the scipy reference (Chen et al.'s style), for the ratio ------------------------------------


def scipy_laplacian(graph: CSRGraph) -> sp.csr_matrix:
    w, self_w = edge_weights(graph, "gcn")
    n = graph.num_nodes
    a = sp.csr_matrix(
        (w.numpy().astype(np.float64), graph.indices.numpy(), graph.indptr.numpy()), shape=(n, n)
    )
    return (a + sp.diags(self_w.numpy().astype(np.float64))).tocsr()


def scipy_est_wrs_weights(p_sel: np.ndarray, n: int) -> np.ndarray:
    """Chen et al.'s ``estWRS_weights`` recursion over the drawn probabilities, O(m²)."""
    m = p_sel.shape[0]
    w = np.zeros(m)
    mass = 0.0
    for k in range(m):
        a = n / ((k + 1) * (n - k))
        w[k] = a * max(1.0 - mass, 0.0) / p_sel[k]
        w[:k] = w[:k] * (1 - a) + a
        mass += p_sel[k]
    return w


def scipy_sampler(lap: sp.csr_matrix, samples: list[int], fam: str, flat: bool, debias: bool) -> Callable:
    n = lap.shape[0]
    global_p = None
    if fam == "fastgcn":
        pi = np.asarray(lap.multiply(lap).sum(0)).ravel()
        pi = np.sqrt(pi) if flat else pi
        global_p = pi / pi.sum()

    def sample(seeds: np.ndarray) -> list[sp.csr_matrix]:
        prev, adjs = seeds, []
        for s in reversed(samples):
            u = lap[prev, :]
            if global_p is None:
                pi = np.asarray(u.multiply(u).sum(0)).ravel()
                pi = np.sqrt(pi) if flat else pi
                p = pi / pi.sum()
            else:
                p = global_p
            s = min(np.count_nonzero(p), s)
            after = np.random.choice(n, s, replace=False, p=p)
            w = scipy_est_wrs_weights(p[after], n) if debias else 1.0 / (s * p[after])
            adjs.append(u[:, after].multiply(w).tocsr())
            prev = after
        return adjs[::-1]

    return sample


# ---- timing ---------------------------------------------------------------------------------------


def seeds_per_second(sample: Callable, batches: list, warmup: int = 1) -> float:
    for b in batches[:warmup]:
        sample(b)
    t0 = time.perf_counter()
    for b in batches[warmup:]:
        sample(b)
    return sum(len(b) for b in batches[warmup:]) / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1_000_000)
    ap.add_argument("--degree", type=float, default=50.5, help="mean degree (products: 50.5)")
    ap.add_argument("--batch-size", type=int, default=512)
    ap.add_argument("--batches", type=int, default=20, help="timed batches per sampler (ours)")
    ap.add_argument("--scipy-batches", type=int, default=5, help="timed batches per scipy reference")
    ap.add_argument("--rounds", type=int, default=3, help="alternating ours/scipy timings per variant")
    ap.add_argument("--samples", type=int, nargs="+", default=[1024, 512], help="input layer first")
    ap.add_argument("--fanouts", type=int, nargs="+", default=[5, 5], help="node-wise, input layer first")
    ap.add_argument("--cache-fraction", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--threads", type=int, default=1, help="torch threads (1: as a sampler worker runs; scipy is serial)"
    )
    ap.add_argument(
        "--variants",
        nargs="+",
        default=None,
        help="layer-wise variants to time, e.g. ladies_f (default: all)",
    )
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    known = [variant_name(*v) for v in VARIANTS]
    unknown = sorted(set(args.variants or []) - set(known))
    if unknown:
        ap.error(f"--variants: unknown {unknown}; choose from {known}")

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    t0 = time.perf_counter()
    graph, train_idx, num_features = build_graph(args.nodes, args.degree, args.seed)
    build_s = time.perf_counter() - t0
    print(f"graph: {graph.num_nodes:,} nodes, {graph.num_edges:,} edges, built in {build_s:.0f}s", flush=True)
    gen = torch.Generator().manual_seed(args.seed + 1)
    order = train_idx[torch.randperm(train_idx.numel(), generator=gen)]
    n_batches = max(args.batches, args.scipy_batches) + 1
    batches = [order[i * args.batch_size : (i + 1) * args.batch_size] for i in range(n_batches)]
    ours_batches = batches[: args.batches + 1]
    ref_batches = [b.numpy() for b in batches[: args.scipy_batches + 1]]

    rows = []
    ns = NeighborSampler(graph, args.fanouts, aggregation="gcn")
    rows.append(("neighbor (gcn)", seeds_per_second(ns.sample, ours_batches), None))
    print(rows[-1], flush=True)
    cache = GNSCache(graph, train_idx, fraction=args.cache_fraction, fanouts=args.fanouts)
    gns = GNSSampler(graph, args.fanouts, cache, aggregation="mean")
    rows.append(("gns (mean, 1% cache)", seeds_per_second(gns.sample, ours_batches), None))
    print(rows[-1], flush=True)

    lap = scipy_laplacian(graph)
    ratio_ranges = {}
    for fam, flat, debias in VARIANTS:
        if args.variants and variant_name(fam, flat, debias) not in args.variants:
            continue
        cls = FastGCNSampler if fam == "fastgcn" else LADIESSampler
        sample = cls(graph, args.samples, flat=flat, debias=debias).sample
        reference = scipy_sampler(lap, args.samples, fam, flat, debias)
        # rounds alternate ours and scipy, so a slow spell of a shared machine hits both
        pairs = [
            (seeds_per_second(sample, ours_batches), seeds_per_second(reference, ref_batches))
            for _ in range(args.rounds)
        ]
        name = variant_name(fam, flat, debias)
        ratios = sorted(o / r for o, r in pairs)
        ratio_ranges[name] = (ratios[0], ratios[-1])
        rows.append((name, float(np.median([o for o, _ in pairs])), float(np.median([r for _, r in pairs]))))
        print(rows[-1], f"ratios per round {[round(x, 1) for x in ratios]}", flush=True)

    # GNS: feature bytes gathered per batch, with the cache (uncached rows) vs plain node-wise
    row_bytes = num_features * 4
    plain_mean = NeighborSampler(graph, args.fanouts, aggregation="mean")
    plain_rows = gns_rows = gns_inputs = hits = 0
    for b in ours_batches:
        plain_rows += plain_mean.sample(b).input_nodes.numel()
        mb = gns.sample(b)
        cached = int((cache.slot[mb.input_nodes] >= 0).sum())
        gns_inputs += mb.input_nodes.numel()
        gns_rows += mb.input_nodes.numel() - cached
        hits += cached

    lines = [
        f"Sampler throughput: generated products-shaped graph, {graph.num_nodes:,} nodes, "
        f"{graph.num_edges:,} directed edges; batch {args.batch_size}; layer-wise samples "
        f"{args.samples} (input layer first); node-wise fan-outs {args.fanouts}; "
        f"{torch.get_num_threads()} torch threads; {platform.processor() or platform.machine()}.",
        "",
        f"Layer-wise rows: medians over {args.rounds} rounds, each timing ours on {args.batches} batches then "
        f"scipy on {args.scipy_batches}; the last column is the range of the per-round ratios.",
        "",
        "| sampler | ours (seeds/s) | scipy reference (seeds/s) | ours / scipy (medians) | per-round ratios |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, ours, ref in rows:
        ref_s = f"{ref:,.0f}" if ref is not None else "–"
        ratio = f"{ours / ref:.1f}x" if ref is not None else "–"
        low, high = ratio_ranges.get(name, (None, None))
        spread = f"{low:.1f}x-{high:.1f}x" if low is not None else "–"
        lines.append(f"| {name} | {ours:,.0f} | {ref_s} | {ratio} | {spread} |")
    nb = len(ours_batches)
    lines += [
        "",
        f"GNS feature gather ({args.cache_fraction:.0%} cache, {cache.rule} rule, {num_features} float32 "
        f"features): per batch {plain_rows / nb:,.0f} input rows ({plain_rows * row_bytes / nb / 2**20:.2f} MiB) "
        f"gathered by the plain node-wise sampler vs {gns_rows / nb:,.0f} uncached of {gns_inputs / nb:,.0f} "
        f"input rows ({gns_rows * row_bytes / nb / 2**20:.2f} MiB) with GNS: fraction of bytes "
        f"{gns_rows / plain_rows:.3f}; cache hit rate {hits / gns_inputs:.3f}.",
        "",
        "Command: `python recipes/benchmarks/samplers.py "
        + " ".join(argv if argv is not None else sys.argv[1:])
        + "`",
    ]
    table = "\n".join(lines)
    print(table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table + "\n")
    return table


if __name__ == "__main__":
    main()
