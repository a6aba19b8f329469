"""Where things are, for every test: the repository, its configs, these helpers, the committed
dataset files, and the mirror of real datasets where one is set."""

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONF = REPO / "lightning_mqgnn" / "conf"
HELPERS = Path(__file__).resolve().parent
# cora's published Planetoid files, served to the registry by a local HTTP server (conftest.py)
PLANETOID_FILES = REPO / "tests" / "fixtures" / "planetoid"
# The converted npz datasets of MQGNN_DATA_MIRROR, as the registry reads it: only where that variable
# is set (CI sets it for `pytest -m mirror` alone), so that a run without it is a fresh clone's.
MIRROR = Path(os.environ["MQGNN_DATA_MIRROR"]).expanduser() if os.environ.get("MQGNN_DATA_MIRROR") else None
