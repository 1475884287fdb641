"""KV cache block tables: request rows of physical block ids, slot mapping, three views.

A :class:`BlockTable` keeps, per request row, the physical blocks of one KV cache group. The
host copy (a pinned CPU tensor shared with a numpy array) is edited by row operations and
committed to the device once per step; the slot mapping (token -> ``block * block_size +
offset``, ``-1`` for padding) is computed on the device by ``vllm_ascend.kernels``. With decode context parallelism
(DCP) the KV of a sequence is interleaved over ranks in chunks of
``cp_kv_cache_interleave_size`` tokens and each rank stores only its own chunks.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from vllm.v1.utils import CpuGpuBuffer
from vllm.v1.worker.block_table import SlotMappingMode

import vllm_ascend.kernels as kernels

PAD_SLOT_ID = -1
#: Block-table rows are padded so that their width covers a multiple of this many tokens.
TOKEN_ALIGNMENT = 128


def aligned_width(max_num_blocks: int, block_size: int, token_alignment: int | None = TOKEN_ALIGNMENT) -> int:
    """Row width (in blocks) rounded up so the row covers a multiple of ``token_alignment`` tokens."""
    if token_alignment is None:
        return max_num_blocks
    if token_alignment <= 0:
        raise ValueError(f"token_alignment={token_alignment} is invalid; allowed: a positive integer or None")
    step = token_alignment // math.gcd(token_alignment, block_size)
    return -(-max_num_blocks // step) * step


def token_request_indices(query_start_loc: torch.Tensor, num_reqs: int, num_tokens: int) -> torch.Tensor:
    """Row of each of the ``num_tokens`` scheduled tokens, from ``query_start_loc [num_reqs + 1]``."""
    counts = (query_start_loc[1 : num_reqs + 1] - query_start_loc[:num_reqs]).to(torch.int64)
    return torch.repeat_interleave(
        torch.arange(num_reqs, device=query_start_loc.device), counts, output_size=num_tokens
    )


def kv_blocks_to_kernel_blocks(block_ids: np.ndarray | list[int], blocks_per_kv_block: int) -> np.ndarray:
    """Split each allocation block into ``blocks_per_kv_block`` consecutive kernel blocks."""
    ids = np.asarray(block_ids, dtype=np.int64)
    if blocks_per_kv_block == 1:
        return ids
    offsets = np.arange(blocks_per_kv_block, dtype=np.int64)
    return (ids[:, None] * blocks_per_kv_block + offsets[None, :]).reshape(-1)


class BlockTable:
    """Block table of one KV cache group."""

    def __init__(
        self,
        block_size: int,
        max_num_reqs: int,
        max_num_blocks_per_req: int,
        max_num_batched_tokens: int,
        pin_memory: bool,
        device: torch.device,
        cp_kv_cache_interleave_size: int = 1,
        slot_mapping_mode: SlotMappingMode = SlotMappingMode.TOKEN_TO_KV_SLOT,
        dcp_world_size: int | None = None,
        dcp_rank: int | None = None,
        kernel_block_size: int | None = None,
    ) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size={block_size} is invalid; allowed: a positive integer")
        kernel_block_size = kernel_block_size or block_size
        if block_size % kernel_block_size != 0:
            raise ValueError(
                f"kernel_block_size={kernel_block_size} is invalid; allowed: a divisor of block_size={block_size}"
            )
        self.max_num_reqs = max_num_reqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.pin_memory = pin_memory
        self.device = device
        # Slots and the device table are in kernel blocks; the scheduler hands out allocation blocks.
        self.blocks_per_kv_block = block_size // kernel_block_size
        self.block_size = kernel_block_size
        self.max_num_blocks_per_req = max_num_blocks_per_req * self.blocks_per_kv_block
        self.slot_mapping_mode = slot_mapping_mode
        self.cp_kv_cache_interleave_size = cp_kv_cache_interleave_size
        if dcp_world_size is None or dcp_rank is None:
            dcp_world_size, dcp_rank = _dcp_group_info()
        self.dcp_world_size = dcp_world_size
        self.dcp_rank = dcp_rank

        self.block_table = CpuGpuBuffer(
            max_num_reqs, self.max_num_blocks_per_req, dtype=torch.int32, device=device, pin_memory=pin_memory
        )
        self.num_blocks_per_row = np.zeros(max_num_reqs, dtype=np.int32)
        self.slot_mapping = CpuGpuBuffer(
            max_num_batched_tokens, dtype=torch.int64, device=device, pin_memory=pin_memory
        )

    # Row operations (host side).
    def append_row(self, block_ids: list[int], row_idx: int) -> None:
        if not block_ids:
            return
        ids = kv_blocks_to_kernel_blocks(block_ids, self.blocks_per_kv_block)
        start = int(self.num_blocks_per_row[row_idx])
        end = start + len(ids)
        if end > self.max_num_blocks_per_req:
            raise ValueError(
                f"request row {row_idx} would hold {end} blocks; the block table allows at most "
                f"{self.max_num_blocks_per_req} (max_model_len / block_size)"
            )
        self.block_table.np[row_idx, start:end] = ids
        self.num_blocks_per_row[row_idx] = end

    def add_row(self, block_ids: list[int], row_idx: int) -> None:
        self.num_blocks_per_row[row_idx] = 0
        self.append_row(block_ids, row_idx)

    def clear_row(self, row_idx: int) -> None:
        n = self.num_blocks_per_row[row_idx]
        self.block_table.np[row_idx, :n] = 0
        self.num_blocks_per_row[row_idx] = 0

    def move_row(self, src: int, tgt: int) -> None:
        n = self.num_blocks_per_row[src]
        table = self.block_table.np
        table[tgt, :n] = table[src, :n]
        self.num_blocks_per_row[tgt] = n
        table[src, :n] = 0
        self.num_blocks_per_row[src] = 0

    def swap_row(self, src: int, tgt: int) -> None:
        rows = [src, tgt]
        self.num_blocks_per_row[rows] = self.num_blocks_per_row[rows[::-1]]
        self.block_table.np[rows] = self.block_table.np[rows[::-1]]

    # Device side.
    def compute_slot_mapping(
        self, num_reqs: int, query_start_loc: torch.Tensor, positions: torch.Tensor
    ) -> None:
        """Fill ``slot_mapping.gpu`` for the scheduled tokens and pad the rest with ``-1``."""
        if self.slot_mapping_mode == SlotMappingMode.NONE:
            return
        num_tokens = positions.shape[0]
        slots = kernels.compute_slot_mapping(
            self.block_table.gpu,
            token_request_indices(query_start_loc, num_reqs, num_tokens),
            positions,
            self.block_size,
            self.dcp_world_size,
            self.dcp_rank,
            self.cp_kv_cache_interleave_size,
        )
        out = self.slot_mapping.gpu
        out[:num_tokens].copy_(slots)
        out[num_tokens:].fill_(PAD_SLOT_ID)

    def commit_block_table(self, num_reqs: int) -> None:
        self.block_table.copy_to_gpu(num_reqs)

    def clear(self) -> None:
        self.block_table.gpu.fill_(0)
        self.block_table.cpu.fill_(0)
        self.num_blocks_per_row[:] = 0

    # The three views.
    def get_device_tensor(self, num_reqs: int) -> torch.Tensor:
        return self.block_table.gpu[:num_reqs]

    def get_cpu_tensor(self) -> torch.Tensor:
        return self.block_table.cpu

    def get_numpy_array(self) -> np.ndarray:
        return self.block_table.np


def _dcp_group_info() -> tuple[int, int]:
    from vllm.distributed import get_dcp_group

    try:
        group = get_dcp_group()
    except AssertionError:  # not initialised (unit tests, tools)
        return 1, 0
    return group.world_size, group.rank_in_group


class MultiGroupBlockTable:
    """One :class:`BlockTable` per KV cache group; row operations are forwarded to all of them."""

    def __init__(
        self,
        max_num_reqs: int,
        max_num_batched_tokens: int,
        pin_memory: bool,
        device: torch.device,
        block_sizes: list[int],
        max_num_blocks: list[int],
        cp_kv_cache_interleave_size: int = 1,
        slot_mapping_modes: list[SlotMappingMode] | None = None,
        kernel_block_sizes: list[int] | None = None,
    ) -> None:
        n = len(block_sizes)
        slot_mapping_modes = slot_mapping_modes or [SlotMappingMode.TOKEN_TO_KV_SLOT] * n
        kernel_block_sizes = kernel_block_sizes or list(block_sizes)
        for name, values in (
            ("max_num_blocks", max_num_blocks),
            ("slot_mapping_modes", slot_mapping_modes),
            ("kernel_block_sizes", kernel_block_sizes),
        ):
            if len(values) != n:
                raise ValueError(f"{name} has {len(values)} entries; expected one per KV cache group ({n})")
        self.block_tables = [
            BlockTable(
                block_size,
                max_num_reqs,
                aligned_width(blocks, block_size, None if mode == SlotMappingMode.NONE else TOKEN_ALIGNMENT),
                max_num_batched_tokens,
                pin_memory,
                device,
                cp_kv_cache_interleave_size,
                slot_mapping_mode=mode,
                kernel_block_size=kernel_size,
            )
            for block_size, blocks, mode, kernel_size in zip(
                block_sizes, max_num_blocks, slot_mapping_modes, kernel_block_sizes, strict=False
            )
        ]

    def append_row(self, block_ids: tuple[list[int], ...], row_idx: int) -> None:
        for table, ids in zip(self.block_tables, block_ids, strict=False):
            table.append_row(ids, row_idx)

    def add_row(self, block_ids: tuple[list[int], ...], row_idx: int) -> None:
        for table, ids in zip(self.block_tables, block_ids, strict=False):
            table.add_row(ids, row_idx)

    def clear_row(self, row_idx: int) -> None:
        for table in self.block_tables:
            table.clear_row(row_idx)

    def move_row(self, src: int, tgt: int) -> None:
        for table in self.block_tables:
            table.move_row(src, tgt)

    def swap_row(self, src: int, tgt: int) -> None:
        for table in self.block_tables:
            table.swap_row(src, tgt)

    def compute_slot_mapping(
        self, num_reqs: int, query_start_loc: torch.Tensor, positions: torch.Tensor
    ) -> None:
        for table in self.block_tables:
            table.compute_slot_mapping(num_reqs, query_start_loc, positions)

    def commit_block_table(self, num_reqs: int) -> None:
        for table in self.block_tables:
            table.commit_block_table(num_reqs)

    def clear(self) -> None:
        for table in self.block_tables:
            table.clear()

    def __getitem__(self, idx: int) -> BlockTable:
        return self.block_tables[idx]


def slot_mapping_kernel_override(
    num_tokens: int,
    max_num_tokens: int,
    query_start_loc_ptr: torch.Tensor,
    positions_ptr: torch.Tensor,
    block_table_ptr: torch.Tensor,
    block_table_stride: int,
    slot_mapping_ptr: torch.Tensor,
    KV_CACHE_BLOCK_SIZE: int,
    TOTAL_CP_WORLD_SIZE: int,
    TOTAL_CP_RANK: int,
    CP_KV_CACHE_INTERLEAVE_SIZE: int,
    PAD_ID: int,
    BLOCK_SIZE: int,
) -> None:
    """Stand-in for vLLM's Triton ``ComputeSlotMappingKernel.kernel`` (same parameter names).

    Writes the (DCP-aware) slot of each of the ``num_tokens`` tokens and ``PAD_ID`` up to
    ``max_num_tokens``; ``BLOCK_SIZE`` is the Triton tile and has no meaning here.
    """
    num_reqs = query_start_loc_ptr.shape[0] - 1
    slots = kernels.compute_slot_mapping(
        block_table_ptr.reshape(-1, block_table_stride),
        token_request_indices(query_start_loc_ptr, num_reqs, num_tokens),
        positions_ptr[:num_tokens],
        KV_CACHE_BLOCK_SIZE,
        TOTAL_CP_WORLD_SIZE,
        TOTAL_CP_RANK,
        CP_KV_CACHE_INTERLEAVE_SIZE,
    )
    slot_mapping_ptr[:num_tokens].copy_(slots)
    slot_mapping_ptr[num_tokens:max_num_tokens].fill_(PAD_ID)


#: vLLM Triton kernels replaced on the Ascend platform (see ``Platform.register_triton_kernel_overrides``).
TRITON_KERNEL_OVERRIDES = {
    "vllm.v1.worker.block_table.ComputeSlotMappingKernel.kernel": slot_mapping_kernel_override,
}
