"""Alignment helpers: Ascend cube units and FRACTAL_NZ tiles work on 16-element blocks."""

from __future__ import annotations

import torch
import torch.nn.functional as F

ALIGNMENT = 16


def _check(n: int, alignment: int) -> None:
    if not isinstance(alignment, int) or isinstance(alignment, bool) or alignment < 1:
        raise ValueError(f"alignment must be a positive integer, got {alignment!r}")
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise ValueError(f"size must be a non-negative integer, got {n!r}")


def align_up(n: int, alignment: int = ALIGNMENT) -> int:
    """The smallest multiple of ``alignment`` that is >= ``n``."""
    _check(n, alignment)
    return -(-n // alignment) * alignment


def align_down(n: int, alignment: int = ALIGNMENT) -> int:
    """The largest multiple of ``alignment`` that is <= ``n``."""
    _check(n, alignment)
    return n // alignment * alignment


def is_aligned(n: int, alignment: int = ALIGNMENT) -> bool:
    _check(n, alignment)
    return n % alignment == 0


def pad_to_alignment(x: torch.Tensor, dims: tuple[int, ...], alignment: int = ALIGNMENT) -> torch.Tensor:
    """Zero-pad each dim in ``dims`` at its end to a multiple of ``alignment`` (no copy if aligned)."""
    pads = [0] * (2 * x.dim())
    for dim in dims:
        d = dim % x.dim() if -x.dim() <= dim < x.dim() else None
        if d is None:
            raise ValueError(f"dim {dim} is out of range for a {x.dim()}-d tensor")
        size = x.shape[d]
        # F.pad lists (left, right) pairs from the last dim backwards.
        pads[2 * (x.dim() - 1 - d) + 1] = align_up(size, alignment) - size
    return F.pad(x, pads) if any(pads) else x


def aligned_16(x: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """``x`` zero-padded along ``dim`` to a multiple of 16 (310P kernels need 16-aligned token counts)."""
    return pad_to_alignment(x, (dim,), ALIGNMENT)
