"""Sampler speed on a generated graph of >= 1M nodes, and GNS's feature-gather savings.

For every sampler: seeds per second over the same random training batches. For the eight
layer-wise variants also a straightforward scipy.sparse implementation of the same algorithm in the
style of Chen et al.'s reference code (``L[prev, :]``, ``np.random.choice(N, s, replace=False,
p=p)``, ``U[:, S].multiply(w)``, the O(s²) debias loop), run in the same script on the same graph;
the ratio is ours / scipy seeds per second. GNS: bytes of feature rows gathered from host memory per
batch with the 1% cache (only uncached rows) against the plain node-wise sampler (all input rows).
Measures only; asserts nothing about timings.

    python recipes/bench.py samplers --nodes 1000000 --batches 40 --scipy-batches 8 --rounds 3 \
        --out docs/benchmarks/samplers

``--out DIR`` writes ``samplers.md`` (the table with command, commit and machine), ``samplers.json``
(the run) and ``samplers.png`` (ours against the reference per sampler, log scale); ``--replot``
redraws the PNG from the ``samplers.json`` already in DIR and runs nothing.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import scipy.sparse as sp
import torch

from benchmarks._report import machine_header
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


def plot(rows: list[dict], out: Path) -> None:
    """``samplers.png``: seeds per second of ours and of the scipy reference per sampler (log
    scale), each layer-wise pair labelled with its median ratio and per-round range."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["sampler"] for r in rows]
    xs = range(len(rows))
    fig, ax = plt.subplots(figsize=(max(7, 0.9 * len(rows)), 4.5))
    width = 0.4
    ax.bar([x - width / 2 for x in xs], [r["ours"] for r in rows], width, label="ours (1 torch thread)")
    ax.bar(
        [x + width / 2 for x in xs],
        [r["scipy"] if r["scipy"] is not None else float("nan") for r in rows],
        width,
        label="scipy reference (serial)",
    )
    for x, r in zip(xs, rows):
        if r["scipy"] is not None:
            ax.annotate(
                f"{r['ours'] / r['scipy']:.1f}x\n({r['ratio_low']:.1f}-{r['ratio_high']:.1f})",
                (x, max(r["ours"], r["scipy"])),
                textcoords="offset points",
                xytext=(0, 3),
                ha="center",
                fontsize=7,
            )
    ax.set_yscale("log")
    values = [v for r in rows for v in (r["ours"], r["scipy"]) if v is not None]
    ax.set_ylim(min(values) / 3, max(values) * 6)
    ax.set_xticks(list(xs))
    ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("seeds per second (log scale)")
    ax.set_title("sampler throughput: ours vs the scipy reference (median ratio, per-round range)")
    ax.legend(fontsize=8, loc="upper left", ncol=2)
    fig.tight_layout()
    fig.savefig(out / "samplers.png", dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> str | int:
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
    ap.add_argument(
        "--out", type=Path, default=None, help="folder for samplers.md, samplers.json and samplers.png"
    )
    ap.add_argument(
        "--replot", action="store_true", help="redraw samplers.png from --out/samplers.json; runs nothing"
    )
    args = ap.parse_args(argv)
    if args.replot:
        saved = args.out / "samplers.json" if args.out is not None else None
        if saved is None or not saved.is_file():
            ap.error(f"--replot: {saved or 'no --out'}: samplers.json does not exist (run with --out first)")
        plot(json.loads(saved.read_text())["rows"], args.out)
        print(f"wrote {args.out / 'samplers.png'} from {saved}")
        return 0
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
    if n_batches * args.batch_size > order.numel():
        ap.error(
            f"the training split has {order.numel():,} nodes, fewer than the {n_batches} batches "
            f"(one warm-up) of --batch-size {args.batch_size} need; use more --nodes or fewer --batches"
        )
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
    ]
    table = "\n".join([*machine_header("samplers", argv), "", *lines])
    print(table)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "samplers.md").write_text(table + "\n")
        result = {
            "graph": {"nodes": graph.num_nodes, "edges": graph.num_edges, "features": num_features},
            "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "rows": [
                {
                    "sampler": name,
                    "ours": ours,
                    "scipy": ref,
                    "ratio_low": ratio_ranges.get(name, (None, None))[0],
                    "ratio_high": ratio_ranges.get(name, (None, None))[1],
                }
                for name, ours, ref in rows
            ],
            "gns": {
                "plain_rows_per_batch": plain_rows / nb,
                "gns_uncached_rows_per_batch": gns_rows / nb,
                "gns_input_rows_per_batch": gns_inputs / nb,
                "bytes_fraction": gns_rows / plain_rows,
                "hit_rate": hits / gns_inputs,
            },
        }
        (args.out / "samplers.json").write_text(json.dumps(result, indent=1))
        plot(result["rows"], args.out)
    return table


if __name__ == "__main__":
    main()
