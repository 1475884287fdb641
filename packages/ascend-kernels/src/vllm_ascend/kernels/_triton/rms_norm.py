"""Triton :func:`vllm_ascend.kernels.triton_q_rms`: persistent programs over ``[BLOCK_M, D]`` tiles."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_ascend.kernels import _geometry

MAX_BLOCK_M = 16


def rms_block_m(rows: int, programs: int) -> int:
    """Rows per tile: the rows each program gets, floored to a power of two, at most
    :data:`MAX_BLOCK_M` (so any row count compiles one of five variants)."""
    per_program = max(1, triton.cdiv(rows, programs))
    return min(MAX_BLOCK_M, 1 << (per_program.bit_length() - 1))


def rms_block_m_values() -> tuple[int, ...]:
    """Every ``BLOCK_M`` :func:`rms_block_m` can return."""
    return tuple(1 << i for i in range(MAX_BLOCK_M.bit_length()))


def programs(device: torch.device) -> int:
    """Programs per launch: one per multiprocessor (vector core on Ascend); 4 under the interpreter."""
    return _geometry.geometry(device).persistent_programs()


@triton.jit(do_not_specialize=["rows"])
def _q_rms_kernel(
    x_ptr,
    out_ptr,
    rows,
    x_stride,
    out_stride,
    eps,
    D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    cols = tl.arange(0, BLOCK_D)
    inside_d = cols < D
    n_tiles = tl.cdiv(rows, BLOCK_M)
    for tile in range(tl.program_id(0), n_tiles, tl.num_programs(0)):
        r = tile * BLOCK_M + tl.arange(0, BLOCK_M)
        mask = (r < rows)[:, None] & inside_d[None, :]
        r64 = r.to(tl.int64)[:, None]
        x = tl.load(x_ptr + r64 * x_stride + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        inv = tl.rsqrt(tl.sum(x * x, 1) / D + eps)
        tl.store(
            out_ptr + r64 * out_stride + cols[None, :],
            (x * inv[:, None]).to(out_ptr.dtype.element_ty),
            mask=mask,
        )


def triton_q_rms(hidden_state: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    d = hidden_state.shape[-1]
    x = hidden_state.reshape(-1, d)
    if x.stride(-1) != 1:
        x = x.contiguous()
    out = torch.empty(x.shape, dtype=hidden_state.dtype, device=hidden_state.device)
    rows = x.shape[0]
    if rows:
        n = programs(hidden_state.device)
        block_m = rms_block_m(rows, n)
        _q_rms_kernel[(min(n, triton.cdiv(rows, block_m)),)](
            x,
            out,
            rows,
            x.stride(0),
            out.stride(0),
            eps,
            D=d,
            BLOCK_M=block_m,
            BLOCK_D=triton.next_power_of_2(d),
        )
    return out.reshape(hidden_state.shape)
