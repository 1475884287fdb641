"""Triton :func:`vllm_ascend.kernels.compute_slot_mapping`."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["num_tokens"])
def _slot_mapping_kernel(
    table_ptr,
    table_stride,
    req_ptr,
    pos_ptr,
    out_ptr,
    num_tokens,
    block_size,
    world,
    rank,
    interleave,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < num_tokens
    pos = tl.load(pos_ptr + offs, mask=mask, other=0).to(tl.int64)
    req = tl.load(req_ptr + offs, mask=mask, other=0).to(tl.int64)
    virtual_block = block_size * world
    block = tl.load(table_ptr + req * table_stride + pos // virtual_block, mask=mask, other=0).to(tl.int64)
    off = pos % virtual_block
    owner = (off // interleave) % world
    local = (off // (world * interleave)) * interleave + off % interleave
    slot = tl.where(owner == rank, block * block_size + local, -1)
    tl.store(out_ptr + offs, slot, mask=mask)


def compute_slot_mapping(
    block_table: torch.Tensor,
    req_indices: torch.Tensor,
    positions: torch.Tensor,
    block_size: int,
    dcp_world_size: int = 1,
    dcp_rank: int = 0,
    interleave_size: int = 1,
) -> torch.Tensor:
    if block_table.stride(1) != 1:
        raise ValueError(f"block_table rows must be contiguous, got stride {block_table.stride()}")
    num_tokens = positions.shape[0]
    out = torch.empty(num_tokens, dtype=torch.int64, device=positions.device)
    if num_tokens == 0:
        return out
    block = 1024
    _slot_mapping_kernel[(triton.cdiv(num_tokens, block),)](
        block_table,
        block_table.stride(0),
        req_indices,
        positions,
        out,
        num_tokens,
        block_size,
        dcp_world_size,
        dcp_rank,
        interleave_size,
        BLOCK=block,
    )
    return out
