"""Where things are, for every test: the repository, its configs, these helpers, the shared data."""

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONF = REPO / "conf"
HELPERS = Path(__file__).resolve().parent
# The converted npz datasets, read through the registry's mirror (MQGNN_DATA_MIRROR); CI's offline
# copy lies beside the repository. Tests that need them skip where neither is there.
SHARED_DATA = Path(os.environ.get("MQGNN_DATA_MIRROR") or REPO.parent / "shared" / "data")
