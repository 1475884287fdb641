"""310P block tables: the slot mapping computed in numpy on the host, then copied to the device.

310P has no Triton, and the mapping is a few integer operations per token: the host already holds the
block table (its numpy view is what row operations edit) and the scheduled positions, so the slots are
computed there and copied with one transfer. Same results as ``vllm_ascend.kernels.compute_slot_mapping``
(plain and DCP-interleaved).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from vllm.v1.worker.block_table import SlotMappingMode

import vllm_ascend.runner.block_table as runner_block_table
from vllm_ascend.runner.block_table import PAD_SLOT_ID, BlockTable, MultiGroupBlockTable
from vllm_ascend.runner.patching import replaced_names


def _compute_slot_mapping_numpy(
    block_table: np.ndarray,
    req_indices: np.ndarray,
    positions: np.ndarray,
    block_size: int,
    dcp_world_size: int = 1,
    dcp_rank: int = 0,
    interleave_size: int = 1,
) -> np.ndarray:
    """Slot of each token (``[T]`` int64): ``block_table[r, pos // bs] * bs + pos % bs``; with DCP a
    virtual block of ``bs * W`` positions is spread over ``W`` ranks in runs of ``interleave_size`` tokens
    and tokens of another rank get ``PAD_SLOT_ID`` (the formula of ``kernels.compute_slot_mapping``)."""
    if block_size <= 0 or dcp_world_size <= 0 or interleave_size <= 0 or not 0 <= dcp_rank < dcp_world_size:
        raise ValueError(
            f"invalid slot-mapping geometry: block_size={block_size}, dcp_world_size={dcp_world_size}, "
            f"dcp_rank={dcp_rank}, interleave_size={interleave_size}"
        )
    pos = np.asarray(positions, dtype=np.int64)
    rows = np.asarray(req_indices, dtype=np.int64)
    virtual_block = block_size * dcp_world_size
    blocks = np.asarray(block_table)[rows, pos // virtual_block].astype(np.int64)
    offset = pos % virtual_block
    if dcp_world_size == 1:
        return blocks * block_size + offset
    owner = (offset // interleave_size) % dcp_world_size
    local = (offset // (dcp_world_size * interleave_size)) * interleave_size + offset % interleave_size
    return np.where(owner == dcp_rank, blocks * block_size + local, PAD_SLOT_ID).astype(np.int64)


def _host_array(values: torch.Tensor | np.ndarray, n: int) -> np.ndarray:
    if isinstance(values, torch.Tensor):
        return values[:n].to("cpu", torch.int64).numpy()
    return np.asarray(values[:n], dtype=np.int64)


class BlockTable310(BlockTable):
    """The runner's block table with the slot mapping computed on the host (:func:`_compute_slot_mapping_numpy`)."""

    def compute_slot_mapping(
        self, num_reqs: int, query_start_loc: torch.Tensor | np.ndarray, positions: torch.Tensor | np.ndarray
    ) -> None:
        """Fill ``slot_mapping`` (host and device) for the scheduled tokens and pad the rest with ``-1``.

        ``query_start_loc [>= num_reqs + 1]`` and ``positions [T]`` may be device tensors (vLLM's runner
        passes those: they are copied to the host) or host tensors / numpy arrays.
        """
        if self.slot_mapping_mode == SlotMappingMode.NONE:
            return
        num_tokens = positions.shape[0]
        if num_tokens > self.max_num_batched_tokens:
            raise ValueError(
                f"{num_tokens} scheduled tokens exceed max_num_batched_tokens={self.max_num_batched_tokens}"
            )
        qsl = _host_array(query_start_loc, num_reqs + 1)
        pos = _host_array(positions, num_tokens)
        req_indices = np.repeat(np.arange(num_reqs, dtype=np.int64), np.diff(qsl))
        if req_indices.shape[0] != num_tokens:
            raise ValueError(
                f"query_start_loc covers {req_indices.shape[0]} tokens but positions has {num_tokens}"
            )
        slots = self.slot_mapping.np
        slots[:num_tokens] = _compute_slot_mapping_numpy(
            self.block_table.np,
            req_indices,
            pos,
            self.block_size,
            self.dcp_world_size,
            self.dcp_rank,
            self.cp_kv_cache_interleave_size,
        )
        slots[num_tokens:] = PAD_SLOT_ID
        self.slot_mapping.copy_to_gpu()


class MultiGroupBlockTable310(MultiGroupBlockTable):
    """The runner's multi-group table built of :class:`BlockTable310` (one per KV cache group)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        with replaced_names(runner_block_table, {"BlockTable": BlockTable310}):
            super().__init__(*args, **kwargs)
