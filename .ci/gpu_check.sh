#!/usr/bin/env bash
# GPU check on a fresh machine with this repository and a CUDA build of torch already installed:
# the gpu-marked tests, then the device-sampling benchmark (recipes/bench.py device_sampling).
# Results (markdown and JSON, the JSON rewritten after every stage) go to $OUT when set, else
# .ci/gpu_out/. At most 200 s of tests and 360 s of benchmark (the benchmark about 5-6 minutes).
#
# Usage: bash .ci/gpu_check.sh            (PYTHON=... to pick the interpreter; BENCH_ARGS=... adds
#        benchmark options, e.g. BENCH_ARGS="--scale 0.5 --batches 30")
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
OUT_DIR=${OUT:-.ci/gpu_out}
mkdir -p "$OUT_DIR"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the repository, without installing it
export OUTDATED_IGNORE=1 PIP_DISABLE_PIP_VERSION_CHECK=1
step() { printf '\n=== %s (%s) ===\n' "$1" "$(date +%T)"; }

step "environment"
if ! "$PYTHON" - <<'PY'
import torch
print(f"torch {torch.__version__}, CUDA build {torch.version.cuda}, available {torch.cuda.is_available()}")
assert torch.cuda.is_available(), "torch was built without CUDA or sees no GPU"
print("device:", torch.cuda.get_device_name(0), f"{torch.cuda.mem_get_info()[1] / 2**30:.0f} GiB")
PY
then
  echo "gpu_check: needs a CUDA build of torch that sees a GPU" >&2
  exit 1
fi
if ! "$PYTHON" -c "import lightning, hydra, torchmetrics, ogb, psutil, pytest" 2>/dev/null; then
  echo "installing the project's dependencies (pip install -e .[dev]; torch is kept)"
  "$PYTHON" -m pip install -q -e ".[dev]" || { echo "gpu_check: dependencies missing and pip failed" >&2; exit 1; }
fi

step "gpu tests"
timeout 200 "$PYTHON" -m pytest -q -m gpu -p no:cacheprovider tests 2>&1 | tee "$OUT_DIR/pytest_gpu.txt" | tail -25
tests_rc=${PIPESTATUS[0]}

step "device sampling benchmark"
# shellcheck disable=SC2086
timeout 360 "$PYTHON" recipes/bench.py device_sampling --out "$OUT_DIR" ${BENCH_ARGS:-} 2>&1 \
  | grep -v -e "Warning" -e "warnings.warn" | tee "$OUT_DIR/bench.txt"
bench_rc=${PIPESTATUS[0]}

step "done: gpu tests exit $tests_rc, benchmark exit $bench_rc; results in $OUT_DIR"
[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
