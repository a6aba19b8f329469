"""Launching ranks from a test (an environment without this process's rank variables, a free port,
a two-node torchrun on localhost) and finding a rank's process among a launcher's children (to
kill it in fault tests)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

RANK_VARIABLES = ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "RANK", "GROUP_RANK", "MASTER_PORT", "MASTER_ADDR")


def launcher_env(**extra: str) -> dict[str, str]:
    """This process's environment for a launcher of ranks: one thread per rank, no Python
    warnings, none of the rank variables a launcher sets, and ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in RANK_VARIABLES}
    return {**env, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", **extra}


def rank_process(parent: int, rank: int) -> int | None:
    """The pid of ``parent``'s child whose environment has ``LOCAL_RANK=rank``, or None."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if f"LOCAL_RANK={rank}".encode() in environ and int(stat[1]) == parent:
            return int(entry.name)
    return None


def free_port() -> int:
    """A TCP port on localhost that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_node_torchrun(script: Path, *args: str) -> list[list[str]]:
    """The commands of a two-"node" torchrun on localhost (one process each, ``num_nodes=2`` to
    Lightning, each with ``LOCAL_RANK=0``): ``script args`` on node 0 and node 1."""
    port = free_port()
    return [
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes=2",
            "--nproc_per_node=1",
            f"--node_rank={rank}",
            "--master_addr=127.0.0.1",
            f"--master_port={port}",
            str(script),
            *args,
        ]
        for rank in range(2)
    ]


def run_concurrently(
    commands: list[list[str]], cwd: Path, timeout: float
) -> list[subprocess.CompletedProcess]:
    """Run ``commands`` at once (``launcher_env``), each in its own session; on a timeout or when
    done, kill what is left of each process group. Asserts that every command exited with 0."""
    env = launcher_env(MASTER_PORT=str(free_port()))
    procs = [
        subprocess.Popen(
            cmd,
            cwd=cwd,
            env=env,
            start_new_session=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for cmd in commands
    ]
    results = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=timeout)
            results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out))
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    for r in results:
        assert r.returncode == 0, f"{' '.join(r.args)} failed:\n{r.stdout[-6000:]}"
    return results


def group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes of process group ``pgid``: what a job left behind."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def start_job(cmd: list[str], env: dict[str, str], cwd: Path) -> subprocess.Popen:
    """``cmd`` as a scheduler's job: a session and process group of its own, output as text."""
    return subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
