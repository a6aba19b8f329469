"""An on-disk dataset against the same dataset in memory: the converter, and the batch rate from a
warm and from a cold page cache.

    python recipes/bench.py ondisk --data products_like_1m --folder /tmp/mqgnn-ondisk/products_like_1m

A graph larger than the memory, converted once (``--existing`` skips the conversion; no
in-memory run, which could not hold it), trained from a cold page cache with the mapped pages
bounded and no validation:

    python recipes/bench.py ondisk --data papers100m_like --folder /data/papers_x056 --existing \
        --no-memory --caches cold --loaders pipeline \
        --overrides "data.resident_gb=2 +trainer.limit_val_batches=0" --models sage,sage_gns

1. **Convert**: ``recipes/convert.py data=<--data> out=<--folder>`` (a generated graph is written
   as it is drawn), once per ``--features-dtypes`` entry: its one line (MB, seconds, MB/s, peak
   RSS).
2. **Train**, one fresh process per run, one at a time (a timing: run it on a quiet machine), for
   each ``--loaders`` entry: ``data=<--data>`` in memory; for each features dtype, ``data=ondisk`` with a **warm** page
   cache (every file read once just before); and **cold** (every file's pages dropped from the
   page cache first, ``posix_fadvise(DONTNEED)``, which needs no privileges); ``topology`` drops
   them and reads the topology's files (a graph whose edges fit in the page cache, its features
   not). Each fit is
   ``--epochs`` epochs with one validation per epoch and no test. Reported per run: batches per
   second (training time only), the batch time, the training process's peak RSS (``VmHWM``),
   the MB the machine read from its disks during the run (``/sys/block/*/stat``: sampler
   workers, the validation pass, which reads every feature row, and the setup's passes over the
   files, such as a host tier's fill, included), the metrics, which must agree between memory
   and disk (the same batches), and the share of the rows read that the GNS cache and the host
   tier (``loader.host_cache_gb``) held. Memory: the training process's peak RSS, and the peak
   of the PSS of it and its sampler workers summed (``tree_pss_mb``), which counts once the
   pages they share.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks._recipe import fixed_epochs_overrides, result_fields
from benchmarks._report import machine_header, write_report
from benchmarks.tta import high_water_mb, run_process, tree_pss_mb

RECIPES = Path(__file__).resolve().parents[1]
SECTOR = 512  # the block layer's stat files count 512-byte sectors whatever the device's block size


def disk_read_bytes() -> int:
    """Bytes read from the machine's disks since boot: ``/sys/block/<disk>/stat`` (whole disks,
    not partitions; loop, ram and device-mapper devices skipped: they sit on the disks)."""
    total = 0
    for stat in Path("/sys/block").glob("*/stat"):
        if not stat.parent.name.startswith(("loop", "ram", "zram", "dm-")):
            total += int(stat.read_text().split()[2]) * SECTOR
    return total


CACHE_STATES = ("warm", "cold", "topology")
TOPOLOGY_FILES = ("indptr.npy", "indices.npy")


def set_page_cache(folder: Path, state: str) -> None:
    """Read every file of ``folder`` (``warm``), drop its pages from the page cache (``cold``), or
    drop them and read the topology's files (``topology``: the regime of a graph whose edges fit
    in the page cache and whose features do not)."""
    if state not in CACHE_STATES:
        raise ValueError(f"page cache state must be one of {CACHE_STATES}, got {state!r}")
    for path in sorted(folder.iterdir()):
        with open(path, "rb") as f:
            if state == "warm" or (state == "topology" and path.name in TOPOLOGY_FILES):
                while f.read(64 << 20):
                    pass
            else:
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def convert(data: str, folder: Path, features_dtype: str = "float32") -> str:
    cmd = [
        sys.executable,
        str(RECIPES / "convert.py"),
        f"data={data}",
        f"out={folder}",
        "overwrite=true",
        f"features_dtype={features_dtype}",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"convert failed: {proc.stderr.strip()[-2000:]}")
    return proc.stdout.strip().splitlines()[-1]


def fit(data_overrides: list[str], loader: str, epochs: int, extra: list[str] = ()) -> dict:
    with tempfile.TemporaryDirectory(prefix="mqgnn-ondisk-") as run_dir:
        cmd = [
            sys.executable,
            str(RECIPES / "train.py"),
            *data_overrides,
            f"loader={loader}",
            *fixed_epochs_overrides(epochs),
            "test=false",
            f"hydra.run.dir={run_dir}",
            *extra,
        ]
        before = disk_read_bytes()
        start = time.perf_counter()
        main_peak = [0.0]

        def footprint(pid: int) -> float:  # the whole run's PSS; the training process's own peak beside it
            main_peak[0] = max(main_peak[0], high_water_mb(pid))
            return tree_pss_mb(pid)

        rc, stdout, stderr, pss = run_process(cmd, 3 * 3600, peak=footprint)
        wall = time.perf_counter() - start
        read = disk_read_bytes() - before
    fields = result_fields(stdout)
    if rc != 0 or fields is None:
        raise RuntimeError(f"fit failed ({rc}): {stderr.strip()[-2000:]}")
    batches = int(fields["batches"])
    return dict(
        batches=batches,
        batches_per_s=batches / float(fields["train_time_s"]),
        batch_ms=float(fields["batch_time_ms"]),
        peak_rss_mb=main_peak[0],
        peak_pss_mb=pss,
        read_mb=read / 1e6,
        wall_s=wall,
        val=fields["val"],
        epoch_s=float(fields["train_time_s"]) / epochs,
        rows=float(fields["feature_rows_per_batch"]),
        row_mb=float(fields["feature_mb_per_batch"]),
        cache_hit_rate=fields.get("cache_hit_rate", "-"),
        host_hit_rate=fields.get("host_cache_hit_rate", "-"),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.py ondisk", description=__doc__)
    parser.add_argument("--data", default="products_like_1m")
    parser.add_argument(
        "--folder", type=Path, help="where the converted dataset goes (default: a temporary folder)"
    )
    parser.add_argument("--existing", action="store_true", help="--folder holds it already: no conversion")
    parser.add_argument("--no-memory", action="store_true", help="no in-memory run (it would not fit)")
    parser.add_argument(
        "--caches", default="warm,cold", help="page cache states of the on-disk runs: warm, cold, topology"
    )
    parser.add_argument("--loaders", default="sequential,pipeline")
    parser.add_argument("--models", default="sage")
    parser.add_argument(
        "--features-dtypes",
        default="float32",
        help="dtypes the features are stored in on disk, each its own folder: --folder for float32, "
        "<--folder>_<dtype> for the others",
    )
    parser.add_argument("--overrides", default="", help="more recipe overrides of the on-disk runs")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.existing and args.folder is None:
        parser.error("--existing needs --folder")
    extra = args.overrides.split()
    dtypes = args.features_dtypes.split(",")
    with tempfile.TemporaryDirectory(prefix="mqgnn-ondisk-data-") as scratch:
        base = args.folder or Path(scratch) / args.data
        folders = {d: base if d == "float32" else base.with_name(f"{base.name}_{d}") for d in dtypes}
        converted = []
        for dtype, folder in folders.items():
            line = f"{folder}, converted before" if args.existing else convert(args.data, folder, dtype)
            converted.append(line)
            print(line, flush=True)
        rows = [
            "| model | loader | data | features | page cache | epoch s | batches / s | vs in memory "
            "| batch ms | peak RSS MB | peak PSS MB, all processes | MB read from disk | MB read per batch "
            "| feature rows (MB) per batch | GNS cache hit rate | host tier hit rate | val |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for model in args.models.split(","):
            for loader in args.loaders.split(","):
                runs, memory = [], None
                if not args.no_memory:
                    memory = fit([f"data={args.data}", f"model={model}"], loader, args.epochs)
                    runs.append(("in memory", "float32", "-", memory))
                for dtype, folder in folders.items():
                    for cache in args.caches.split(","):
                        set_page_cache(folder, cache)
                        on_disk = ["data=ondisk", f"data.path={folder}", f"model={model}"]
                        runs.append(("on disk", dtype, cache, fit(on_disk, loader, args.epochs, extra)))
                for where, dtype, cache, r in runs:
                    ratio = f"{r['batches_per_s'] / memory['batches_per_s']:.2f}x" if memory else "-"
                    rows.append(
                        f"| {model} | {loader} | {where} | {dtype} | {cache} | {r['epoch_s']:.1f} | "
                        f"{r['batches_per_s']:.2f} | {ratio} | {r['batch_ms']:.1f} | "
                        f"{r['peak_rss_mb']:,.0f} | {r['peak_pss_mb']:,.0f} | {r['read_mb']:,.0f} | "
                        f"{r['read_mb'] / r['batches']:.2f} | "
                        f"{r['rows']:,.0f} ({r['row_mb']:.2f}) | {r['cache_hit_rate']} | {r['host_hit_rate']} | {r['val']} |"
                    )
                    print(rows[-1], flush=True)
    write_report(
        f"On disk against in memory ({args.data})",
        [*machine_header("ondisk", argv), *(f"- convert: {line}" for line in converted)],
        rows,
        args.out,
    )
    return 0
