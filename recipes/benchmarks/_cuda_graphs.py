"""The ``--cuda-graphs`` option the step and device-sampling benchmarks share."""

from __future__ import annotations

import argparse

import torch

CUDA_GRAPHS_HELP = "on, off, or on,off (an A/B in one run): training steps replayed from CUDA graphs or eager"


def cuda_graph_modes(text: str) -> list[bool]:
    """``--cuda-graphs`` as the modes to run, in order (an argparse ``type``). Without a GPU only
    the first: steps on the CPU run eagerly either way, so there is nothing to compare."""
    words = text.split(",")
    if not words or set(words) - {"on", "off"}:
        raise argparse.ArgumentTypeError(f"takes on, off or on,off, got {text!r}")
    modes = [word == "on" for word in words]
    return modes if torch.cuda.is_available() else modes[:1]
