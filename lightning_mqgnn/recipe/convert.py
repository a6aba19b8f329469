"""Write a dataset to disk: ``mqgnn-convert data=products_like_1m out=/data/products_1m`` (from a
clone: ``python recipes/convert.py ...``).

``features_dtype=float16`` (or ``bfloat16``) stores the features in half the bytes; training
widens the rows it reads to float32 (``lightning_mqgnn.graph.feature_dtypes``).

Loads what ``mqgnn-train data=<same>`` trains on (any data config: generated, npz, OGB,
named) and writes it in the on-disk layout (``lightning_mqgnn.graph.ondisk``); ``mqgnn-train
data=ondisk data.path=<out>`` then trains on it memory-mapped. A generated graph (``data=generated``
and the ``*_like`` configs) is written as it is drawn (``write_generated_graph``): its feature
matrix is never in memory. Prints one line: what was written, how fast (loading or generating
included), and the peak memory. Bad input or a full disk: one ``error:`` line, exit code 2 or 1,
and no folder left behind.
"""

from __future__ import annotations

import resource
import sys
import time

import hydra
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from lightning_mqgnn.graph.feature_dtypes import check_feature_dtype
from lightning_mqgnn.graph.generated import write_generated_graph
from lightning_mqgnn.graph.ondisk import Manifest, OnDiskError, open_dataset, write_dataset
from lightning_mqgnn.recipe import CONF
from lightning_mqgnn.recipe.train import config_error_line, exit_on_unknown_config_names

GENERATED = "lightning_mqgnn.graph.generated.generate_graph"


def convert(cfg: DictConfig) -> str:
    start = time.perf_counter()
    dtype = str(cfg.features_dtype)
    check_feature_dtype(dtype, "features_dtype")  # before a dataset is loaded or drawn
    if cfg.data.get("_target_") == GENERATED:
        arguments = {
            k: v for k, v in OmegaConf.to_container(cfg.data, resolve=True).items() if k != "_target_"
        }
        folder = write_generated_graph(
            cfg.out, overwrite=bool(cfg.overwrite), features_dtype=dtype, **arguments
        )
    else:
        folder = write_dataset(
            instantiate(cfg.data), cfg.out, overwrite=bool(cfg.overwrite), features_dtype=dtype
        )
    seconds = time.perf_counter() - start
    megabytes = sum(a.nbytes for a in Manifest.read(folder).arrays.values()) / 1e6
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return (
        f"wrote {open_dataset(folder).summary()} to {folder}: {megabytes:,.1f} MB in {seconds:.1f} s "
        f"({megabytes / max(seconds, 1e-9):,.0f} MB/s), peak RSS {peak_mb:,.0f} MB"
    )


@hydra.main(version_base="1.3", config_path=str(CONF), config_name="convert")
def main(cfg: DictConfig) -> None:
    try:
        print(convert(cfg), flush=True)
    except OnDiskError as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        sys.exit(1)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        sys.exit(2)
    except (InstantiationException, OmegaConfBaseException) as err:
        print(f"error: {config_error_line(err)}", file=sys.stderr, flush=True)
        sys.exit(2)


def cli() -> None:
    """The ``mqgnn-convert`` command (and ``recipes/convert.py`` in a clone): the command line's
    config names and keys checked, then the Hydra run."""
    exit_on_unknown_config_names(sys.argv[1:], "convert")
    main()


if __name__ == "__main__":
    cli()
