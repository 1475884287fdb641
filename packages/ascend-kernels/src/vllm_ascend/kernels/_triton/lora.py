"""Triton LoRA shrink / expand of :mod:`vllm_ascend.kernels.lora` (Ascend dialect: no warps, tiles UB-bounded).

One kernel per direction over runs of tokens sharing an adapter: grid ``(runs, row tiles, column tiles)``,
each program a ``tl.dot`` over the reduction axis (the cube unit on Ascend). Decode is runs of one token.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_ascend.kernels._geometry import geometry

#: ``tl.dot``'s smallest tile side; row tiles stay at it (decode runs are one token).
_DOT_MIN = 16


@triton.jit(do_not_specialize=["scale"])
def _lora_shrink_kernel(
    x_ptr,
    x_stride,
    a_ptr,
    a_stride_lora,
    a_stride_rank,
    out_ptr,
    out_stride,
    starts_ptr,
    lens_ptr,
    loras_ptr,
    hidden,
    rank,
    scale,
    BLOCK_M: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    run = tl.program_id(0)
    lora = tl.load(loras_ptr + run).to(tl.int64)
    start = tl.load(starts_ptr + run).to(tl.int64)
    length = tl.load(lens_ptr + run)
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    ranks = tl.program_id(2) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < tl.where(lora >= 0, length, 0)  # tokens without an adapter: no rows
    rank_ok = ranks < rank
    safe_lora = tl.maximum(lora, 0)
    acc = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
    for k0 in range(0, hidden, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < hidden
        xt = tl.load(
            x_ptr + (start + rows)[:, None] * x_stride + ks[None, :],
            mask=row_ok[:, None] & k_ok[None, :],
            other=0.0,
        ).to(tl.float32)
        at = tl.load(
            a_ptr + safe_lora * a_stride_lora + ranks[:, None] * a_stride_rank + ks[None, :],
            mask=rank_ok[:, None] & k_ok[None, :],
            other=0.0,
        ).to(tl.float32)
        acc += tl.dot(xt, tl.trans(at))
    out = out_ptr + (start + rows)[:, None] * out_stride + ranks[None, :]
    tl.store(out, (acc * scale).to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & rank_ok[None, :])


@triton.jit
def _lora_expand_kernel(
    z_ptr,
    z_stride,
    b_ptr,
    b_stride_lora,
    b_stride_out,
    out_ptr,
    out_stride,
    starts_ptr,
    lens_ptr,
    loras_ptr,
    rank,
    width,
    offset,
    ADD_INPUTS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    run = tl.program_id(0)
    lora = tl.load(loras_ptr + run).to(tl.int64)
    start = tl.load(starts_ptr + run).to(tl.int64)
    length = tl.load(lens_ptr + run)
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < tl.where(lora >= 0, length, 0)  # tokens without an adapter: no rows
    col_ok = cols < width
    safe_lora = tl.maximum(lora, 0)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, rank, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < rank
        zt = tl.load(
            z_ptr + (start + rows)[:, None] * z_stride + ks[None, :],
            mask=row_ok[:, None] & k_ok[None, :],
            other=0.0,
        ).to(tl.float32)
        bt = tl.load(
            b_ptr + safe_lora * b_stride_lora + cols[:, None] * b_stride_out + ks[None, :],
            mask=col_ok[:, None] & k_ok[None, :],
            other=0.0,
        ).to(tl.float32)
        acc += tl.dot(zt, tl.trans(bt))
    out = out_ptr + (start + rows)[:, None] * out_stride + offset + cols[None, :]
    mask = row_ok[:, None] & col_ok[None, :]
    if ADD_INPUTS:
        acc += tl.load(out, mask=mask, other=0.0).to(tl.float32)
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mask)


def _rows_contiguous(**tensors: torch.Tensor) -> None:
    for name, tensor in tensors.items():
        if tensor.stride(-1) != 1:
            raise ValueError(f"{name} must have a contiguous last axis, got strides {tensor.stride()}")


def _tiles(device: torch.device, columns: int, reduction: int) -> tuple[int, int]:
    """``(BLOCK_cols, BLOCK_K)``: powers of two >= tl.dot's minimum, the K tile bounded by the UB (fp32
    tiles of rows, columns and the accumulator live at once)."""
    geo = geometry(device)
    block_cols = max(_DOT_MIN, min(64, triton.next_power_of_2(columns)))
    block_k = geo.max_block(
        4, _DOT_MIN + block_cols, cap=max(_DOT_MIN, min(256, triton.next_power_of_2(reduction)))
    )
    return block_cols, max(_DOT_MIN, block_k)


def lora_shrink(
    x: torch.Tensor,
    a: torch.Tensor,
    out: torch.Tensor,
    seq_starts: torch.Tensor,
    seq_lens: torch.Tensor,
    seq_loras: torch.Tensor,
    max_len: int,
    scale: float,
) -> None:
    _rows_contiguous(x=x, lora_a=a, out=out)
    runs, rank, hidden = seq_loras.shape[0], a.shape[1], a.shape[2]
    if runs == 0 or max_len == 0:
        return
    block_r, block_k = _tiles(x.device, rank, hidden)
    grid = (runs, triton.cdiv(max_len, _DOT_MIN), triton.cdiv(rank, block_r))
    _lora_shrink_kernel[grid](
        x, x.stride(0), a, a.stride(0), a.stride(1), out, out.stride(0),
        seq_starts, seq_lens, seq_loras, hidden, rank, float(scale),
        BLOCK_M=_DOT_MIN, BLOCK_R=block_r, BLOCK_K=block_k,
    )  # fmt: skip


def lora_shrink_tokens(
    x: torch.Tensor, a: torch.Tensor, out: torch.Tensor, token_lora_indices: torch.Tensor, scale: float
) -> None:
    starts = torch.arange(token_lora_indices.shape[0], dtype=torch.int64, device=x.device)
    lora_shrink(x, a, out, starts, torch.ones_like(starts), token_lora_indices, 1, scale)


def lora_expand(
    z: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor,
    seq_starts: torch.Tensor,
    seq_lens: torch.Tensor,
    seq_loras: torch.Tensor,
    max_len: int,
    offset: int,
    add_inputs: bool,
) -> None:
    _rows_contiguous(z=z, lora_b=b, out=out)
    runs, width, rank = seq_loras.shape[0], b.shape[1], b.shape[2]
    if runs == 0 or max_len == 0:
        return
    block_n, block_k = _tiles(z.device, width, rank)
    grid = (runs, triton.cdiv(max_len, _DOT_MIN), triton.cdiv(width, block_n))
    _lora_expand_kernel[grid](
        z, z.stride(0), b, b.stride(0), b.stride(1), out, out.stride(0),
        seq_starts, seq_lens, seq_loras, rank, width, offset,
        ADD_INPUTS=add_inputs, BLOCK_M=_DOT_MIN, BLOCK_N=block_n, BLOCK_K=block_k,
    )  # fmt: skip


def lora_expand_tokens(
    z: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor,
    token_lora_indices: torch.Tensor,
    offset: int,
    add_inputs: bool,
) -> None:
    starts = torch.arange(token_lora_indices.shape[0], dtype=torch.int64, device=z.device)
    lora_expand(z, b, out, starts, torch.ones_like(starts), token_lora_indices, 1, offset, add_inputs)
