"""Where a run samples and gathers: the graph (CSR and sampler state) and the feature matrix, each
on the host or on the training device.

``sample_on``/``features_on`` are ``"auto"``, ``"cpu"`` or ``"cuda"``. ``"auto"`` puts a part on
the CUDA device when it fits in the device's free memory less a margin (the graph first, then
the features beside it), and on the CPU without CUDA. Features that do not fit fall back to the
host gather path (rows gathered in host memory and copied over, a GNS cache's rows kept on the
device) and the decision is logged with the sizes; a graph asked on ``"cuda"`` that does not
fit is refused with its sizes, since sampling on the host is another loader altogether.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

log = logging.getLogger(__name__)

PLACES = ("auto", "cpu", "cuda")
DEFAULT_MARGIN = 0.2  # of the free device memory, left for the model, activations and batches
CPU = torch.device("cpu")


@dataclass(frozen=True)
class Placement:
    """``sample_on``: where the graph lives and batches are sampled; ``features_on``: where the
    feature matrix lives and rows are gathered. ``reason`` says why, with the sizes."""

    sample_on: torch.device = CPU
    features_on: torch.device = CPU
    reason: str = "CPU sampling"

    @property
    def on_device(self) -> bool:
        """Sampling runs on a CUDA device (the device-resident loader)."""
        return self.sample_on.type == "cuda"

    @property
    def features_resident(self) -> bool:
        """Rows are gathered where the batch is sampled (no host gather, no copy)."""
        return self.features_on == self.sample_on


def check_place(option: str, value: str) -> str:
    if value not in PLACES:
        raise ValueError(f"{option} must be one of {PLACES}, got {value!r}")
    return value


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def decide_placement(
    sample_on: str,
    features_on: str,
    *,
    graph_bytes: int,
    feature_bytes: int,
    device: torch.device | str,
    free_bytes: int | None,
    margin: float = DEFAULT_MARGIN,
) -> Placement:
    """The placement for a graph of ``graph_bytes`` and features of ``feature_bytes`` trained on
    ``device`` with ``free_bytes`` of it free (None: no CUDA device to place anything on).

    Only ``(1 - margin)`` of the free memory is spent on residency. Raises ``ValueError`` naming
    the option for ``"cuda"`` without a CUDA device, for a graph that does not fit, and for
    features asked on the device while sampling stays on the host.
    """
    check_place("sample_on", sample_on)
    check_place("features_on", features_on)
    if not 0.0 <= margin < 1.0:
        raise ValueError(f"placement margin must be in [0, 1), got {margin}")
    device = torch.device(device)
    cuda = device.type == "cuda" and free_bytes is not None
    for option, value in (("sample_on", sample_on), ("features_on", features_on)):
        if value == "cuda" and not cuda:
            raise ValueError(
                f"{option}='cuda' but the training device is {device} "
                f"({'no CUDA available' if not torch.cuda.is_available() else 'not a CUDA device'}); "
                f"use {option}='auto' or 'cpu'"
            )
    if not cuda:
        return Placement(CPU, CPU, "no CUDA device: sampling and gathering on the CPU")
    budget = int(free_bytes * (1.0 - margin))
    sizes = (
        f"graph {_gib(graph_bytes)}, features {_gib(feature_bytes)}, "
        f"{_gib(free_bytes)} free on {device} less a margin of {margin:.0%} = {_gib(budget)}"
    )
    if sample_on == "cpu":
        if features_on == "cuda":
            raise ValueError(
                "features_on='cuda' needs sample_on on the device too (sample_on='cuda' or 'auto'): "
                "the host loaders gather rows in host memory"
            )
        return Placement(CPU, CPU, "sample_on='cpu'")
    if graph_bytes > budget:
        if sample_on == "cuda":
            raise ValueError(f"sample_on='cuda': the graph does not fit on the device ({sizes})")
        log.info("placement: sampling on the CPU, the graph does not fit on the device (%s)", sizes)
        return Placement(CPU, CPU, f"graph does not fit: {sizes}")
    if features_on == "cpu":
        return Placement(device, CPU, f"features_on='cpu'; {sizes}")
    if graph_bytes + feature_bytes > budget:
        log.warning(
            "placement: features stay in host memory, gathered there and copied per batch; "
            "graph and features together do not fit on the device (%s)",
            sizes,
        )
        return Placement(device, CPU, f"features do not fit beside the graph: {sizes}")
    log.info("placement: graph and features on %s (%s)", device, sizes)
    return Placement(device, device, f"graph and features fit: {sizes}")


def free_device_memory(device: torch.device | str) -> int | None:
    """Free bytes on ``device`` (``torch.cuda.mem_get_info``), or None when it is not a usable
    CUDA device."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    free, _total = torch.cuda.mem_get_info(device)
    return int(free)
