"""ND ↔ FRACTAL_NZ layout conversion (the blocked matrix layout of Ascend cube units).

A matrix ``[..., M, N]`` in FRACTAL_NZ is zero-padded to ``M1 = ceil(M / m0)`` row blocks and
``N1 = ceil(N / n0)`` column blocks and stored as ``[..., N1, M1, m0, n0]``: element ``(i, j)``
lives at ``[j // n0, i // m0, i % m0, j % n0]``. ``m0`` is 16; ``n0`` is one 32-byte vector of the
element type (16 for fp16/bf16, 32 for int8, 8 for fp32/int32).
"""

from __future__ import annotations

import torch

from vllm_ascend.core import envs
from vllm_ascend.core.alignment import ALIGNMENT, align_up

NZ_ROW_BLOCK = ALIGNMENT
_VECTOR_BYTES = 32
_SUPPORTED = (torch.float16, torch.bfloat16, torch.float32, torch.int8, torch.uint8, torch.int32, torch.bool)


def nz_block_shape(dtype: torch.dtype) -> tuple[int, int]:
    """``(m0, n0)`` of one fractal tile for ``dtype``."""
    if dtype not in _SUPPORTED:
        raise ValueError(
            f"FRACTAL_NZ does not support dtype {dtype}; supported: {', '.join(str(d) for d in _SUPPORTED)}"
        )
    itemsize = torch.empty((), dtype=dtype).element_size()
    return NZ_ROW_BLOCK, _VECTOR_BYTES // itemsize


def nz_shape(shape: tuple[int, ...] | torch.Size, dtype: torch.dtype) -> tuple[int, ...]:
    """The FRACTAL_NZ shape ``[..., N1, M1, m0, n0]`` of an ND tensor of ``shape``."""
    if len(shape) < 2:
        raise ValueError(f"FRACTAL_NZ needs at least 2 dims [..., M, N], got shape {tuple(shape)}")
    m0, n0 = nz_block_shape(dtype)
    *batch, m, n = shape
    return (*batch, align_up(n, n0) // n0, align_up(m, m0) // m0, m0, n0)


def nd_to_nz(x: torch.Tensor) -> torch.Tensor:
    """``[..., M, N]`` → contiguous ``[..., N1, M1, m0, n0]`` (padding is zero)."""
    *batch, n1, m1, m0, n0 = nz_shape(x.shape, x.dtype)
    m, n = x.shape[-2:]
    padded = x.new_zeros((*batch, m1 * m0, n1 * n0))
    padded[..., :m, :n] = x
    blocks = padded.reshape(*batch, m1, m0, n1, n0)
    nb = len(batch)
    return blocks.permute(*range(nb), nb + 2, nb, nb + 1, nb + 3).contiguous()


def nz_to_nd(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """The exact inverse of :func:`nd_to_nz` for an ND matrix of ``rows`` × ``cols``."""
    m0, n0 = nz_block_shape(x.dtype)
    if x.dim() < 4 or tuple(x.shape[-2:]) != (m0, n0):
        raise ValueError(
            f"expected a FRACTAL_NZ tensor [..., N1, M1, {m0}, {n0}] for {x.dtype}, got {tuple(x.shape)}"
        )
    *batch, n1, m1, _, _ = x.shape
    if align_up(rows, m0) != m1 * m0 or align_up(cols, n0) != n1 * n0:
        raise ValueError(
            f"rows={rows}, cols={cols} do not match the FRACTAL_NZ tensor {tuple(x.shape)}: it holds "
            f"{(m1 - 1) * m0 + 1}..{m1 * m0} rows and {(n1 - 1) * n0 + 1}..{n1 * n0} cols"
        )
    nb = len(batch)
    nd = x.permute(*range(nb), nb + 1, nb + 2, nb, nb + 3).reshape(*batch, m1 * m0, n1 * n0)
    return nd[..., :rows, :cols].contiguous()


def use_nz_weight(quantized: bool) -> bool:
    """Whether a matmul weight should be cast to FRACTAL_NZ under ``VLLM_ASCEND_ENABLE_NZ``."""
    mode = envs.VLLM_ASCEND_ENABLE_NZ
    return mode == 2 or (mode == 1 and quantized)
