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
#: Widest column tile per launch backend (default 64). CUDA: 128, measured on an H100 (GPU time, 54 rows of
#: ``lora_kernels.py``, 2026-12-06): against 64 it cut expand at 1024 tokens, rank 64, from 28.3 to 21.1 µs and
#: lost nowhere; 256 was slower on expand (0.53-0.92x vLLM's at 1024 tokens).
BLOCK_COLS_CAP = {"cuda": 128}


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
    slices_ptr,
    x_slice_stride,
    out_slice_stride,
    num_tokens,
    reduction,
    columns,
    offset,
    scale,
    ADD_INPUTS: tl.constexpr,
    BY_TOKEN: tl.constexpr,
    SORTED: tl.constexpr,
    SLICES: tl.constexpr,
    SLICES_ALIGNED: tl.constexpr,
    SPLIT_K: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """``out[r, offset+c] (+)= scale * x[r] . w[l, c]`` for the rows ``r`` of adapter ``l >= 0``: shrink is
    ``w = lora_a`` (columns = rank, offset 0), expand ``w = lora_b`` (columns = the slice's width).

    Segmented: program ``(run, tile, col)`` takes rows ``s + tile*BLOCK_M + i < s + n`` of run ``(s, n, l)``.
    By token, ``SORTED``: program ``(l, tile, col*SPLIT_K + k)`` takes tile ``tile`` of adapter ``l``'s tokens,
    ``lens_ptr`` holding the tokens ordered by adapter and ``starts_ptr`` where each adapter's run begins (entry
    ``l + 1``; entry 0 is the tokens without one). By token otherwise: program ``(l, tile, col*SPLIT_K + k)``
    takes the tile's tokens whose ``loras[t] == l`` and the
    ``k``-th of ``SPLIT_K`` interleaved reduction chunks; with ``SPLIT_K > 1`` it stores its partial
    ``[BLOCK_M, BLOCK_N]`` at ``part_ptr`` and the output tile's last split adds the ``SPLIT_K`` partials.

    ``SLICES > 1`` (a merged layer's slices in one launch): axis 0 is ``unit * SLICES + slice``; slice ``s``
    reads ``x + s * x_slice_stride`` and writes ``out + s * out_slice_stride``, and its row of ``slices_ptr``
    gives its weights' element offset from ``w_ptr``, their adapter stride, its columns and its ``offset``
    (``SLICES_ALIGNED``: the offsets and strides are multiples of 16 elements)."""
    tiles = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    col_split = tl.program_id(2)
    cols = (col_split // SPLIT_K) * BLOCK_N + tl.arange(0, BLOCK_N)
    k_first = (col_split % SPLIT_K) * BLOCK_K
    unit = tl.program_id(0)
    if SLICES > 1:
        piece = unit % SLICES
        unit = unit // SLICES
        meta = slices_ptr + piece * 4
        w_offset = tl.load(meta)
        w_stride_lora = tl.load(meta + 1)
        columns = tl.load(meta + 2)
        offset = tl.load(meta + 3)
        if SLICES_ALIGNED:  # what the scalar arguments' specialization tells the compiler (vector loads)
            w_offset = tl.multiple_of(w_offset, 16)
            w_stride_lora = tl.multiple_of(w_stride_lora, 16)
            offset = tl.multiple_of(offset, 16)
        w_ptr += w_offset
        x_ptr += piece.to(tl.int64) * x_slice_stride
        out_ptr += piece.to(tl.int64) * out_slice_stride
    if BY_TOKEN and SORTED:  # the adapter's own tokens: order[starts[l+1] + tile rows] below starts[l+2]
        lora = unit.to(tl.int64)
        first = tl.load(starts_ptr + lora + 1)
        at = first + tiles
        row_ok = at < tl.load(starts_ptr + lora + 2)
        rows = tl.load(lens_ptr + at, mask=row_ok, other=0).to(tl.int64)
        row_ok &= rows < num_tokens
    elif BY_TOKEN:
        lora = unit.to(tl.int64)
        in_batch = tiles < num_tokens
        token_lora = tl.load(loras_ptr + tiles, mask=in_batch, other=-1).to(tl.int64)
        row_ok = in_batch & (token_lora == lora)
        rows = tiles.to(tl.int64)
    else:
        run = unit
        lora = tl.load(loras_ptr + run).to(tl.int64)
        length = tl.load(lens_ptr + run)
        row_ok = tiles < tl.where(lora >= 0, length, 0)  # tokens without an adapter: no rows
        rows = tl.load(starts_ptr + run).to(tl.int64) + tiles
    col_ok = cols < columns
    if (tl.max(row_ok.to(tl.int32), axis=0) > 0) & (tl.max(col_ok.to(tl.int32), axis=0) > 0):
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
    block_cols = max(_DOT_MIN, min(BLOCK_COLS_CAP.get(geo.backend, 64), next_power_of_2(columns)))
    block_k = geo.max_block(4, _DOT_MIN + block_cols, cap=max(_DOT_MIN, min(256, next_power_of_2(reduction))))
    return block_cols, max(_DOT_MIN, block_k)


def _token_block(num_tokens: int) -> int:
    """Token tile of the by-token layout: wider tiles (more weight reuse) as the batch grows."""
    return _DOT_MIN if num_tokens <= 64 else 32 if num_tokens <= 256 else 64


@functools.lru_cache(maxsize=4096)
def _by_token_plan(
    geo: LaunchGeometry,
    tokens: int,
    loras: int,
    columns: int,
    reduction: int,
    split_k: int | None,
    slices: int = 1,
) -> tuple[int, int, int, int, tuple[int, int, int]]:
    """``(BLOCK_N, BLOCK_K, BLOCK_M, SPLIT_K, grid)`` of a by-token launch, remembered (decode repeats a
    handful of shapes). ``split_k`` None: the reduction splits that bring a small batch near one program per
    core (1: no split). ``columns``: the widest slice's."""
    block_n, block_k = _tiles_for(geo, columns, reduction)
    block_m = _token_block(tokens)
    tiles = slices * cdiv(tokens, block_m) * cdiv(columns, block_n)
    if split_k is None:
        split_k = max(1, min(cdiv(reduction, block_k), geo.persistent_programs() // max(1, tiles)))
    return (
        block_n,
        block_k,
        block_m,
        split_k,
        (loras * slices, cdiv(tokens, block_m), cdiv(columns, block_n) * split_k),
    )


#: A merged layer's slice rows (see :meth:`Slices.table`), by the weights' addresses and layouts and the offsets.
_SLICE_TABLES: dict[tuple[object, ...], tuple[torch.Tensor, bool]] = {}
_SLICE_TABLES_CAP = 4096


class Slices:
    """The slices of one launch: their weights ``[L, (1,) columns_i, reduction]`` (one dtype, one column
    stride), each slice's output column offset, and the input / output strides between consecutive slices
    (0: shared)."""

    __slots__ = ("offsets", "out_stride", "weights", "x_stride")

    def __init__(
        self, weights: tuple[torch.Tensor, ...], offsets: tuple[int, ...], x_stride: int, out_stride: int
    ) -> None:
        self.weights, self.offsets, self.x_stride, self.out_stride = weights, offsets, x_stride, out_stride

    def table(self) -> tuple[torch.Tensor, bool]:
        """``[S, 4]`` int64 on the weights' device: slice ``i``'s weights as an element offset from slice 0's,
        their adapter stride, its columns, its output offset; and whether the offsets and strides are all
        multiples of 16 elements. Built once per layer (weights stay in place): the first launch of a layer
        must be eager, as vLLM's warm-up runs are."""
        key = (self.offsets, *((w.data_ptr(), w.shape, w.stride()) for w in self.weights))
        entry = _SLICE_TABLES.get(key)
        if entry is None:
            w0 = self.weights[0]
            size = w0.element_size()
            rows = []
            for i, (w, offset) in enumerate(zip(self.weights, self.offsets, strict=True)):
                gap = w.data_ptr() - w0.data_ptr()
                if w.dtype != w0.dtype or w.stride(-2) != w0.stride(-2) or gap % size:
                    raise ValueError(
                        f"lora slice {i}: the slices must share a dtype and a column stride and lie "
                        "element-aligned, got "
                        f"{[(str(v.dtype), v.stride(), v.data_ptr() % 64) for v in self.weights]}"
                    )
                rows.append([gap // size, w.stride(0), w.shape[-2], offset])
            if len(_SLICE_TABLES) >= _SLICE_TABLES_CAP:
                _SLICE_TABLES.clear()
            aligned = all(r[0] % 16 == 0 and r[1] % 16 == 0 and r[3] % 16 == 0 for r in rows)
            entry = _SLICE_TABLES[key] = (torch.tensor(rows, dtype=torch.int64).to(w0.device), aligned)
        return entry


def _single(w: torch.Tensor, offset: int) -> Slices:
    return Slices((w,), (offset,), 0, 0)


def reserve_split_counters(device: torch.device, max_loras: int) -> torch.Tensor:
    """Allocate (zeroed, now) the split reduction's tile counters for up to ``max_loras`` adapter slots: a split
    happens only below one program per core, so a launch has at most ``max_loras`` times the device's persistent
    programs of split tiles (3 slices included). Reserved eagerly, no later launch (a captured one, whose
    zeroing would run only at replay) allocates them."""
    return counters("lora.tiles", max(1, max_loras) * geometry(device).persistent_programs(), device)


def _launch(
    x: torch.Tensor,
    slices: Slices,
    out: torch.Tensor,
    seq_starts: torch.Tensor,
    seq_lens: torch.Tensor,
    seq_loras: torch.Tensor,
    max_len: int,
    scale: float,
    *,
    add_inputs: bool,
) -> None:
    """One segmented :func:`_lora_matmul_kernel` launch over the runs and the slices."""
    w = slices.weights[0]
    count, reduction = len(slices.weights), w.shape[-1]
    columns = max(v.shape[-2] for v in slices.weights)
    runs = seq_loras.shape[0]
    if runs == 0 or max_len == 0:
        return
    block_n, block_k = _tiles(x.device, columns, reduction)
    grid = (runs * count, cdiv(max_len, _DOT_MIN), cdiv(columns, block_n))
    table, aligned = slices.table() if count > 1 else (seq_lens, False)
    _lora_matmul_kernel[grid](
        x, x.stride(-2), w, w.stride(0), w.stride(-2), out, out.stride(-2),
        seq_starts, seq_lens, seq_loras, out, seq_lens, table, slices.x_stride, slices.out_stride,
        0, reduction, columns, slices.offsets[0], scale,
        ADD_INPUTS=add_inputs, BY_TOKEN=False, SORTED=False, SLICES=count, SLICES_ALIGNED=aligned, SPLIT_K=1, DOT_DTYPE=_dot_dtype(x, w),
        BLOCK_M=_DOT_MIN, BLOCK_N=block_n, BLOCK_K=block_k,
    )  # fmt: skip


def _launch_by_token(
    x: torch.Tensor,
    slices: Slices,
    out: torch.Tensor,
    token_lora_indices: torch.Tensor,
    scale: float,
    *,
    add_inputs: bool,
    split_k: int | None,
    token_order: torch.Tensor | None = None,
    lora_starts: torch.Tensor | None = None,
) -> None:
    """One by-token :func:`_lora_matmul_kernel` launch over the tokens and the slices; with ``token_order`` /
    ``lora_starts`` (the tokens ordered by adapter) each program takes only its adapter's tokens."""
    w = slices.weights[0]
    tokens, loras, reduction, count = x.shape[-2], w.shape[0], w.shape[-1], len(slices.weights)
    if tokens == 0:
        return
    columns = max(v.shape[-2] for v in slices.weights)
    block_n, block_k, block_m, split_k, grid = _by_token_plan(
        geometry(x.device), tokens, loras, columns, reduction, split_k, count
    )
    part, counter = out, token_lora_indices
    if split_k > 1:
        tiles = grid[0] * grid[1] * (grid[2] // split_k)
        part = scratch("lora.partials", tiles * split_k * block_m * block_n, torch.float32, x.device)
        counter = counters("lora.tiles", tiles, x.device)
    table, aligned = slices.table() if count > 1 else (token_lora_indices, False)
    ordered = token_order is not None and lora_starts is not None
    starts = lora_starts if lora_starts is not None else token_lora_indices
    order = token_order if token_order is not None else token_lora_indices
    _lora_matmul_kernel[grid](
        x, x.stride(-2), w, w.stride(0), w.stride(-2), out, out.stride(-2),
        starts, order, token_lora_indices, part, counter,
        table, slices.x_stride, slices.out_stride, tokens, reduction, columns, slices.offsets[0], scale,
        ADD_INPUTS=add_inputs, BY_TOKEN=True, SORTED=ordered, SLICES=count, SLICES_ALIGNED=aligned, SPLIT_K=split_k,
        DOT_DTYPE=_dot_dtype(x, w), BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
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
    _launch(x, _single(a, 0), out, seq_starts, seq_lens, seq_loras, max_len, float(scale), add_inputs=False)


def lora_shrink_tokens(
    x: torch.Tensor,
    a: torch.Tensor,
    out: torch.Tensor,
    token_lora_indices: torch.Tensor,
    scale: float,
    token_order: torch.Tensor | None = None,
    lora_starts: torch.Tensor | None = None,
    *,
    split_k: int | None = None,
) -> None:
    """``split_k``: reduction splits (default: by the batch and the device's cores)."""
    _rows_contiguous(x=x, lora_a=a, out=out)
    _launch_by_token(
        x, _single(a, 0), out, token_lora_indices, float(scale), add_inputs=False, split_k=split_k,
        token_order=token_order, lora_starts=lora_starts,
    )  # fmt: skip


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
    _launch(z, _single(b, offset), out, seq_starts, seq_lens, seq_loras, max_len, 1.0, add_inputs=add_inputs)


def lora_expand_tokens(
    z: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor,
    token_lora_indices: torch.Tensor,
    offset: int,
    add_inputs: bool,
    token_order: torch.Tensor | None = None,
    lora_starts: torch.Tensor | None = None,
) -> None:
    _rows_contiguous(z=z, lora_b=b, out=out)
    _launch_by_token(
        z, _single(b, offset), out, token_lora_indices, 1.0, add_inputs=add_inputs, split_k=1,
        token_order=token_order, lora_starts=lora_starts,
    )  # fmt: skip


def _weights_contiguous(weights: tuple[torch.Tensor, ...]) -> None:
    for i, w in enumerate(weights):
        if w.stride(-1) != 1:
            raise ValueError(f"lora slice {i} must have a contiguous last axis, got strides {w.stride()}")


def _shrink_slices(x: torch.Tensor, weights: tuple[torch.Tensor, ...], out: torch.Tensor) -> Slices:
    _rows_contiguous(x=x, out=out)
    _weights_contiguous(weights)
    return Slices(weights, (0,) * len(weights), 0, out.stride(0))


def _expand_slices(
    z: torch.Tensor, weights: tuple[torch.Tensor, ...], out: torch.Tensor, offsets: tuple[int, ...]
) -> Slices:
    _rows_contiguous(z=z, out=out)
    _weights_contiguous(weights)
    return Slices(weights, offsets, z.stride(0), 0)


def lora_shrink_slices(
    x: torch.Tensor,
    weights: tuple[torch.Tensor, ...],
    out: torch.Tensor,
    seq_starts: torch.Tensor,
    seq_lens: torch.Tensor,
    seq_loras: torch.Tensor,
    max_len: int,
    scale: float,
) -> None:
    """Segmented shrink of every slice in one launch: ``out[i]`` gets slice ``i``."""
    slices = _shrink_slices(x, weights, out)
    _launch(x, slices, out, seq_starts, seq_lens, seq_loras, max_len, float(scale), add_inputs=False)


def lora_shrink_tokens_slices(
    x: torch.Tensor,
    weights: tuple[torch.Tensor, ...],
    out: torch.Tensor,
    token_lora_indices: torch.Tensor,
    scale: float,
    token_order: torch.Tensor | None = None,
    lora_starts: torch.Tensor | None = None,
    *,
    split_k: int | None = None,
) -> None:
    """By-token shrink of every slice in one launch: ``out[i]`` gets slice ``i``."""
    slices = _shrink_slices(x, weights, out)
    _launch_by_token(
        x, slices, out, token_lora_indices, float(scale), add_inputs=False, split_k=split_k,
        token_order=token_order, lora_starts=lora_starts,
    )  # fmt: skip


def lora_expand_slices(
    z: torch.Tensor,
    weights: tuple[torch.Tensor, ...],
    out: torch.Tensor,
    seq_starts: torch.Tensor,
    seq_lens: torch.Tensor,
    seq_loras: torch.Tensor,
    max_len: int,
    offsets: tuple[int, ...],
    add_inputs: bool,
) -> None:
    """Segmented expand of every slice in one launch: ``z[i]`` through slice ``i`` into ``out`` at ``offsets[i]``."""
    slices = _expand_slices(z, weights, out, offsets)
    _launch(z, slices, out, seq_starts, seq_lens, seq_loras, max_len, 1.0, add_inputs=add_inputs)


def lora_expand_tokens_slices(
    z: torch.Tensor,
    weights: tuple[torch.Tensor, ...],
    out: torch.Tensor,
    token_lora_indices: torch.Tensor,
    offsets: tuple[int, ...],
    add_inputs: bool,
    token_order: torch.Tensor | None = None,
    lora_starts: torch.Tensor | None = None,
) -> None:
    """By-token expand of every slice in one launch: ``z[i]`` through slice ``i`` into ``out`` at ``offsets[i]``."""
    slices = _expand_slices(z, weights, out, offsets)
    _launch_by_token(
        z, slices, out, token_lora_indices, 1.0, add_inputs=add_inputs, split_k=1,
        token_order=token_order, lora_starts=lora_starts,
    )  # fmt: skip
