"""Where things are, for every test: the repository, its configs, these helpers, the shared data."""

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONF = REPO / "conf"
HELPERS = Path(__file__).resolve().parent
# the npz datasets (tests that need them skip when absent); MQGNN_SHARED_DATA as in the recipe
SHARED_DATA = Path(os.environ.get("MQGNN_SHARED_DATA", REPO.parent / "shared" / "data"))
