"""W8A8SC weight compression: the reference encoding of ModelSlim's compressed sparse int8 weights.

What is public — CANN's ``LinearSparseOperation`` and ``aclnnMatmulCompressDequant`` documentation, msModelSlim's
``weight_compression`` guide and vllm-ascend's 310P W8A8SC scheme: ModelSlim's compressor losslessly compresses a
layer's (sparse) int8 weight into three tensors, ``weight`` int8 ``[c]`` with ``0 < c <= k * n``, ``index`` int8
``[k_index * n_index * 8]`` (``k_index = ceil(k1 / tilingK)``, ``n_index = ceil(n1 / tilingN)``, ``k1 = k / 32``,
``n1 = n / 16``: 8 index bytes per block of tilingK x tilingN fractals of 32 x 16 int8 values; tilingK = tilingN
= 8 only) and ``info`` int64 ``[5]`` (tilingN, tilingK, the original shape, the block traversal direction); the
310P matmul unzips in place: ``y = (x @ unzip(weight, index, info) + quant_bias) * deq_scale``.

The byte layout inside a block and an index entry is not published (the compressor is a compiled CANN component),
so this module defines it; the exporter writes it and the reference device reads it:

- the compressed matrix is the checkpoint's ``[n, k]`` = ``[out, in]`` int8 weight, cut into blocks of 128 rows x
  256 columns (tilingN 16-row x tilingK 32-column fractals; edge blocks are smaller);
- blocks are stored back to back in traversal order: direction 0 visits the block grid row by row (the column
  block fastest), direction 1 column by column;
- a block is stored raw (its values row-major; length = its element count) or as a bitmap (``ceil(elements / 8)``
  bytes, bit ``i`` least-significant-first set where element ``i`` is non-zero) followed by its non-zero values,
  whichever is shorter — so ``c <= k * n`` always;
- an index entry (8 bytes per block, traversal order) holds the block's byte length and its non-zero count, each
  a little-endian uint32;
- ``info = (tilingN, tilingK, n, k, direction)``.

A compressed weight is read only when every length, count and bit agrees with this layout; anything else is
refused with :class:`CompressedFormatError` naming the tensor, the field and the allowed values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

TILING = 8
"""tilingK = tilingN: the only value CANN's sparse matmul takes."""
FRACTAL_ROWS, FRACTAL_COLS = 16, 32
BLOCK_ROWS, BLOCK_COLS = FRACTAL_ROWS * TILING, FRACTAL_COLS * TILING
INDEX_BYTES = 8
INFO_FIELDS: tuple[str, ...] = ("tiling_n", "tiling_k", "rows", "cols", "direction")
DIRECTIONS: tuple[int, ...] = (0, 1)
"""Block traversal: 0 = row by row over the block grid, 1 = column by column."""


class CompressedFormatError(ValueError):
    """Compressed tensors that do not decode: ``field`` names the tensor (and part), with what was expected."""

    def __init__(self, field: str, expected: str, got: str) -> None:
        self.field, self.expected, self.got = field, expected, got
        super().__init__(f"{field}: expected {expected}, got {got}")


@dataclass(frozen=True)
class CompressedWeight:
    """One compressed ``[rows, cols]`` int8 weight: ``weight`` int8 ``[c]``, ``index`` int8, ``info`` int64 ``[5]``."""

    weight: torch.Tensor
    index: torch.Tensor
    info: torch.Tensor


def index_size(rows: int, cols: int) -> int:
    """Bytes of the index of a ``[rows, cols]`` weight (the documented ``k_index * n_index * 8``)."""
    return math.ceil(cols / BLOCK_COLS) * math.ceil(rows / BLOCK_ROWS) * INDEX_BYTES


def _blocks(rows: int, cols: int, direction: int) -> list[tuple[int, int, int, int]]:
    """``(r0, r1, c0, c1)`` of every block in traversal order."""
    row_starts = range(0, rows, BLOCK_ROWS)
    col_starts = range(0, cols, BLOCK_COLS)
    grid = (
        [(r, c) for r in row_starts for c in col_starts]
        if direction == 0
        else [(r, c) for c in col_starts for r in row_starts]
    )
    return [(r, min(r + BLOCK_ROWS, rows), c, min(c + BLOCK_COLS, cols)) for r, c in grid]


def compress_weight(weight: torch.Tensor, direction: int = 0) -> CompressedWeight:
    """Compress an int8 ``[rows, cols]`` weight (lossless; sparse blocks shrink to bitmap + non-zeros)."""
    if weight.dtype != torch.int8 or weight.dim() != 2 or weight.numel() == 0:
        raise CompressedFormatError(
            "weight", "a non-empty 2-D int8 [out, in] tensor", f"{weight.dtype} {tuple(weight.shape)}"
        )
    if isinstance(direction, bool) or direction not in DIRECTIONS:
        raise CompressedFormatError("direction", f"one of {', '.join(map(str, DIRECTIONS))}", repr(direction))
    rows, cols = weight.shape
    values = weight.detach().cpu().numpy()
    payloads: list[np.ndarray] = []
    entries: list[tuple[int, int]] = []
    for r0, r1, c0, c1 in _blocks(rows, cols, direction):
        block = values[r0:r1, c0:c1].reshape(-1)
        nonzero = block != 0
        nnz = int(nonzero.sum())
        bitmap_len = math.ceil(block.size / 8)
        if bitmap_len + nnz < block.size:
            payload = np.concatenate([np.packbits(nonzero, bitorder="little").view(np.int8), block[nonzero]])
        else:
            payload = block
        payloads.append(payload)
        entries.append((payload.size, nnz))
    index = np.asarray(entries, dtype="<u4").reshape(-1).view(np.int8)
    info = torch.tensor([TILING, TILING, rows, cols, direction], dtype=torch.int64)
    return CompressedWeight(
        torch.from_numpy(np.concatenate(payloads).astype(np.int8)), torch.from_numpy(index.copy()), info
    )


def _info_fields(info: torch.Tensor, field: str) -> tuple[int, int, int]:
    """Validated ``(rows, cols, direction)`` of one info record."""
    values = [int(v) for v in info.tolist()]
    for position, expected in ((0, TILING), (1, TILING)):
        if values[position] != expected:
            raise CompressedFormatError(
                f"{field}[{position}] ({INFO_FIELDS[position]})",
                f"{expected} (the only tiling CANN takes)",
                str(values[position]),
            )
    for position in (2, 3):
        if values[position] <= 0:
            raise CompressedFormatError(
                f"{field}[{position}] ({INFO_FIELDS[position]})", "a positive size", str(values[position])
            )
    if values[4] not in DIRECTIONS:
        raise CompressedFormatError(
            f"{field}[4] (direction)", f"one of {', '.join(map(str, DIRECTIONS))}", str(values[4])
        )
    return values[2], values[3], values[4]


def _entries(index: torch.Tensor) -> np.ndarray:
    """``[blocks, 2]`` (byte length, non-zero count) of an index."""
    raw = index.detach().cpu().contiguous().numpy().view(np.uint8)
    return raw.view("<u4").reshape(-1, 2).astype(np.int64)


def decompress_weight(weight: torch.Tensor, index: torch.Tensor, info: torch.Tensor) -> torch.Tensor:
    """The int8 ``[rows, cols]`` weight that ``(weight, index, info)`` encode (the exact inverse of
    :func:`compress_weight`); :class:`CompressedFormatError` names the first inconsistency."""
    for name, tensor, dtype in (
        ("weight", weight, torch.int8),
        ("index", index, torch.int8),
        ("info", info, torch.int64),
    ):
        if tensor.dtype != dtype or tensor.dim() != 1 or tensor.numel() == 0:
            raise CompressedFormatError(
                name, f"a non-empty 1-D {dtype} tensor", f"{tensor.dtype} {tuple(tensor.shape)}"
            )
    if info.numel() != len(INFO_FIELDS):
        raise CompressedFormatError(
            "info", f"{len(INFO_FIELDS)} values ({', '.join(INFO_FIELDS)})", f"{info.numel()}"
        )
    rows, cols, direction = _info_fields(info, "info")
    if index.numel() != index_size(rows, cols):
        raise CompressedFormatError(
            "index",
            f"{index_size(rows, cols)} bytes (8 per {BLOCK_ROWS}x{BLOCK_COLS} block of a [{rows}, {cols}] weight)",
            f"{index.numel()}",
        )
    entries = _entries(index)
    if int(entries[:, 0].sum()) != weight.numel():
        raise CompressedFormatError(
            "weight",
            f"{int(entries[:, 0].sum())} bytes (the sum of the index's block lengths)",
            f"{weight.numel()}",
        )
    data = weight.detach().cpu().numpy()
    out = np.zeros((rows, cols), dtype=np.int8)
    start = 0
    for b, ((r0, r1, c0, c1), (length, nnz)) in enumerate(
        zip(_blocks(rows, cols, direction), entries, strict=True)
    ):
        size = (r1 - r0) * (c1 - c0)
        payload = data[start : start + length]
        start += length
        bitmap_len = math.ceil(size / 8)
        if length == size:
            block = payload
            if int((block != 0).sum()) != nnz:
                raise CompressedFormatError(
                    f"index block {b}",
                    f"non-zero count {int((block != 0).sum())} (that of the raw block)",
                    str(nnz),
                )
        elif length == bitmap_len + nnz and nnz < size:
            bits = np.unpackbits(payload[:bitmap_len].view(np.uint8), bitorder="little")
            if int(bits[:size].sum()) != nnz or bits[size:].any():
                raise CompressedFormatError(
                    f"weight block {b} bitmap",
                    f"{nnz} set bits (the index's count) and none past {size}",
                    f"{int(bits[:size].sum())} set, {int(bits[size:].sum())} past the end",
                )
            values = payload[bitmap_len:]
            if (values == 0).any():
                raise CompressedFormatError(f"weight block {b} values", "non-zero values only", "a stored 0")
            block = np.zeros(size, dtype=np.int8)
            block[bits[:size].astype(bool)] = values
        else:
            raise CompressedFormatError(
                f"index block {b} byte length",
                f"{size} (raw) or {bitmap_len} + {nnz} (bitmap + non-zeros) for a {r1 - r0}x{c1 - c0} block",
                str(length),
            )
        out[r0:r1, c0:c1] = block.reshape(r1 - r0, c1 - c0)
    return torch.from_numpy(out)


def split_shards(weight: torch.Tensor, index: torch.Tensor, info: torch.Tensor) -> list[CompressedWeight]:
    """The per-shard compressed weights of a fused layer, whose shards' tensors are concatenated in shard order
    (one ``info`` record of 5 per shard; each shard's index size follows from its info, its weight size from its
    index)."""
    if info.dtype != torch.int64 or info.dim() != 1 or info.numel() == 0 or info.numel() % len(INFO_FIELDS):
        raise CompressedFormatError(
            "info",
            f"1-D int64 with {len(INFO_FIELDS)} values per fused shard",
            f"{info.dtype} {tuple(info.shape)}",
        )
    if index.dtype != torch.int8 or index.dim() != 1:
        raise CompressedFormatError("index", "a 1-D int8 tensor", f"{index.dtype} {tuple(index.shape)}")
    records = info.reshape(-1, len(INFO_FIELDS))
    shards: list[CompressedWeight] = []
    index_at = weight_at = 0
    for s, record in enumerate(records):
        rows, cols, _ = _info_fields(record, f"info (shard {s})")
        size = index_size(rows, cols)
        if index_at + size > index.numel():
            raise CompressedFormatError(
                "index", f"at least {index_at + size} bytes for the shards' infos", f"{index.numel()}"
            )
        shard_index = index[index_at : index_at + size]
        length = int(_entries(shard_index)[:, 0].sum())
        if weight_at + length > weight.numel():
            raise CompressedFormatError(
                "weight", f"at least {weight_at + length} bytes for the shards' indexes", f"{weight.numel()}"
            )
        shards.append(CompressedWeight(weight[weight_at : weight_at + length], shard_index, record))
        index_at += size
        weight_at += length
    if index_at != index.numel():
        raise CompressedFormatError("index", f"{index_at} bytes (the shards' infos)", f"{index.numel()}")
    if weight_at != weight.numel():
        raise CompressedFormatError("weight", f"{weight_at} bytes (the shards' indexes)", f"{weight.numel()}")
    return shards
