"""Benchmarks: ``python recipes/bench.py NAME [options]``; ``python recipes/bench.py`` lists them.

Each benchmark lives in ``recipes/benchmarks/NAME.py`` with a ``main(argv)``; it measures, prints a
markdown table with the exact command and machine, and writes it to ``--out`` when given.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def available() -> list[str]:
    return sorted(p.stem for p in (HERE / "benchmarks").glob("*.py") if not p.stem.startswith("_"))


def main(argv: list[str]) -> int:
    names = available()
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        print("benchmarks: " + ", ".join(names))
        return 0
    name, rest = argv[0], argv[1:]
    if name not in names:
        print(f"error: unknown benchmark {name!r} (available: {', '.join(names)})", file=sys.stderr)
        return 2
    sys.path.insert(0, str(HERE))
    module = importlib.import_module(f"benchmarks.{name}")
    rc = module.main(rest)
    return rc if isinstance(rc, int) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
