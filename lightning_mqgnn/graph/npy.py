"""The header of a ``.npy`` array (numpy's format, versions 1 and 2), read without its data."""

from __future__ import annotations

from typing import BinaryIO

import numpy as np


def read_npy_header(f: BinaryIO) -> tuple[tuple[int, ...], bool, np.dtype]:
    """``(shape, fortran_order, dtype)`` of the array whose file ``f`` is at its start; ``f`` is
    left at the first data byte. A file that is not ``.npy`` raises numpy's ``ValueError``."""
    version = np.lib.format.read_magic(f)
    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, fortran, dtype = read(f)
    return tuple(shape), fortran, dtype
