#!/usr/bin/env bash
# Build the floor environment: the lowest torch, Lightning and numpy pyproject.toml declares, this
# project installed editable with its dev extra, everything else as pip resolves it under those pins.
# Usage: .ci/floor_env.sh [DIR]        (default: <repo>/.venv-floor, git-ignored)
#        then: .ci/floor_tests.sh DIR/bin/python
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${1:-$REPO/.venv-floor}"
PYTHON="${PYTHON:-python3.11}"
pins="$(mktemp)"
trap 'rm -f "$pins"' EXIT
# torch 2.13.0 is the CPU build on disk (.ci/run installs the same first); a bare requirement
# could pull a CUDA build
printf '%s\n' torch==2.13.0 lightning==2.6.6 numpy==1.26.4 >"$pins"
[ -x "$DIR/bin/python" ] || "$PYTHON" -m venv "$DIR"
"$DIR/bin/python" -m pip install -q --disable-pip-version-check -r "$pins"
"$DIR/bin/python" -m pip install -q --disable-pip-version-check -c "$pins" -e "$REPO[dev]"
