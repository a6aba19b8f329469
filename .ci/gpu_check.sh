#!/usr/bin/env bash
# GPU check on a machine with this repository and a CUDA build of torch already installed, in
# stages (all of them by default, in this order; each under its own time limit, and a failed stage
# does not stop the next):
#   tests     the gpu-marked tests, two ranks sharing the one GPU among them (<= 300 s)
#   step      the training step against its floor on CUDA, products_like_1m, SAGE and GCN,
#             bare loop and trainer, steps from CUDA graphs and eager (recipes/bench.py step;
#             <= 200 s)
#   pipeline  products_like_1m (1.03M nodes), 2-layer SAGE and GCN 5,5: sequential, CPU-worker
#             pipeline and device-resident, whole epochs, CUDA graphs on and off (bench.py
#             device_sampling --parts speed; <= 300 s)
#   sampler   device-resident sampling in a thread of the training process against 1, 2 and 3
#             sampler processes: products_like scale 1.0, SALIENT's and the paper's
#             configuration (bench.py device_sampling --parts speed; <= 300 s)
#   device    the device-sampling benchmark at its defaults: products_like scale 1.0, SALIENT's
#             and the paper's configuration, all four loaders, host-sync census, accuracy (<= 420 s)
#   gns       GNS against node-wise sampling on products_like_1m, SAGE and GCN, device-resident
#             loader, one seed to early stopping: test metric, feature bytes per batch, time to
#             node-wise's accuracy (bench.py gns; <= 420 s)
# Results (markdown and JSON, rewritten after every measurement) go to $OUT when set, else
# .ci/gpu_out/.
#
# Usage: bash .ci/gpu_check.sh [STAGE ...]
#   PYTHON=...      the interpreter (default python3)
#   WHEELS=DIR      install the wheels in DIR first (a machine without a package index; into
#                   /tmp/gpu_check_site, put on PYTHONPATH), else pip install -e .[dev] if imports fail
#   BENCH_ARGS=...  more options for the device stage, e.g. "--scale 0.5 --batches 30"
#   PIPELINE_ARGS=...  more options for the pipeline stage, e.g. "--loaders pipeline,device"
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
OUT_DIR=${OUT:-.ci/gpu_out}
STAGES=${*:-tests step pipeline sampler device gns}
mkdir -p "$OUT_DIR"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the repository, without installing it
export OUTDATED_IGNORE=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1
step() { printf '\n=== %s (%s) ===\n' "$1" "$(date +%T)"; }
failed=""
run_stage() {  # NAME LIMIT_S LOG COMMAND...: the command under a time limit, its output in LOG
  local name=$1 limit=$2 log=$3
  shift 3
  step "$name"
  timeout "$limit" "$@" 2>&1 | grep --line-buffered -v -e "Warning" -e "warnings.warn" | tee "$log"
  local rc=${PIPESTATUS[0]}
  [ "$rc" -eq 0 ] || failed="$failed $name($rc)"
}

step "environment"
if [ -n "${WHEELS:-}" ]; then
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/gpu_check_site "$WHEELS"/*.whl || { echo "gpu_check: installing $WHEELS failed" >&2; exit 1; }
  export PYTHONPATH="$PYTHONPATH:/tmp/gpu_check_site"
fi
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
if ! "$PYTHON" -c "import lightning, hydra, torchmetrics, psutil, pytest" 2>/dev/null; then
  echo "installing the project's dependencies (pip install -e .[dev]; torch is kept)"
  "$PYTHON" -m pip install -q -e ".[dev]" || { echo "gpu_check: dependencies missing and pip failed" >&2; exit 1; }
fi

for stage in $STAGES; do
  case $stage in
    tests)
      run_stage "gpu tests" 300 "$OUT_DIR/pytest_gpu.txt" \
        "$PYTHON" -m pytest -q -m gpu -p no:cacheprovider --timeout 120 tests ;;
    step)
      run_stage "training step on CUDA" 200 "$OUT_DIR/step.txt" \
        "$PYTHON" recipes/bench.py step --data products_like_1m --models sage,gcn --device cuda \
        --steps 40 --repeats 1 --cuda-graphs on,off --out "$OUT_DIR/step.md" ;;
    pipeline)
      # shellcheck disable=SC2086
      run_stage "pipeline on products_like_1m" 300 "$OUT_DIR/pipeline.txt" \
        "$PYTHON" recipes/bench.py device_sampling --scale 0.42 --configs paper,paper_gcn --parts speed \
        --epochs 3 --batches 0 --cuda-graphs on,off --out "$OUT_DIR/products_1m" ${PIPELINE_ARGS:-} ;;
    sampler)
      run_stage "device sampling: thread or process" 300 "$OUT_DIR/sampler.txt" \
        "$PYTHON" recipes/bench.py device_sampling --configs salient,paper \
        --loaders device,device_process1,device_process2,device_process3 --parts speed --epochs 3 \
        --out "$OUT_DIR/sampler" ;;
    device)
      # shellcheck disable=SC2086
      run_stage "device sampling benchmark" 420 "$OUT_DIR/device.txt" \
        "$PYTHON" recipes/bench.py device_sampling --out "$OUT_DIR/products_full" ${BENCH_ARGS:-} ;;
    gns)
      run_stage "GNS on products_like_1m" 420 "$OUT_DIR/gns.txt" \
        "$PYTHON" recipes/bench.py gns --datasets products_like_1m --models sage,gcn --variants nodewise,gns \
        --seeds 0 --extra "loader=device" --jsonl "$OUT_DIR/gns.jsonl" \
        --out "$OUT_DIR/gns.md" ;;
    *)
      echo "gpu_check: unknown stage $stage (expected tests, step, pipeline, sampler, device, gns)" >&2
      exit 2 ;;
  esac
done

step "done; failed stages:${failed:- none}; results in $OUT_DIR"
[ -z "$failed" ]
