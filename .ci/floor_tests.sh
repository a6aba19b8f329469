#!/usr/bin/env bash
# The floors pyproject.toml declares for torch, Lightning and numpy are the versions of the floor
# environment (.ci/floor_env.sh: torch 2.13.0, lightning 2.6.6, numpy 1.26.4). This checks that
# they still are, then runs there the default suite's tests of the library's own layers: the
# package's import rules, graphs and datasets, samplers, models and callbacks.
# Usage: .ci/floor_tests.sh [PYTHON]     (default: .venv-floor/bin/python)
set -euo pipefail
cd "$(dirname "$0")/.."
python="${1:-.venv-floor/bin/python}"

"$python" - <<'PY'
import re
import tomllib
from importlib.metadata import version

from packaging.version import Version

with open("pyproject.toml", "rb") as f:
    requirements = tomllib.load(f)["project"]["dependencies"]
floors = dict(re.fullmatch(r"([A-Za-z0-9_.-]+)>=([0-9.]+)", r).groups() for r in requirements if ">=" in r)
wrong = []
for name in ("torch", "lightning", "numpy"):
    installed = Version(version(name)).base_version  # torch's local build tag (+cpu) aside
    if Version(installed) != Version(floors[name]):
        wrong.append(f"{name}: declared >={floors[name]}, this environment has {installed}")
    print(f"floor {name}>={floors[name]}: {installed}")
if wrong:
    raise SystemExit("the declared floors are not the versions tested here: " + "; ".join(wrong))
PY

"$python" -m pytest -q tests/package tests/graph tests/sampling tests/models tests/callbacks
