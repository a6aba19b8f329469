#!/usr/bin/env bash
# Build the PyG benchmark environment: torch 2.13.0 (CPU) + torch-geometric 2.8.1 + torch-scatter
# 2.1.2 and torch-sparse 0.6.18 compiled from their sdists, so that PyG's NeighborLoader can sample
# (recipes/benchmarks/pyg_baseline.py).
#
# Usage: .ci/pyg_env.sh [DIR]        (default: <repo>/.venv-pyg, git-ignored)
#        then: DIR/bin/python -m pytest -m pyg_sparse tests/ -q
#              DIR/bin/python recipes/bench.py pyg_baseline --data cora --epochs 10
#
# Why compile: NeighborLoader samples with pyg-lib or torch-sparse, and the package index has a wheel
# of neither for torch 2.13 (pyg-lib not at all; torch-sparse and torch-scatter as sdists only).
# torch-sparse imports torch-scatter, so both are built, against the installed torch
# (--no-build-isolation). On 2 cores that takes about 25 minutes: torch-scatter ~10 min (its
# setup.py turns ninja off, so one file at a time), torch-sparse ~15 min with ninja and MAX_JOBS=2
# (override with MAX_JOBS). pip keeps the built wheels in its cache, so a rebuild on the same machine
# skips the compiling. g++ and the Python headers come with the machine.
# Why a lock list installed with --no-deps: exact pins keep the benchmark reproducible when a
# dependency moves on; the list is the main environment's runtime (the project, the `pyg` extra,
# pytest, pytest-timeout) resolved with pip 23.2 for torch==2.13.0, plus ninja for the parallel build.
# Idempotent: a stamp file records the lock; a matching stamp only re-runs the checks.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${1:-$REPO/.venv-pyg}"
PYTHON="${PYTHON:-python3.11}"
export MAX_JOBS="${MAX_JOBS:-2}"

LOCK="
torch==2.13.0+cpu
filelock==4.3.1
fsspec==2026.9.0
Jinja2==3.1.6
MarkupSafe==3.0.4
mpmath==1.3.0
networkx==3.6.1
sympy==1.14.0
typing_extensions==4.16.0
torch-geometric==2.8.1
aiohttp==3.14.5
aiohappyeyeballs==2.7.1
aiosignal==1.4.0
attrs==26.1.0
frozenlist==1.8.0
multidict==7.2.1
propcache==0.5.4
yarl==1.25.1
pyparsing==3.3.3
xxhash==4.1.0
requests==2.34.2
certifi==2026.10.19.post1
charset-normalizer==3.5.3
idna==3.20
urllib3==2.8.0
numpy==2.4.6
scipy==1.17.1
numba==0.68.1
llvmlite==0.50.0
psutil==7.2.2
pooch==1.9.0
platformdirs==4.14.8
tqdm==4.70.1
packaging==26.4
lightning==2.6.6
pytorch-lightning==2.6.6
lightning-utilities==0.15.3
torchmetrics==1.9.0
PyYAML==6.0.4
hydra-core==1.3.8
omegaconf==2.3.1
antlr4-python3-runtime==4.9.3
ogb==1.3.6
outdated==0.2.2
littleutils==0.2.4
six==1.17.0
pandas==3.1.1
python-dateutil==4.0.0
tzdata==2026.6
scikit-learn==1.9.1
joblib==1.6.0
threadpoolctl==3.8.0
narwhals==2.29.0
cloudpickle==3.1.3
pytest==9.2.0
pytest-timeout==2.4.0
pluggy==1.7.0
iniconfig==2.3.1
Pygments==2.21.0
setuptools==84.2.1
ninja==1.13.2
"
# compiled against the torch above, in this order (torch-sparse imports torch-scatter)
BUILT="
torch-scatter==2.1.2
torch-sparse==0.6.18
"

t_all=$(date +%s)
step() { # step NAME COMMAND...: run and print the elapsed seconds
    local name="$1" t0
    shift
    t0=$(date +%s)
    "$@"
    echo "[pyg_env] $name: $(($(date +%s) - t0)) s"
}

pip_q() { "$DIR/bin/python" -m pip install -q --disable-pip-version-check "$@"; }

build() { # build REQUIREMENT: compile one sdist against the installed torch, with the venv's ninja
    echo "[pyg_env] compiling $1 (MAX_JOBS=$MAX_JOBS)"
    PATH="$DIR/bin:$PATH" FORCE_ONLY_CPU=1 pip_q --no-deps --no-build-isolation "$1"
}

verify() {
    REPO="$REPO" "$DIR/bin/python" - <<'EOF'
import os
import warnings

import torch
import torch_geometric
import torch_geometric.typing as pyg_typing
import torch_scatter
import torch_sparse
from torch_geometric.data import Data
from torch_geometric.loader import NeighborLoader

import lightning_mqgnn

assert pyg_typing.WITH_TORCH_SPARSE, "torch_geometric did not pick up torch-sparse"
# a 6-cycle, both directions: seeds 0 and 3, two hops of two neighbours reach the whole ring
ring = torch.arange(6)
edge_index = torch.cat([torch.stack([ring, (ring + 1) % 6]), torch.stack([(ring + 1) % 6, ring])], 1)
data = Data(x=torch.arange(6, dtype=torch.float32).view(-1, 1), edge_index=edge_index)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # the "without pyg-lib is deprecated" notice
    loader = NeighborLoader(data, num_neighbors=[2, 2], batch_size=2, input_nodes=torch.tensor([0, 3]))
batch = next(iter(loader))
assert batch.batch_size == 2 and batch.n_id[:2].tolist() == [0, 3], batch
assert sorted(batch.n_id.tolist()) == list(range(6)) and batch.edge_index.shape[1] > 0, batch
assert torch.equal(batch.x.view(-1), batch.n_id.to(torch.float32)), batch
here = os.path.realpath(lightning_mqgnn.__file__)
assert here.startswith(os.path.realpath(os.environ["REPO"]) + os.sep), f"lightning_mqgnn imported from {here}"
print(f"[pyg_env] ok: torch {torch.__version__}, torch_geometric {torch_geometric.__version__}, "
      f"torch_scatter {torch_scatter.__version__}, torch_sparse {torch_sparse.__version__}; NeighborLoader "
      f"sampled {batch.num_nodes} nodes, {batch.edge_index.shape[1]} edges; lightning_mqgnn from {here}")
EOF
}

check_deps() {
    local out
    out="$("$DIR/bin/python" -m pip check 2>&1 | grep -v "^No broken requirements found" || true)"
    if [ -n "$out" ]; then
        echo "[pyg_env] broken requirements:"
        echo "$out"
        return 1
    fi
}

stamp="$(printf '%s%s' "$LOCK" "$BUILT" | sha256sum | cut -c1-16)"
if [ -x "$DIR/bin/python" ] && [ "$(cat "$DIR/.pyg_env_stamp" 2>/dev/null)" = "$stamp" ]; then
    echo "[pyg_env] $DIR is up to date (stamp $stamp); checking it"
else
    echo "[pyg_env] building $DIR with $PYTHON ($("$PYTHON" --version 2>&1))"
    [ -x "$DIR/bin/python" ] || step "venv" "$PYTHON" -m venv "$DIR"
    lockfile="$(mktemp)"
    trap 'rm -f "$lockfile"' EXIT
    printf '%s\n' "$LOCK" | grep -v '^$' >"$lockfile"
    # --no-compile: no .pyc for thousands of files up front; Python writes them on first import anyway
    step "pip install (lock, --no-deps)" pip_q --no-deps --no-compile -r "$lockfile"
    for req in $BUILT; do
        step "build $req" build "$req"
    done
    step "pip install -e ." pip_q --no-deps --no-build-isolation -e "$REPO"
    echo "$stamp" >"$DIR/.pyg_env_stamp"
fi
step "pip check" check_deps
step "verify" verify
echo "[pyg_env] total: $(($(date +%s) - t_all)) s, size $(du -sh "$DIR" | cut -f1)"
