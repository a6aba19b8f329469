"""The recipe: training a node classifier from the Hydra configs shipped in ``lightning_mqgnn/conf``
(``mqgnn-train``), writing a dataset to disk (``mqgnn-convert``) and summarising runs over seeds
(``mqgnn-summarize``). A clone runs the same code as ``recipes/train.py``, ``recipes/convert.py``
and ``recipes/summarize.py``."""

from pathlib import Path

# the recipe's Hydra configs: files of the installed package, composed by path
CONF = Path(__file__).resolve().parents[1] / "conf"
