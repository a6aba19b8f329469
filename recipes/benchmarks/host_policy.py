"""Which rows a host tier should hold: its static policies against adaptive replacement, replayed on
the rows the recipe's batches read.

    python recipes/bench.py host_policy --data generated:papers100m --scale 0.02 --epochs 8 \\
        --budgets 0.01,0.02,0.05,0.1,0.2 --out docs/benchmarks/host_policy

The host tier (``loader.host_cache_gb``, ``pipeline/host_cache.py``) holds the rows its policy
ranks first, chosen once. An adaptive tier would instead admit every row a batch misses and evict
by recency. Both are judged here by the share of the rows read that the tier holds (its hit rate:
every miss is a row read from the disk), on the same sequence of reads:

1. **Trace**: the training batches of ``--epochs`` epochs as the recipe draws them (``--model``'s
   sampler, ``--batch-size``, each batch seeded as the loader seeds it); a batch reads the feature
   rows of its input nodes, in the sampler's order.
2. **Replay** at each budget (a share of the nodes' rows; the GB it is at this dataset's row size
   beside it), for each policy:

   - ``degree``, ``walk``: the tier's own policies, ranked by ``host_tier_scores`` as the tier
     ranks them.
   - ``hindsight``: the rows this very trace reads most often: the best any static choice can do
     (under independent batches, what a static policy that knew each row's read rate would hold).
   - ``lru``: every miss admitted, the least recently read row evicted.
   - ``clock``: LRU's common approximation (second chance: a read sets a row's bit; the hand
     evicts the first row whose bit is clear, clearing the bits it passes).
   - ``min``: Belady's optimal replacement, which knows every future read (evicts the row read
     again latest, admits a missed row only if it is read again sooner): from a given start, the
     bound of every replacement policy.

   The adaptive policies start from what the shipped tier holds (``walk``'s rows, filled by the
   same one pass) and adapt from there, so ``min`` bounds ``walk``, ``lru`` and ``clock`` for
   certain; the table gives the hit rate over all batches and over the batches after the first
   epoch. For the adaptive ones also the bookkeeping time per batch of the replay itself (one
   thread, no lock, no row copied): a floor under what a tier shared by workers that write it
   would spend.

Measures only; asserts nothing. ``--out DIR`` writes ``host_policy.md``, ``host_policy.json`` (every
budget's per-batch hits) and ``host_policy.png`` (hit rate after the first epoch against the budget).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from numba import njit

from benchmarks._report import machine_header, write_report

STATIC = ("degree", "walk", "hindsight")
ADAPTIVE = ("lru", "clock", "min")
POLICIES = STATIC + ADAPTIVE
START = "walk"  # what the adaptive tiers start holding: the shipped policy's fill


@njit(cache=True)
def lru_hits(
    trace: np.ndarray, offsets: np.ndarray, num_nodes: int, capacity: int, initial: np.ndarray
) -> np.ndarray:
    """Hits per batch of an LRU tier of ``capacity`` rows that starts holding ``initial`` (the
    last as the most recent): a doubly linked list over the nodes (``num_nodes`` is its sentinel:
    after it the most recent, before it the least)."""
    head = num_nodes
    after = np.full(num_nodes + 1, head, np.int64)
    before = np.full(num_nodes + 1, head, np.int64)
    held = np.zeros(num_nodes, np.bool_)
    for v in initial:
        newest = after[head]
        after[v], before[v] = newest, head
        before[newest] = v
        after[head] = v
        held[v] = True
    size = initial.size
    hits = np.zeros(offsets.size - 1, np.int64)
    for b in range(offsets.size - 1):
        for i in range(offsets[b], offsets[b + 1]):
            v = trace[i]
            if held[v]:
                hits[b] += 1
                after[before[v]] = after[v]
                before[after[v]] = before[v]
            elif size == capacity:
                oldest = before[head]
                after[before[oldest]] = head
                before[head] = before[oldest]
                held[oldest] = False
                held[v] = True
            else:
                size += 1
                held[v] = True
            newest = after[head]
            after[v], before[v] = newest, head
            before[newest] = v
            after[head] = v
    return hits


@njit(cache=True)
def clock_hits(
    trace: np.ndarray, offsets: np.ndarray, num_nodes: int, capacity: int, initial: np.ndarray
) -> np.ndarray:
    """Hits per batch of a CLOCK tier of ``capacity`` slots that starts holding ``initial``, in
    slot order, their bits clear (a read sets a slot's bit)."""
    slot_of = np.full(num_nodes, -1, np.int64)
    node_in = np.full(capacity, -1, np.int64)
    referenced = np.zeros(capacity, np.bool_)
    for s, v in enumerate(initial):
        node_in[s], slot_of[v] = v, s
    hand, filled = 0, initial.size
    hits = np.zeros(offsets.size - 1, np.int64)
    for b in range(offsets.size - 1):
        for i in range(offsets[b], offsets[b + 1]):
            v = trace[i]
            s = slot_of[v]
            if s >= 0:
                hits[b] += 1
            elif filled < capacity:
                s = filled
                filled += 1
            else:
                while referenced[hand]:
                    referenced[hand] = False
                    hand = (hand + 1) % capacity
                s = hand
                slot_of[node_in[s]] = -1
                hand = (hand + 1) % capacity
            node_in[s], slot_of[v], referenced[s] = v, s, True
    return hits


@njit(cache=True)
def next_reads(trace: np.ndarray, num_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """For every read, the position of the next read of the same row, and for every row its first
    read (``trace.size``: never)."""
    later = np.empty(trace.size, np.int64)
    first = np.full(num_nodes, trace.size, np.int64)
    for i in range(trace.size - 1, -1, -1):
        later[i] = first[trace[i]]
        first[trace[i]] = i
    return later, first


@njit(cache=True)
def _push(heap: np.ndarray, n: int, item: np.int64) -> int:
    heap[n] = item
    i = n
    while i > 0 and heap[(i - 1) // 2] < heap[i]:
        parent = (i - 1) // 2
        heap[i], heap[parent] = heap[parent], heap[i]
        i = parent
    return n + 1


@njit(cache=True)
def _pop(heap: np.ndarray, n: int) -> int:
    n -= 1
    heap[0] = heap[n]
    i = 0
    while True:
        big, left, right = i, 2 * i + 1, 2 * i + 2
        if left < n and heap[left] > heap[big]:
            big = left
        if right < n and heap[right] > heap[big]:
            big = right
        if big == i:
            return n
        heap[i], heap[big] = heap[big], heap[i]
        i = big


@njit(cache=True)
def min_hits(
    trace: np.ndarray, offsets: np.ndarray, num_nodes: int, capacity: int, initial: np.ndarray
) -> np.ndarray:
    """Hits per batch of Belady's MIN with bypass, starting from ``initial``: a max-heap of ``next
    read * num_nodes + node`` over the held rows, entries made stale by a later read skipped when
    they surface. From a given start no replacement policy hits more often."""
    later, first = next_reads(trace, num_nodes)
    due = np.full(num_nodes, -1, np.int64)  # a held row's next read; -1: not held
    heap = np.empty(trace.size + initial.size + 1, np.int64)
    n, size = 0, initial.size
    for v in initial:
        due[v] = first[v]
        n = _push(heap, n, first[v] * num_nodes + v)
    hits = np.zeros(offsets.size - 1, np.int64)
    for b in range(offsets.size - 1):
        for i in range(offsets[b], offsets[b + 1]):
            v, nxt = trace[i], later[i]
            if due[v] >= 0:
                hits[b] += 1
            elif size < capacity:
                size += 1
            else:
                while due[heap[0] % num_nodes] != heap[0] // num_nodes:
                    n = _pop(heap, n)
                farthest = heap[0]
                if nxt >= farthest // num_nodes:
                    continue  # read again no sooner than every held row: not admitted
                due[farthest % num_nodes] = -1
                n = _pop(heap, n)
            due[v] = nxt
            n = _push(heap, n, nxt * num_nodes + v)
    return hits


def static_hits(trace: np.ndarray, offsets: np.ndarray, held: np.ndarray) -> np.ndarray:
    """Hits per batch of a tier that holds the nodes ``held`` (bool [N]) throughout."""
    return np.add.reduceat(held[trace].astype(np.int64), offsets[:-1])


def top_rows(score: np.ndarray, capacity: int) -> np.ndarray:
    """The ``capacity`` best-scored nodes, the best last (an adaptive tier's most recent)."""
    top = np.argpartition(-score, capacity - 1)[:capacity]
    return top[np.argsort(score[top], kind="stable")]


def as_mask(nodes: np.ndarray, num_nodes: int) -> np.ndarray:
    held = np.zeros(num_nodes, np.bool_)
    held[nodes] = True
    return held


def read_trace(
    dataset, sampler, batch_size: int, epochs: int, seed: int
) -> tuple[np.ndarray, np.ndarray, int]:
    """The rows the batches of ``epochs`` epochs read, concatenated, with each batch's offsets and
    the number of batches in one epoch."""
    from benchmarks.labor import seed_batches
    from lightning_mqgnn.sampling.rng import batch_rng_seed

    per_epoch = -(-dataset.train_idx.numel() // batch_size)
    reads = []
    for epoch, i, seeds in seed_batches(dataset, batch_size, seed, per_epoch * epochs):
        torch.manual_seed(batch_rng_seed(seed, epoch, i))  # as the loader seeds this batch
        reads.append(sampler.sample(seeds).input_nodes.numpy())
    offsets = np.zeros(len(reads) + 1, np.int64)
    np.cumsum([r.size for r in reads], out=offsets[1:])
    return np.concatenate(reads).astype(np.int64), offsets, per_epoch


def replay(
    policy: str, trace, offsets, num_nodes: int, capacity: int, scores: dict
) -> tuple[np.ndarray, float]:
    """Hits per batch of ``policy`` at ``capacity`` rows, and the replay's seconds."""
    if policy in STATIC:
        start = time.perf_counter()
        hits = static_hits(trace, offsets, as_mask(top_rows(scores[policy], capacity), num_nodes))
        return hits, time.perf_counter() - start
    kernel = {"lru": lru_hits, "clock": clock_hits, "min": min_hits}[policy]
    initial = top_rows(scores[START], capacity)  # as the static tier starts: one fill pass
    start = time.perf_counter()
    hits = kernel(trace, offsets, num_nodes, capacity, initial)
    return hits, time.perf_counter() - start


def hit_rates(hits: np.ndarray, offsets: np.ndarray, per_epoch: int) -> tuple[float, float]:
    """Hit rate over every batch, and over the batches after the first epoch."""
    reads = np.diff(offsets)
    later = slice(per_epoch, None) if hits.size > per_epoch else slice(0, None)
    return float(hits.sum() / reads.sum()), float(hits[later].sum() / reads[later].sum())


def measure(dataset, sampler, args) -> dict:
    from lightning_mqgnn.pipeline.host_cache import host_tier_scores, sampler_fanouts

    t0 = time.perf_counter()
    trace, offsets, per_epoch = read_trace(dataset, sampler, args.batch_size, args.epochs, args.seed)
    n = dataset.graph.num_nodes
    fanouts = sampler_fanouts(sampler)
    scores = {p: host_tier_scores(dataset, p, fanouts).numpy() for p in ("degree", "walk")}
    scores["hindsight"] = np.bincount(trace, minlength=n).astype(np.float64)
    trace_s = time.perf_counter() - t0
    warm = offsets[:2].copy()  # compile the kernels on one batch before anything is timed
    for kernel in (lru_hits, clock_hits, min_hits):
        kernel(trace[: warm[1]], warm, n, max(1, int(warm[1]) // 2), trace[:0])
    features = dataset.features
    row_bytes = features[0].numel() * features.element_size()
    budgets = []
    for share in args.budgets:
        capacity = max(1, int(share * n))
        entry = {"share": share, "capacity": capacity, "gb": capacity * row_bytes / 1e9, "policies": {}}
        for policy in args.policies:
            hits, seconds = replay(policy, trace, offsets, n, capacity, scores)
            overall, after_first = hit_rates(hits, offsets, per_epoch)
            entry["policies"][policy] = {
                "hit_rate": overall,
                "hit_rate_after_first_epoch": after_first,
                "us_per_batch": seconds / hits.size * 1e6,
                "hits": hits.tolist(),
            }
        budgets.append(entry)
    return {
        "nodes": n,
        "edges": dataset.graph.num_edges,
        "train_nodes": int(dataset.train_idx.numel()),
        "row_bytes": row_bytes,
        "batches": int(offsets.size - 1),
        "batches_per_epoch": per_epoch,
        "reads_per_batch": float(np.diff(offsets).mean()),
        "distinct_rows_read": int(np.count_nonzero(scores["hindsight"])),
        "trace_s": trace_s,
        "reads": np.diff(offsets).tolist(),
        "budgets": budgets,
    }


def table(run: dict, policies: list[str]) -> list[str]:
    head = "| budget (share of rows, GB) | " + " | ".join(policies) + " |"
    rows = [head, "|" + "---|" * (len(policies) + 1)]
    for b in run["budgets"]:
        cells = [
            f"{b['policies'][p]['hit_rate']:.3f} / {b['policies'][p]['hit_rate_after_first_epoch']:.3f}"
            for p in policies
        ]
        rows.append(f"| {b['share'] * 100:g}% ({b['gb']:.3g} GB) | " + " | ".join(cells) + " |")
    adaptive = [p for p in policies if p in ADAPTIVE]
    if adaptive:
        rows += ["", "Replay bookkeeping per batch (us, one thread, no lock, no row copied):", ""]
        rows += ["| budget | " + " | ".join(adaptive) + " |", "|" + "---|" * (len(adaptive) + 1)]
        for b in run["budgets"]:
            cells = [f"{b['policies'][p]['us_per_batch']:,.0f}" for p in adaptive]
            rows.append(f"| {b['share'] * 100:g}% | " + " | ".join(cells) + " |")
    return rows


def plot(run: dict, policies: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    shares = [b["share"] * 100 for b in run["budgets"]]
    for p in policies:
        ax.plot(
            shares, [b["policies"][p]["hit_rate_after_first_epoch"] for b in run["budgets"]], "o-", label=p
        )
    ax.set_xscale("log")
    ax.set_xlabel("host tier budget (% of the rows)")
    ax.set_ylabel("hit rate after the first epoch")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.py host_policy", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--data", default="generated:papers100m", help="a data config, an .npz or generated:PRESET"
    )
    parser.add_argument("--scale", type=float, default=0.02, help="of a generated:PRESET graph")
    parser.add_argument("--model", default="sage", help="whose sampler draws the batches")
    parser.add_argument("--extra", default="", help="model.* overrides of the sampler, space-separated")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--budgets", default="0.01,0.02,0.05,0.1,0.2", help="shares of the nodes' rows")
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    args.budgets = [float(b) for b in args.budgets.split(",")]
    args.policies = args.policies.split(",")
    unknown = sorted(set(args.policies) - set(POLICIES))
    if unknown:
        parser.error(f"unknown policies {unknown}; choose from {', '.join(POLICIES)}")
    if not all(0 < b <= 1 for b in args.budgets):
        parser.error(f"budgets are shares of the rows in (0, 1], got {args.budgets}")
    if args.epochs < 1:
        parser.error(f"--epochs must be at least 1, got {args.epochs}")

    from benchmarks._baseline import load_dataset
    from benchmarks.labor import sampler_config

    dataset = load_dataset(args.data, scale=args.scale, seed=args.seed)
    sampler = sampler_config(args.model, args.extra.split())(dataset.graph)
    run = measure(dataset, sampler, args)
    header = machine_header("host_policy", argv)
    header += [
        f"- graph: {args.data} ({run['nodes']:,} nodes, {run['edges']:,} edges, {run['train_nodes']:,} "
        f"training nodes, rows of {run['row_bytes']} bytes); {args.model} batches of {args.batch_size}, "
        f"{args.epochs} epoch(s) = {run['batches']} batches ({run['batches_per_epoch']} an epoch), "
        f"{run['reads_per_batch']:,.0f} rows read a batch, {run['distinct_rows_read']:,} distinct rows "
        f"read in all (trace drawn in {run['trace_s']:.0f} s)",
        "- cells: hit rate over all batches / after the first epoch",
    ]
    out = args.out / "host_policy.md" if args.out else None
    write_report("Host tier policies replayed on the batches' reads", header, table(run, args.policies), out)
    if args.out:
        (args.out / "host_policy.json").write_text(
            json.dumps({"args": vars(args) | {"out": str(args.out)}, **run})
        )
        plot(run, args.policies, args.out / "host_policy.png")
    return 0
