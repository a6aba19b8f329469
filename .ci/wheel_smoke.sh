#!/usr/bin/env bash
# The package as a user installs it: build the sdist and the wheel (`python -m build` builds the
# wheel from the sdist, so both are exercised), install the wheel into a fresh venv outside the
# repository, and in an empty folder run
#   1. `import lightning_mqgnn` (from the venv, not the checkout),
#   2. a 2-rank CPU fit under Trainer(strategy="mqgnn") (.ci/wheel_fit.py),
#   3. `mqgnn-train` on the default generated graph, whose RESULT line must name the same model,
#      data, scores, epochs and batches as `recipes/train.py` from the checkout with the same
#      overrides and seed.
# BUILD_PYTHON builds (it needs `build`: the dev extra); CLONE_PYTHON runs recipes/train.py with the
# checkout first on its path (it needs the package's dependencies); both default to `python`.
# KEEP=1 keeps the temporary folder.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
build_python="${BUILD_PYTHON:-python}"
clone_python="${CLONE_PYTHON:-python}"
work="$(mktemp -d "${TMPDIR:-/tmp}/mqgnn-wheel.XXXXXX")"
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$work"' EXIT
step() { printf '\n--- %s (%s) ---\n' "$1" "$(date +%T)"; }
# the same short run for both entries: one epoch, validation at its end, no checkpoint to resume
overrides=(trainer.max_epochs=1 val_every_batches=0 last_checkpoint_every_s=null trainer.enable_progress_bar=false)

step "build the sdist and the wheel"
"$build_python" -m build --outdir "$work/dist" "$repo"
ls -l "$work/dist"
wheel="$(ls "$work"/dist/*.whl)"

step "fresh venv outside the repository: torch (CPU build) first, then the wheel"
python3 -m venv "$work/venv"
venv_python="$work/venv/bin/python"
"$venv_python" -m pip install -q torch==2.13.0
"$venv_python" -m pip install -q "$wheel"
mkdir "$work/empty"
cd "$work/empty"
# nothing of the checkout on the path: what runs is the wheel's
clone_path="$repo${PYTHONPATH:+:$PYTHONPATH}"
unset PYTHONPATH

step "import lightning_mqgnn"
"$venv_python" -c '
import sys
import lightning_mqgnn
from importlib.metadata import version
from importlib.resources import files
where = lightning_mqgnn.__file__
assert where.startswith(sys.prefix), where
assert version("lightning_mqgnn") == lightning_mqgnn.__version__
package = files("lightning_mqgnn")
assert package.joinpath("py.typed").is_file() and package.joinpath("conf", "config.yaml").is_file()
print(f"lightning_mqgnn {lightning_mqgnn.__version__} from {where}")
'

step "Trainer(strategy=\"mqgnn\") on 2 CPU ranks"
"$venv_python" "$repo/.ci/wheel_fit.py" 2> "$work/fit.err" || { tail -40 "$work/fit.err"; exit 1; }

step "mqgnn-train ${overrides[*]}"
"$work/venv/bin/mqgnn-train" "${overrides[@]}" hydra.run.dir="$work/wheel_run" > "$work/wheel.out" 2> "$work/wheel.err" \
  || { tail -40 "$work/wheel.err"; exit 1; }
grep '^RESULT ' "$work/wheel.out" || { echo "no RESULT line"; tail -40 "$work/wheel.err"; exit 1; }

step "python recipes/train.py ${overrides[*]} (the checkout)"
PYTHONPATH="$clone_path" "$clone_python" "$repo/recipes/train.py" "${overrides[@]}" hydra.run.dir="$work/clone_run" > "$work/clone.out" 2> "$work/clone.err" \
  || { tail -40 "$work/clone.err"; exit 1; }
grep '^RESULT ' "$work/clone.out"

step "the same run: model, data, val, test, epochs, batches"
same_fields() { grep '^RESULT ' "$1" | tr ' ' '\n' | grep -E '^(model|data|val|test|epochs|batches)='; }
if ! diff <(same_fields "$work/wheel.out") <(same_fields "$work/clone.out"); then
  echo "mqgnn-train and recipes/train.py differ"
  exit 1
fi
same_fields "$work/wheel.out" | paste -sd' '
echo "wheel smoke passed"
