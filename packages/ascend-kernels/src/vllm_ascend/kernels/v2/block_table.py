"""Overrides of the kernels of vLLM's ``vllm/v1/worker/gpu/block_table.py``: the batch's block tables gathered
from the request states' tables, and each token's KV slot. Block tables arrive as pointer arrays (one
per KV-cache group), read in the references with ``tensor_at``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from vllm_ascend.kernels.v2._launch import Grid, dispatch_v2, grid_dim, host_flat, tensor_at

_VLLM = "vllm.v1.worker.gpu.block_table"


def _table(pointer: int, rows: int, stride: int, device: torch.device) -> torch.Tensor:
    flat = tensor_at(pointer, torch.int32, rows * stride, device)
    return flat.view(rows, stride)


def gather_block_tables_torch(
    grid: Grid,
    batch_idx_to_req_idx: torch.Tensor,
    src_block_table_ptrs: torch.Tensor,
    dst_block_table_ptrs: torch.Tensor,
    block_table_strides: torch.Tensor,
    num_blocks_ptr: torch.Tensor,
    num_blocks_stride: int,
    num_reqs: int,
    BLOCK_SIZE: int,
) -> None:
    """Reference of :func:`gather_block_tables`: per group, ``dst[i, :n] = src[req, :n]`` with ``req =
    batch_idx_to_req_idx[i]`` and ``n = num_blocks[group, req]`` for rows ``i < num_reqs`` (the rest of
    the row untouched), rows ``num_reqs .. grid[1]`` zeroed."""
    groups, batch = grid_dim(grid, 0), grid_dim(grid, 1)
    device = batch_idx_to_req_idx.device
    real = max(0, min(num_reqs, batch))
    reqs = batch_idx_to_req_idx[:real].to(torch.int64)
    rows_needed = int(reqs.max()) + 1 if real else 0
    strides = block_table_strides[:groups].tolist()
    src_ptrs, dst_ptrs = src_block_table_ptrs[:groups].tolist(), dst_block_table_ptrs[:groups].tolist()
    counts = num_blocks_ptr.reshape(-1)
    for group, stride in enumerate(strides):
        dst = _table(dst_ptrs[group], batch, stride, device)
        dst[real:] = 0
        if not real:
            continue
        src = _table(src_ptrs[group], rows_needed, stride, device)
        n = counts[group * num_blocks_stride + reqs]
        copied = torch.arange(stride, device=device)[None, :] < n[:, None]
        dst[:real] = torch.where(copied, src[reqs], dst[:real])


def _per_group(groups: int, *arrays: torch.Tensor) -> list[tuple[int, ...]]:
    """Each KV-cache group's entries of V2's per-group host arrays (table pointers, strides, block sizes, ...),
    as a tuple of ints per group: what the host forms read once per launch."""
    return list(zip(*(array.numpy()[:groups].tolist() for array in arrays), strict=True))


def gather_block_tables_host(
    grid: Grid,
    batch_idx_to_req_idx: torch.Tensor,
    src_block_table_ptrs: torch.Tensor,
    dst_block_table_ptrs: torch.Tensor,
    block_table_strides: torch.Tensor,
    num_blocks_ptr: torch.Tensor,
    num_blocks_stride: int,
    num_reqs: int,
    BLOCK_SIZE: int,
) -> None:
    """:func:`gather_block_tables_torch` on numpy views of host tensors (columns up to the longest row copied)."""
    groups, batch = grid_dim(grid, 0), grid_dim(grid, 1)
    device = batch_idx_to_req_idx.device
    real = max(0, min(num_reqs, batch))
    reqs = batch_idx_to_req_idx.numpy()[:real].astype(np.int64)
    counts = num_blocks_ptr.reshape(-1).numpy()
    params = _per_group(groups, block_table_strides, src_block_table_ptrs, dst_block_table_ptrs)
    for group, (stride, src_ptr, dst_ptr) in enumerate(params):
        dst = _table(dst_ptr, batch, stride, device).numpy()
        dst[real:] = 0
        if not real:
            continue
        src = _table(src_ptr, int(reqs.max()) + 1, stride, device).numpy()
        n = counts[group * num_blocks_stride + reqs]
        width = min(stride, int(n.max()))
        copied = np.arange(width)[None, :] < n[:, None]
        dst[:real, :width] = np.where(copied, src[reqs, :width], dst[:real, :width])


def gather_block_tables(grid: Grid, **arguments: Any) -> None:
    """Per KV-cache group, batch row ``i`` of the destination table = the first ``num_blocks`` entries of
    request ``batch_idx_to_req_idx[i]``'s row of the source table; rows ``num_reqs ..`` of the grid are zeroed
    (graph padding)."""
    device = arguments["batch_idx_to_req_idx"].device
    dispatch_v2(
        "block_table",
        "gather_block_tables",
        gather_block_tables_torch,
        device,
    )(grid, **arguments)


def compute_slot_mappings_torch(
    grid: Grid,
    max_num_tokens: int,
    idx_mapping: torch.Tensor,
    query_start_loc: torch.Tensor,
    pos: torch.Tensor,
    block_table_ptrs: torch.Tensor,
    block_table_strides: torch.Tensor,
    block_sizes: torch.Tensor,
    slot_mapping_enabled: torch.Tensor,
    dcp_sharded: torch.Tensor,
    slot_mappings_ptr: torch.Tensor,
    slot_mappings_stride: int,
    cp_rank: int,
    CP_SIZE: int,
    CP_INTERLEAVE: int,
    PAD_ID: int,
    TRITON_BLOCK_SIZE: int,
) -> None:
    """Reference of :func:`compute_slot_mappings`: per group, token ``t`` of row ``i`` (state ``s``,
    position ``p``, DCP-localised where sharded) gets ``block_table[s, p // bs] * bs + p % bs``, or
    ``PAD_ID`` for ``s < 0``, disabled groups and other ranks' tokens; ``PAD_ID`` from the batch's last
    token to ``max_num_tokens``."""
    groups, num_reqs = grid_dim(grid, 0), grid_dim(grid, 1) - 1
    device = pos.device
    qsl = query_start_loc[: num_reqs + 1].to(torch.int64)
    start, num_tokens = int(qsl[0]), int(qsl[-1])
    owner = torch.searchsorted(
        qsl[1:], torch.arange(start, max(start, num_tokens), device=device), right=True
    )
    positions = pos[start:num_tokens].to(torch.int64)
    token_states = idx_mapping[:num_reqs].to(torch.int64)[owner]
    real = token_states >= 0
    rows_needed = int(token_states.max()) + 1 if owner.numel() else 0
    params = zip(
        block_table_ptrs[:groups].tolist(),
        block_table_strides[:groups].tolist(),
        block_sizes[:groups].tolist(),
        slot_mapping_enabled[:groups].tolist(),
        dcp_sharded[:groups].tolist() if CP_SIZE != 1 else [False] * groups,
        strict=True,
    )
    out = slot_mappings_ptr.reshape(-1)
    for group, (pointer, stride, block_size, enabled, sharded) in enumerate(params):
        row = out[group * slot_mappings_stride : group * slot_mappings_stride + max_num_tokens]
        row[num_tokens:max_num_tokens] = PAD_ID
        if num_tokens <= start:
            continue
        if not enabled:
            row[start:num_tokens] = PAD_ID
            continue
        local, is_local = positions, real
        if sharded:
            virtual = block_size * CP_SIZE
            offsets = positions % virtual
            is_local = real & ((offsets // CP_INTERLEAVE) % CP_SIZE == cp_rank)
            local = (
                (positions // virtual) * block_size
                + (offsets // (CP_INTERLEAVE * CP_SIZE)) * CP_INTERLEAVE
                + (offsets % CP_INTERLEAVE)
            )
        numbers = torch.zeros_like(local)
        if rows_needed > 0:
            table = _table(pointer, rows_needed, stride, device)
            numbers[is_local] = table[token_states[is_local], local[is_local] // block_size].to(torch.int64)
        slots = numbers * block_size + local % block_size
        row[start:num_tokens] = torch.where(is_local, slots, PAD_ID).to(row.dtype)


_compute_slot_mappings_grid = compute_slot_mappings_torch  # the torch form, for the host form's DCP launches


def compute_slot_mappings_host(
    grid: Grid,
    max_num_tokens: int,
    idx_mapping: torch.Tensor,
    query_start_loc: torch.Tensor,
    pos: torch.Tensor,
    block_table_ptrs: torch.Tensor,
    block_table_strides: torch.Tensor,
    block_sizes: torch.Tensor,
    slot_mapping_enabled: torch.Tensor,
    dcp_sharded: torch.Tensor,
    slot_mappings_ptr: torch.Tensor,
    slot_mappings_stride: int,
    cp_rank: int,
    CP_SIZE: int,
    CP_INTERLEAVE: int,
    PAD_ID: int,
    TRITON_BLOCK_SIZE: int,
) -> None:
    """:func:`compute_slot_mappings_torch` on numpy views of host tensors (``query_start_loc`` non-decreasing);
    decode context parallelism (``CP_SIZE > 1``) takes the torch form."""
    if CP_SIZE != 1:
        _compute_slot_mappings_grid(
            grid, max_num_tokens, idx_mapping, query_start_loc, pos, block_table_ptrs, block_table_strides,
            block_sizes, slot_mapping_enabled, dcp_sharded, slot_mappings_ptr, slot_mappings_stride, cp_rank,
            CP_SIZE, CP_INTERLEAVE, PAD_ID, TRITON_BLOCK_SIZE,
        )  # fmt: skip
        return
    groups, num_reqs = grid_dim(grid, 0), grid_dim(grid, 1) - 1
    qsl = query_start_loc.numpy()[: num_reqs + 1].astype(np.int64)
    start, num_tokens = int(qsl[0]), int(qsl[-1])
    token_states = np.repeat(idx_mapping.numpy()[:num_reqs].astype(np.int64), qsl[1:] - qsl[:-1])
    positions = pos.numpy()[start:num_tokens].astype(np.int64)
    real = token_states >= 0
    rows_needed = int(token_states.max()) + 1 if token_states.size else 0
    params = _per_group(groups, block_table_ptrs, block_table_strides, block_sizes, slot_mapping_enabled)
    out = host_flat(slot_mappings_ptr)
    for group, (pointer, stride, block_size, enabled) in enumerate(params):
        row = out[group * slot_mappings_stride : group * slot_mappings_stride + max_num_tokens]
        row[num_tokens:max_num_tokens] = PAD_ID
        if num_tokens <= start:
            continue
        if not enabled or rows_needed <= 0:
            row[start:num_tokens] = PAD_ID
            continue
        table = _table(pointer, rows_needed, stride, pos.device).numpy()
        numbers = np.zeros_like(positions)
        numbers[real] = table[token_states[real], positions[real] // block_size]
        row[start:num_tokens] = np.where(real, numbers * block_size + positions % block_size, PAD_ID)


def compute_slot_mappings(grid: Grid, **arguments: Any) -> None:
    """Per KV-cache group, each scheduled token's slot (``block_table[state, pos // bs] * bs + pos % bs``,
    DCP-interleaved where the group is sharded, ``PAD_ID`` for dummy requests, disabled groups and other
    ranks' tokens) and ``PAD_ID`` from the batch's token count to ``max_num_tokens``."""
    device = arguments["pos"].device
    dispatch_v2(
        "block_table",
        "compute_slot_mappings",
        compute_slot_mappings_torch,
        device,
    )(grid, **arguments)


OVERRIDES: dict[str, Callable[..., Any]] = {
    f"{_VLLM}._gather_block_tables_kernel": gather_block_tables,
    f"{_VLLM}._compute_slot_mappings_kernel": compute_slot_mappings,
}
