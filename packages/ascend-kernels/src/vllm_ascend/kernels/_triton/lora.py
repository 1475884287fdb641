"""Triton LoRA shrink / expand of :mod:`vllm_ascend.kernels.lora` (Ascend dialect: no warps, tiles UB-bounded).

One kernel serves both directions (an adapter-indexed matmul into a column slice), each program a ``tl.dot`` over
the reduction axis (the cube unit on Ascend), in two layouts:

- segmented (prefill): grid ``(runs, row tiles, column tiles)`` over runs of consecutive tokens sharing an adapter;
- by token (decode): grid ``(adapter slots, token tiles, column tiles x K splits)``; a program takes the tokens of
  its tile that use its slot (a tile with none exits), so an adapter's weights are read once per token tile, not
  once per token, with no sort and no host sync (capturable). Small batches split the reduction over programs
  (shrink only): each split stores its partial sum to a scratch and the tile's last split to finish
  (:func:`.common.last_chunk`) adds them in split order and writes the rows, so one launch serves both layouts,
  nothing is zeroed first and the sum does not depend on which split finishes first.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from vllm_ascend.kernels._geometry import LaunchGeometry, geometry
from vllm_ascend.kernels._triton.common import counters, last_chunk, scratch
from vllm_ascend.kernels.v2._launch import cdiv, next_power_of_2

#: ``tl.dot``'s smallest tile side.
_DOT_MIN = 16


@triton.jit(do_not_specialize=["scale", "num_tokens"])
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
    part_ptr,
    counter_ptr,
    num_tokens,
    reduction,
    columns,
    offset,
    scale,
    ADD_INPUTS: tl.constexpr,
    BY_TOKEN: tl.constexpr,
    SPLIT_K: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """``out[r, offset+c] (+)= scale * x[r] . w[l, c]`` for the rows ``r`` of adapter ``l >= 0``: shrink is
    ``w = lora_a`` (columns = rank, offset 0), expand ``w = lora_b`` (columns = the slice's width).

    Segmented: program ``(run, tile, col)`` takes rows ``s + tile*BLOCK_M + i < s + n`` of run ``(s, n, l)``.
    By token: program ``(l, tile, col*SPLIT_K + k)`` takes the tile's tokens whose ``loras[t] == l`` and the
    ``k``-th of ``SPLIT_K`` interleaved reduction chunks; with ``SPLIT_K > 1`` it stores its partial
    ``[BLOCK_M, BLOCK_N]`` at ``part_ptr`` and the output tile's last split adds the ``SPLIT_K`` partials."""
    tiles = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    col_split = tl.program_id(2)
    cols = (col_split // SPLIT_K) * BLOCK_N + tl.arange(0, BLOCK_N)
    k_first = (col_split % SPLIT_K) * BLOCK_K
    if BY_TOKEN:
        lora = tl.program_id(0).to(tl.int64)
        in_batch = tiles < num_tokens
        token_lora = tl.load(loras_ptr + tiles, mask=in_batch, other=-1).to(tl.int64)
        row_ok = in_batch & (token_lora == lora)
        rows = tiles.to(tl.int64)
    else:
        run = tl.program_id(0)
        lora = tl.load(loras_ptr + run).to(tl.int64)
        length = tl.load(lens_ptr + run)
        row_ok = tiles < tl.where(lora >= 0, length, 0)  # tokens without an adapter: no rows
        rows = tl.load(starts_ptr + run).to(tl.int64) + tiles
    if tl.max(row_ok.to(tl.int32), axis=0) > 0:
        col_ok = cols < columns
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(k_first, reduction, BLOCK_K * SPLIT_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < reduction
            xt = tl.load(
                x_ptr + rows[:, None] * x_stride + ks[None, :],
                mask=row_ok[:, None] & k_ok[None, :],
                other=0.0,
            ).to(DOT_DTYPE)
            wt = tl.load(
                w_ptr + lora * w_stride_lora + cols[:, None] * w_stride_col + ks[None, :],
                mask=col_ok[:, None] & k_ok[None, :],
                other=0.0,
            ).to(DOT_DTYPE)
            acc += tl.dot(xt, tl.trans(wt))
        out = out_ptr + rows[:, None] * out_stride + offset + cols[None, :]
        mask = row_ok[:, None] & col_ok[None, :]
        if SPLIT_K > 1:
            tile = (tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)) * (
                tl.num_programs(2) // SPLIT_K
            )
            tile += col_split // SPLIT_K
            cell = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
            tl.store(
                part_ptr + (tile.to(tl.int64) * SPLIT_K + col_split % SPLIT_K) * BLOCK_M * BLOCK_N + cell, acc
            )
            if last_chunk(counter_ptr, tile, SPLIT_K):
                acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                for k in range(SPLIT_K):
                    acc += tl.load(part_ptr + (tile.to(tl.int64) * SPLIT_K + k) * BLOCK_M * BLOCK_N + cell)
                _store_rows(out, acc * scale, mask, ADD_INPUTS)
        else:
            _store_rows(out, acc * scale, mask, ADD_INPUTS)


@triton.jit
def _store_rows(out, acc, mask, ADD_INPUTS: tl.constexpr):
    """Write (or with ``ADD_INPUTS`` add) the fp32 tile ``acc`` into ``out`` in its dtype."""
    if ADD_INPUTS:
        acc += tl.load(out, mask=mask, other=0.0).to(tl.float32)
    tl.store(out, acc.to(out.dtype.element_ty), mask=mask)


def _rows_contiguous(**tensors: torch.Tensor) -> None:
    for name, tensor in tensors.items():
        if tensor.stride(-1) != 1:
            raise ValueError(f"{name} must have a contiguous last axis, got strides {tensor.stride()}")


def _dot_dtype(x: torch.Tensor, w: torch.Tensor) -> tl.dtype:
    """The operands' own 16-bit type when both share it (fp32 accumulation either way), else fp32; fp32 under
    the interpreter (cpu), whose 16-bit dot is not the devices'."""
    if x.device.type == "cpu":
        return tl.float32
    if x.dtype == w.dtype == torch.bfloat16:
        return tl.bfloat16
    if x.dtype == w.dtype == torch.float16:
        return tl.float16
    return tl.float32


def _tiles(device: torch.device, columns: int, reduction: int) -> tuple[int, int]:
    """``(BLOCK_cols, BLOCK_K)``: powers of two >= tl.dot's minimum, the K tile bounded by the UB (fp32
    tiles of rows, columns and the accumulator live at once)."""
    return _tiles_for(geometry(device), columns, reduction)


@functools.lru_cache(maxsize=1024)
def _tiles_for(geo: LaunchGeometry, columns: int, reduction: int) -> tuple[int, int]:
    """:func:`_tiles` of a geometry, remembered: launches repeat a handful of layer shapes, and the host
    arithmetic cost several microseconds a launch."""
    block_cols = max(_DOT_MIN, min(64, next_power_of_2(columns)))
    block_k = geo.max_block(4, _DOT_MIN + block_cols, cap=max(_DOT_MIN, min(256, next_power_of_2(reduction))))
    return block_cols, max(_DOT_MIN, block_k)


def _token_block(num_tokens: int) -> int:
    """Token tile of the by-token layout: wider tiles (more weight reuse) as the batch grows."""
    return _DOT_MIN if num_tokens <= 64 else 32 if num_tokens <= 256 else 64


@functools.lru_cache(maxsize=4096)
def _by_token_plan(
    geo: LaunchGeometry, tokens: int, loras: int, columns: int, reduction: int, split_k: int | None
) -> tuple[int, int, int, int, tuple[int, int, int]]:
    """``(BLOCK_N, BLOCK_K, BLOCK_M, SPLIT_K, grid)`` of a by-token launch, remembered (decode repeats a
    handful of shapes). ``split_k`` None: the reduction splits that bring a small batch near one program per
    core (1: no split)."""
    block_n, block_k = _tiles_for(geo, columns, reduction)
    block_m = _token_block(tokens)
    tiles = cdiv(tokens, block_m) * cdiv(columns, block_n)
    if split_k is None:
        split_k = max(1, min(cdiv(reduction, block_k), geo.persistent_programs() // max(1, tiles)))
    return (
        block_n,
        block_k,
        block_m,
        split_k,
        (loras, cdiv(tokens, block_m), cdiv(columns, block_n) * split_k),
    )


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
    """One segmented :func:`_lora_matmul_kernel` launch over the runs: ``w`` is ``[L, columns, reduction]``."""
    runs, columns, reduction = seq_loras.shape[0], w.shape[1], w.shape[2]
    if runs == 0 or max_len == 0:
        return
    block_n, block_k = _tiles(x.device, columns, reduction)
    grid = (runs, cdiv(max_len, _DOT_MIN), cdiv(columns, block_n))
    _lora_matmul_kernel[grid](
        x, x.stride(0), w, w.stride(0), w.stride(1), out, out.stride(0),
        seq_starts, seq_lens, seq_loras, out, seq_lens, 0, reduction, columns, offset, scale,
        ADD_INPUTS=add_inputs, BY_TOKEN=False, SPLIT_K=1, DOT_DTYPE=_dot_dtype(x, w),
        BLOCK_M=_DOT_MIN, BLOCK_N=block_n, BLOCK_K=block_k,
    )  # fmt: skip


def _launch_by_token(
    x: torch.Tensor,
    w: torch.Tensor,
    out: torch.Tensor,
    token_lora_indices: torch.Tensor,
    offset: int,
    scale: float,
    *,
    add_inputs: bool,
    split_k: int | None,
) -> None:
    """One by-token :func:`_lora_matmul_kernel` launch: ``w`` is ``[L, columns, reduction]``."""
    tokens, (loras, columns, reduction) = x.shape[0], w.shape
    if tokens == 0:
        return
    block_n, block_k, block_m, split_k, grid = _by_token_plan(
        geometry(x.device), tokens, loras, columns, reduction, split_k
    )
    part, counter = out, token_lora_indices
    if split_k > 1:
        tiles = loras * grid[1] * (grid[2] // split_k)
        part = scratch("lora.partials", tiles * split_k * block_m * block_n, torch.float32, x.device)
        counter = counters("lora.tiles", tiles, x.device)
    _lora_matmul_kernel[grid](
        x, x.stride(0), w, w.stride(0), w.stride(1), out, out.stride(0),
        token_lora_indices, token_lora_indices, token_lora_indices, part, counter,
        tokens, reduction, columns, offset, scale,
        ADD_INPUTS=add_inputs, BY_TOKEN=True, SPLIT_K=split_k, DOT_DTYPE=_dot_dtype(x, w),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
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
    x: torch.Tensor,
    a: torch.Tensor,
    out: torch.Tensor,
    token_lora_indices: torch.Tensor,
    scale: float,
    *,
    split_k: int | None = None,
) -> None:
    """``split_k``: reduction splits (default: by the batch and the device's cores)."""
    _rows_contiguous(x=x, lora_a=a, out=out)
    _launch_by_token(x, a, out, token_lora_indices, 0, float(scale), add_inputs=False, split_k=split_k)


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
    _rows_contiguous(z=z, lora_b=b, out=out)
    _launch_by_token(z, b, out, token_lora_indices, offset, 1.0, add_inputs=add_inputs, split_k=1)
