"""Triton LoRA shrink / expand of :mod:`vllm_ascend.kernels.lora` (Ascend dialect: no warps, tiles UB-bounded).

One kernel serves both directions (an adapter-indexed matmul into a column slice) over runs of tokens sharing an
adapter: grid ``(runs, row tiles, column tiles)``, each program a ``tl.dot`` over the reduction axis (the cube unit
on Ascend). Decode is runs of one token.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_ascend.kernels._geometry import geometry

#: ``tl.dot``'s smallest tile side; row tiles stay at it (decode runs are one token).
_DOT_MIN = 16


@triton.jit(do_not_specialize=["scale"])
def _lora_matmul_kernel(
    x_ptr,
    x_stride,
    w_ptr,
    w_stride_lora,
    w_stride_col,
    out_ptr,
    out_stride,
    starts_ptr,
    lens_ptr,
    loras_ptr,
    reduction,
    columns,
    offset,
    scale,
    ADD_INPUTS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """``out[s+i, offset+c] (+)= scale * x[s+i] . w[l, c]`` for the rows of run ``(s, n, l)``, ``l >= 0``:
    shrink is ``w = lora_a`` (columns = rank, offset 0), expand ``w = lora_b`` (columns = the slice's width)."""
    run = tl.program_id(0)
    lora = tl.load(loras_ptr + run).to(tl.int64)
    start = tl.load(starts_ptr + run).to(tl.int64)
    length = tl.load(lens_ptr + run)
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < tl.where(lora >= 0, length, 0)  # tokens without an adapter: no rows
    col_ok = cols < columns
    safe_lora = tl.maximum(lora, 0)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, reduction, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < reduction
        xt = tl.load(
            x_ptr + (start + rows)[:, None] * x_stride + ks[None, :],
            mask=row_ok[:, None] & k_ok[None, :],
            other=0.0,
        ).to(tl.float32)
        wt = tl.load(
            w_ptr + safe_lora * w_stride_lora + cols[:, None] * w_stride_col + ks[None, :],
            mask=col_ok[:, None] & k_ok[None, :],
            other=0.0,
        ).to(tl.float32)
        acc += tl.dot(xt, tl.trans(wt))
    acc = acc * scale
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


def _launch(
    x: torch.Tensor,
    w: torch.Tensor,
    out: torch.Tensor,
    seq_starts: torch.Tensor,
    seq_lens: torch.Tensor,
    seq_loras: torch.Tensor,
    max_len: int,
    offset: int,
    scale: float,
    *,
    add_inputs: bool,
) -> None:
    """One :func:`_lora_matmul_kernel` launch over the runs: ``w`` is ``[L, columns, reduction]``."""
    runs, columns, reduction = seq_loras.shape[0], w.shape[1], w.shape[2]
    if runs == 0 or max_len == 0:
        return
    block_n, block_k = _tiles(x.device, columns, reduction)
    grid = (runs, triton.cdiv(max_len, _DOT_MIN), triton.cdiv(columns, block_n))
    _lora_matmul_kernel[grid](
        x, x.stride(0), w, w.stride(0), w.stride(1), out, out.stride(0),
        seq_starts, seq_lens, seq_loras, reduction, columns, offset, scale,
        ADD_INPUTS=add_inputs, BLOCK_M=_DOT_MIN, BLOCK_N=block_n, BLOCK_K=block_k,
    )  # fmt: skip


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
    _launch(x, a, out, seq_starts, seq_lens, seq_loras, max_len, 0, float(scale), add_inputs=False)


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
    _launch(z, b, out, seq_starts, seq_lens, seq_loras, max_len, offset, 1.0, add_inputs=add_inputs)


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
