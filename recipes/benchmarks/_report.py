"""What every benchmark table carries: the exact command and the machine it ran on."""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def machine_header(name: str, argv: list[str] | None) -> list[str]:
    import torch

    commit = os.environ.get("MQGNN_COMMIT", "")  # set where a copy of the tree runs (its .git may lag)
    if not commit:
        try:
            commit = subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"],
                capture_output=True,
                text=True,
                cwd=Path(__file__).parent,
            ).stdout.strip()
        except OSError:  # no git there
            commit = ""
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    try:
        import dgl  # noqa: F401

        dgl_version = dgl.__version__
    except ImportError:
        dgl_version = "not installed"
    # quoted as a shell reads it: an argument with spaces (``--best "a=1 b=2"``) stays one
    command = shlex.join(["python", "recipes/bench.py", name, *(sys.argv[1:] if argv is None else argv)])
    return [
        f"- command: `{command}`",
        f"- commit {commit or 'unknown'}, torch {torch.__version__}, dgl {dgl_version}, "
        f"python {platform.python_version()}",
        f"- machine: {os.cpu_count()} CPU cores, {device}, load average at end {os.getloadavg()[0]:.1f}",
    ]


def write_report(title: str, header: list[str], table: list[str], out: Path | None) -> str:
    text = "\n".join([f"### {title}", "", *header, "", *table, ""])
    print(text, flush=True)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    return text


def attempt(label: str, measure: Callable[[], T]) -> T | None:
    """``measure()``, or None with the traceback on stderr when it raises: one failed measurement
    of a long run on a lent machine is reported and the others go on (the run still exits non-zero
    through ``exit_status``)."""
    try:
        return measure()
    except Exception:
        print(f"FAILED: {label}", file=sys.stderr, flush=True)
        traceback.print_exc()
        failures.append(label)
        return None


failures: list[str] = []  # labels of the measurements ``attempt`` saw fail, in order


def exit_status() -> int:
    """The benchmark's exit code: 1, naming them, if any measurement failed, else 0."""
    if failures:
        print(f"failed: {', '.join(failures)}", flush=True)
    return 1 if failures else 0
