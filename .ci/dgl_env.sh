#!/usr/bin/env bash
# Build the DGL test environment: torch 2.2.1 + dgl 2.1.0 (the newest Linux/cp311 DGL wheel on PyPI;
# 2.2.1 exists only for win_amd64) + numpy<2 + torchdata 0.7.1 + pandas<2.3 + setuptools<70.
#
# Usage: .ci/dgl_env.sh [DIR]        (default: <repo>/.venv-dgl, git-ignored)
#        then: DIR/bin/python -m pytest -m dgl tests/ -q
#
# Why a lock list installed with --no-deps: PyPI only has the CUDA build of torch 2.2.1, whose
# import preloads all eleven nvidia-* libraries (torch/__init__.py:_load_global_deps raises without
# them), so those stay; triton (~170 MB compressed, GPU kernels only) is the one dependency a CPU run
# never loads, and plain pip resolution would pull it back in. Exact pins also keep CI reproducible
# when a dependency drops numpy 1.x or torch 2.2. The lock was resolved with pip 23.2 against PyPI
# (torch==2.2.1 dgl==2.1.0 torchdata==0.7.1 numpy<2 pandas<2.3 setuptools<70 pydantic
# lightning==2.6.6 torchmetrics==1.9.0 hydra-core==1.3.8 ogb==1.3.6 scipy numba pytest psutil pooch
# platformdirs), plus
# pytest-timeout (the dev extra) and wheel<0.46. This project is installed editable with build
# isolation: its build backend needs setuptools>=77 (the licence as an SPDX expression), DGL's <70. `import dgl` itself needs pandas, pydantic and PyYAML
# (dgl/data/csv_dataset_base.py, imported by dgl/__init__.py).
# Idempotent: a stamp file records the lock; a matching stamp only re-runs the checks.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${1:-$REPO/.venv-dgl}"
PYTHON="${PYTHON:-python3.11}"

LOCK="
nvidia-cublas-cu12==12.1.3.1
nvidia-cuda-cupti-cu12==12.1.105
nvidia-cuda-nvrtc-cu12==12.1.105
nvidia-cuda-runtime-cu12==12.1.105
nvidia-cudnn-cu12==8.9.2.26
nvidia-cufft-cu12==11.0.2.54
nvidia-curand-cu12==10.3.2.106
nvidia-cusolver-cu12==11.4.5.107
nvidia-cusparse-cu12==12.1.0.106
nvidia-nccl-cu12==2.19.3
nvidia-nvjitlink-cu12==12.9.86
nvidia-nvtx-cu12==12.1.105
torch==2.2.1
filelock==4.3.1
fsspec==2026.9.0
Jinja2==3.1.6
MarkupSafe==3.0.4
mpmath==1.3.0
networkx==3.6.1
sympy==1.14.0
typing_extensions==4.16.0
numpy==1.26.4
dgl==2.1.0
torchdata==0.7.1
pandas==2.2.3
setuptools==69.5.1
wheel==0.45.1
pydantic==2.14.4
pydantic_core==2.50.5
annotated-types==0.8.0
typing-inspection==0.4.5
requests==2.34.2
certifi==2026.10.19.post1
charset-normalizer==3.5.3
idna==3.20
urllib3==2.8.0
pooch==1.9.0
platformdirs==4.14.8
tqdm==4.70.1
psutil==7.2.2
scipy==1.17.1
numba==0.68.1
llvmlite==0.50.0
lightning==2.6.6
pytorch-lightning==2.6.6
lightning-utilities==0.15.3
torchmetrics==1.9.0
packaging==26.4
PyYAML==6.0.4
aiohttp==3.14.5
aiohappyeyeballs==2.7.1
aiosignal==1.4.0
attrs==26.1.0
frozenlist==1.8.0
multidict==7.2.1
propcache==0.5.4
yarl==1.25.1
hydra-core==1.3.8
omegaconf==2.3.1
antlr4-python3-runtime==4.9.3
ogb==1.3.6
outdated==0.2.2
littleutils==0.2.4
six==1.17.0
scikit-learn==1.9.1
joblib==1.6.0
threadpoolctl==3.8.0
cloudpickle==3.1.3
narwhals==2.29.0
python-dateutil==4.0.0
pytz==2026.6
tzdata==2026.6
pytest==9.2.0
pytest-timeout==2.4.0
pluggy==1.7.0
iniconfig==2.3.1
Pygments==2.21.0
"

t_all=$(date +%s)
step() { # step NAME COMMAND...: run and print the elapsed seconds
    local name="$1" t0
    shift
    t0=$(date +%s)
    "$@"
    echo "[dgl_env] $name: $(($(date +%s) - t0)) s"
}

verify() {
    REPO="$REPO" DGLBACKEND=pytorch "$DIR/bin/python" - <<'EOF'
import os

import dgl
import torch

import lightning_mqgnn

g = dgl.graph((torch.tensor([0, 1, 2]), torch.tensor([1, 2, 0])), num_nodes=3)
assert g.num_edges() == 3 and g.in_degrees().tolist() == [1, 1, 1], g
here = os.path.realpath(lightning_mqgnn.__file__)
assert here.startswith(os.path.realpath(os.environ["REPO"]) + os.sep), f"lightning_mqgnn imported from {here}"
print(f"[dgl_env] ok: torch {torch.__version__}, dgl {dgl.__version__}, "
      f"lightning_mqgnn {lightning_mqgnn.__version__} from {lightning_mqgnn.__file__}")
EOF
}

# pip check, minus triton: the one requirement left out on purpose (see the header), and this
# project's torch floor: DGL's torch 2.2.1 is below it, so this environment runs the DGL interop
# tests (-m dgl), not the library's suite, which the floor environment runs (.ci/floor_env.sh).
check_deps() {
    local out
    out="$("$DIR/bin/python" -m pip check 2>&1 | grep -v -e "^No broken requirements found" -e "requires triton" \
        -e "^lightning.mqgnn [^ ]* has requirement torch>=" || true)"
    if [ -n "$out" ]; then
        echo "[dgl_env] broken requirements:"
        echo "$out"
        return 1
    fi
}

stamp="$(printf '%s' "$LOCK" | sha256sum | cut -c1-16)"
if [ -x "$DIR/bin/python" ] && [ "$(cat "$DIR/.dgl_env_stamp" 2>/dev/null)" = "$stamp" ]; then
    echo "[dgl_env] $DIR is up to date (stamp $stamp); checking it"
else
    echo "[dgl_env] building $DIR with $PYTHON ($("$PYTHON" --version 2>&1))"
    [ -x "$DIR/bin/python" ] || step "venv" "$PYTHON" -m venv "$DIR"
    lockfile="$(mktemp)"
    trap 'rm -f "$lockfile"' EXIT
    printf '%s\n' "$LOCK" | grep -v '^$' >"$lockfile"
    # --no-compile: no .pyc for ~20k files up front; Python writes them on first import anyway
    step "pip install (lock, --no-deps)" "$DIR/bin/python" -m pip install -q --disable-pip-version-check \
        --no-deps --no-compile -r "$lockfile"
    step "pip install -e ." "$DIR/bin/python" -m pip install -q --disable-pip-version-check \
        --no-deps -e "$REPO"
    echo "$stamp" >"$DIR/.dgl_env_stamp"
fi
step "pip check" check_deps
step "verify" verify
echo "[dgl_env] total: $(($(date +%s) - t_all)) s, size $(du -sh "$DIR" | cut -f1)"
