"""Ascend Triton kernels of :mod:`vllm_ascend.kernels.v2.spec_decode_rejection_sampler`.

One program per vector core (vLLM: one program per request, or per 1024-row block): requests or tiles of
logits rows are walked grid-stride, with UB-bounded tiles.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_ascend.kernels import _geometry
from vllm_ascend.kernels._triton.common import IS_INTERPRETED, ub_cap
from vllm_ascend.kernels.v2._launch import Grid, cdiv, grid_dim

_TILE = 4 if IS_INTERPRETED else 1024


def _tile(device: torch.device, cap: int = _TILE, live_tiles: int = 2) -> int:
    return ub_cap(device, min(cap, _TILE), live_tiles=live_tiles)


@triton.jit
def _flatten_sampled_kernel(
    flat_sampled_ptr,
    sampled_ptr,
    sampled_stride,
    num_sampled_ptr,
    cu_num_logits_ptr,
    num_reqs,
    TILE: tl.constexpr,
):
    # Requests grid-stride: request r's first num_sampled[r] tokens copied to its logits rows.
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    for req in range(pid, num_reqs, programs):
        dst = flat_sampled_ptr + tl.load(cu_num_logits_ptr + req)
        src = sampled_ptr + req * sampled_stride
        count = tl.load(num_sampled_ptr + req)
        for i in range(0, count, TILE):
            offs = i + tl.arange(0, TILE)
            inside = offs < count
            tl.store(dst + offs, tl.load(src + offs, mask=inside, other=0), mask=inside)


def flatten_sampled(
    grid: Grid,
    flat_sampled_ptr: torch.Tensor,
    sampled_ptr: torch.Tensor,
    sampled_stride: int,
    num_sampled_ptr: torch.Tensor,
    cu_num_logits_ptr: torch.Tensor,
) -> None:
    num_reqs = grid_dim(grid, 0)
    if num_reqs == 0:
        return
    device = flat_sampled_ptr.device
    _flatten_sampled_kernel[(_geometry.programs(device, num_reqs),)](
        flat_sampled_ptr,
        sampled_ptr,
        sampled_stride,
        num_sampled_ptr,
        cu_num_logits_ptr,
        num_reqs,
        TILE=_tile(device, 16),
    )


@triton.jit
def _gather_draft_sampled_kernel(
    draft_sampled_ptr,
    pos_ptr,
    input_ids_ptr,
    positions_ptr,
    logits_indices_ptr,
    expanded_idx_mapping_ptr,
    expanded_local_pos_ptr,
    prefill_len_ptr,
    num_rows,
    TILE: tl.constexpr,
):
    # Tiles of logits rows grid-stride: each row's input token and position; a draft slot (local index > 0)
    # of a step whose first position is still inside the prompt gets -1 (a placeholder draft).
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    for start in range(pid * TILE, num_rows, programs * TILE):
        rows = start + tl.arange(0, TILE)
        inside = rows < num_rows
        token = tl.load(logits_indices_ptr + rows, mask=inside, other=0)
        token_id = tl.load(input_ids_ptr + token, mask=inside, other=0)
        pos = tl.load(positions_ptr + token, mask=inside, other=0)
        state = tl.load(expanded_idx_mapping_ptr + rows, mask=inside, other=0)
        local = tl.load(expanded_local_pos_ptr + rows, mask=inside, other=0)
        prefill = tl.load(prefill_len_ptr + state, mask=inside, other=0)
        step_start = pos.to(tl.int64) - local.to(tl.int64)
        placeholder = (local > 0) & (step_start < prefill.to(tl.int64))
        tl.store(draft_sampled_ptr + rows, tl.where(placeholder, -1, token_id), mask=inside)
        tl.store(pos_ptr + rows, pos, mask=inside)


def gather_draft_sampled(
    grid: Grid,
    draft_sampled_ptr: torch.Tensor,
    pos_ptr: torch.Tensor,
    input_ids_ptr: torch.Tensor,
    positions_ptr: torch.Tensor,
    logits_indices_ptr: torch.Tensor,
    expanded_idx_mapping_ptr: torch.Tensor,
    expanded_local_pos_ptr: torch.Tensor,
    prefill_len_ptr: torch.Tensor,
    num_logits: int,
    BLOCK_SIZE: int,
) -> None:
    # vLLM's grid covers min(num_logits, programs * BLOCK_SIZE) rows.
    num_rows = min(num_logits, grid_dim(grid, 0) * BLOCK_SIZE)
    if num_rows <= 0:
        return
    device = draft_sampled_ptr.device
    tile = _tile(device, live_tiles=6)
    _gather_draft_sampled_kernel[(_geometry.programs(device, cdiv(num_rows, tile)),)](
        draft_sampled_ptr,
        pos_ptr,
        input_ids_ptr,
        positions_ptr,
        logits_indices_ptr,
        expanded_idx_mapping_ptr,
        expanded_local_pos_ptr,
        prefill_len_ptr,
        num_rows,
        TILE=tile,
    )
