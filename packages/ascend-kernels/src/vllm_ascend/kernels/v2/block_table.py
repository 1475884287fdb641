"""Overrides of the kernels of vLLM's ``vllm/v1/worker/gpu/block_table.py``: the batch's block tables gathered
from the request states' tables, and each token's KV slot. Block tables arrive as pointer arrays (one
per KV-cache group), read in the references with ``tensor_at``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from vllm_ascend.kernels.v2._launch import Grid, dispatch_v2, grid_dim, tensor_at

_VLLM = "vllm.v1.worker.gpu.block_table"


def _table(pointers: torch.Tensor, group: int, rows: int, stride: int, device: torch.device) -> torch.Tensor:
    flat = tensor_at(int(pointers[group]), torch.int32, rows * stride, device)
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
    """Reference of :func:`gather_block_tables`."""
    groups, batch = grid_dim(grid, 0), grid_dim(grid, 1)
    device = batch_idx_to_req_idx.device
    reqs = [int(r) for r in batch_idx_to_req_idx[: min(num_reqs, batch)].tolist()]
    counts = num_blocks_ptr.reshape(-1)
    for group in range(groups):
        stride = int(block_table_strides[group])
        dst = _table(dst_block_table_ptrs, group, batch, stride, device)
        dst[len(reqs) :] = 0
        if not reqs:
            continue
        src = _table(src_block_table_ptrs, group, max(reqs) + 1, stride, device)
        for row, req in enumerate(reqs):
            n = int(counts[group * num_blocks_stride + req])
            dst[row, :n] = src[req, :n]


def gather_block_tables(grid: Grid, **arguments: Any) -> None:
    """Per KV-cache group, batch row ``i`` of the destination table = the first ``num_blocks`` entries of
    request ``batch_idx_to_req_idx[i]``'s row of the source table; rows ``num_reqs ..`` of the grid are zeroed
    (graph padding)."""
    device = arguments["batch_idx_to_req_idx"].device
    dispatch_v2("block_table", "gather_block_tables", gather_block_tables_torch, device)(grid, **arguments)


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
    """Reference of :func:`compute_slot_mappings`."""
    groups, num_reqs = grid_dim(grid, 0), grid_dim(grid, 1) - 1
    device = pos.device
    qsl = query_start_loc[: num_reqs + 1].to(torch.int64)
    num_tokens = int(qsl[-1]) if num_reqs >= 0 else 0
    start = int(qsl[0])
    states = idx_mapping[:num_reqs].to(torch.int64)
    owner = torch.repeat_interleave(torch.arange(num_reqs, device=device), qsl[1:] - qsl[:-1])
    positions = pos[start:num_tokens].to(torch.int64)
    token_states = states[owner]
    real = token_states >= 0
    out = slot_mappings_ptr.reshape(-1)
    for group in range(groups):
        row = out[group * slot_mappings_stride : group * slot_mappings_stride + max_num_tokens]
        row[num_tokens:max_num_tokens] = PAD_ID
        if num_tokens == start:
            continue
        block_size = int(block_sizes[group])
        stride = int(block_table_strides[group])
        enabled = bool(slot_mapping_enabled[group])
        local, is_local = positions, torch.ones_like(positions, dtype=torch.bool)
        if CP_SIZE != 1 and bool(dcp_sharded[group]):
            virtual = block_size * CP_SIZE
            offsets = positions % virtual
            is_local = (offsets // CP_INTERLEAVE) % CP_SIZE == cp_rank
            local = (
                (positions // virtual) * block_size
                + (offsets // (CP_INTERLEAVE * CP_SIZE)) * CP_INTERLEAVE
                + (offsets % CP_INTERLEAVE)
            )
        block_index = local // block_size if enabled else torch.zeros_like(local)
        read = is_local & real
        rows_needed = int(token_states.max()) + 1 if bool(real.any()) else 0
        numbers = torch.zeros_like(local)
        if rows_needed:
            table = _table(block_table_ptrs, group, rows_needed, stride, device)
            numbers[read] = table[token_states[read], block_index[read]].to(torch.int64)
        slots = numbers * block_size + local % block_size
        slots = torch.where(is_local, slots, torch.full_like(slots, PAD_ID))
        if not enabled:
            slots = torch.full_like(slots, PAD_ID)
        slots = torch.where(real, slots, torch.full_like(slots, PAD_ID))
        row[start:num_tokens] = slots.to(row.dtype)


def compute_slot_mappings(grid: Grid, **arguments: Any) -> None:
    """Per KV-cache group, each scheduled token's slot (``block_table[state, pos // bs] * bs + pos % bs``,
    DCP-interleaved where the group is sharded, ``PAD_ID`` for dummy requests, disabled groups and other
    ranks' tokens) and ``PAD_ID`` from the batch's token count to ``max_num_tokens``."""
    device = arguments["pos"].device
    dispatch_v2("block_table", "compute_slot_mappings", compute_slot_mappings_torch, device)(
        grid, **arguments
    )


OVERRIDES: dict[str, Callable[..., Any]] = {
    f"{_VLLM}._gather_block_tables_kernel": gather_block_tables,
    f"{_VLLM}._compute_slot_mappings_kernel": compute_slot_mappings,
}
