"""Slot mapping: each token's KV-cache slot from the block table (plain and DCP-interleaved)."""

from __future__ import annotations

import torch

from vllm_ascend.kernels._backend import dispatch

PAD_SLOT_ID = -1


def compute_slot_mapping_torch(
    block_table: torch.Tensor,
    req_indices: torch.Tensor,
    positions: torch.Tensor,
    block_size: int,
    dcp_world_size: int = 1,
    dcp_rank: int = 0,
    interleave_size: int = 1,
) -> torch.Tensor:
    """Reference of :func:`compute_slot_mapping`."""
    pos = positions.to(torch.int64)
    rows = req_indices.to(torch.int64)
    virtual_block = block_size * dcp_world_size
    blocks = block_table.to(torch.int64)[rows, pos // virtual_block]
    offset = pos % virtual_block
    if dcp_world_size == 1:
        return blocks * block_size + offset
    owner = (offset // interleave_size) % dcp_world_size
    local = (offset // (dcp_world_size * interleave_size)) * interleave_size + offset % interleave_size
    return torch.where(owner == dcp_rank, blocks * block_size + local, torch.full_like(pos, PAD_SLOT_ID))


def compute_slot_mapping(
    block_table: torch.Tensor,
    req_indices: torch.Tensor,
    positions: torch.Tensor,
    block_size: int,
    dcp_world_size: int = 1,
    dcp_rank: int = 0,
    interleave_size: int = 1,
) -> torch.Tensor:
    """Slot of each token in the paged KV cache; not in place.

    ``block_table``: ``[R, max_blocks]`` int32/int64 physical block ids per request row.
    ``req_indices``: ``[T]`` int, each token's row; ``positions``: ``[T]`` int, its position.
    Plain (``dcp_world_size == 1``): ``slot = block_table[r, pos // bs] * bs + pos % bs``.
    DCP: a virtual block of ``bs * W`` positions is spread over ``W`` ranks in runs of
    ``interleave_size`` tokens; the token's run owner is ``(off // interleave) % W`` with
    ``off = pos % (bs * W)``, its local offset ``(off // (W * interleave)) * interleave +
    off % interleave``; tokens owned by another rank get ``PAD_SLOT_ID`` (-1).
    Returns ``[T]`` int64.
    """
    if block_size <= 0 or dcp_world_size <= 0 or interleave_size <= 0 or not 0 <= dcp_rank < dcp_world_size:
        raise ValueError(
            f"invalid slot-mapping geometry: block_size={block_size}, dcp_world_size={dcp_world_size}, "
            f"dcp_rank={dcp_rank}, interleave_size={interleave_size}"
        )
    if block_size % interleave_size:
        raise ValueError(f"block_size {block_size} must be a multiple of interleave_size {interleave_size}")
    impl = dispatch("slot_mapping", "compute_slot_mapping", compute_slot_mapping_torch, positions.device)
    return impl(block_table, req_indices, positions, block_size, dcp_world_size, dcp_rank, interleave_size)
