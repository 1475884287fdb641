"""Overrides of the kernels of vLLM's ``vllm/v1/worker/gpu/sample/batch_shard.py`` (sampling sharded
over TP ranks along the batch: the owner-sorted shard plan, and the packing / unpacking of sampler
outputs and logprobs around the all-gathers)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from vllm_ascend.kernels.v2._launch import Grid, dispatch_v2, grid_dim

_VLLM = "vllm.v1.worker.gpu.sample.batch_shard"


def _flat(t: torch.Tensor) -> torch.Tensor:
    """A 1-D view from ``t``'s first element to the end of its storage: what ``ptr + offset`` addresses."""
    offset = t.storage_offset()
    return t.as_strided((t.untyped_storage().nbytes() // t.element_size() - offset,), (1,), offset)


def _block_cols(width: int, block: int, device: torch.device) -> torch.Tensor:
    """Columns ``[0, min(width, block))``: what a ``tl.arange(0, BLOCK) < width`` mask keeps."""
    return torch.arange(max(0, min(int(width), block)), device=device)


def build_shard_plan_torch(
    grid: Grid,
    idx_mapping_ptr: torch.Tensor,
    cu_num_logits_ptr: torch.Tensor,
    query_start_loc_ptr: torch.Tensor,
    seq_lens_ptr: torch.Tensor,
    sorted_logits_indices_ptr: torch.Tensor,
    gathered_src_indices_ptr: torch.Tensor,
    local_idx_mapping_ptr: torch.Tensor,
    local_cu_num_logits_ptr: torch.Tensor,
    local_logits_indices_ptr: torch.Tensor,
    local_expanded_idx_mapping_ptr: torch.Tensor,
    local_expanded_local_pos_ptr: torch.Tensor,
    local_seq_lens_ptr: torch.Tensor,
    num_reqs: int,
    local_logits_start: int,
    max_num_reqs_per_rank: int,
    TP_SIZE: int,
    TP_RANK: int,
    PADDED_NUM_REQS: int,
    PADDED_NUM_LOGITS_PER_REQ: int,
) -> None:
    """Reference of :func:`build_shard_plan`."""
    programs = grid_dim(grid, 0)
    if programs == 0:
        return
    device = idx_mapping_ptr.device
    counted = max(0, min(int(num_reqs), PADDED_NUM_REQS))
    # Triton's ``%`` on integers truncates (C remainder), as torch.fmod.
    owners_all = torch.fmod(idx_mapping_ptr[:counted].long(), TP_SIZE)
    logits_all = cu_num_logits_ptr[1 : counted + 1].long() - cu_num_logits_ptr[:counted].long()
    states = idx_mapping_ptr[:programs].long()
    owner = torch.fmod(states, TP_SIZE)
    num_logits = cu_num_logits_ptr[1 : programs + 1].long() - cu_num_logits_ptr[:programs].long()
    lower = owners_all[None, :] < owner[:, None]
    earlier = (owners_all[None, :] == owner[:, None]) & (
        torch.arange(counted, device=device)[None, :] < torch.arange(programs, device=device)[:, None]
    )
    start = ((lower | earlier) * logits_all[None, :]).sum(dim=1)
    local_req = earlier.sum(dim=1)
    query_start = query_start_loc_ptr[1 : programs + 1].long() - num_logits
    gathered_src_indices_ptr[:programs] = (owner * max_num_reqs_per_rank + local_req).to(
        gathered_src_indices_ptr.dtype
    )
    local_cu_num_logits_ptr[0] = 0
    width = num_logits.clamp(0, PADDED_NUM_LOGITS_PER_REQ)
    owner_row = torch.repeat_interleave(torch.arange(programs, device=device), width)
    k = torch.arange(int(width.sum()), device=device) - (torch.cumsum(width, 0) - width)[owner_row]
    logit_index = query_start[owner_row] + k
    _flat(sorted_logits_indices_ptr)[start[owner_row] + k] = logit_index.to(sorted_logits_indices_ptr.dtype)
    mine = owner == TP_RANK
    if bool(mine.any()):
        local_start = start - local_logits_start
        local_idx_mapping_ptr[local_req[mine]] = states[mine].to(local_idx_mapping_ptr.dtype)
        local_cu_num_logits_ptr[local_req[mine] + 1] = (local_start + num_logits)[mine].to(
            local_cu_num_logits_ptr.dtype
        )
        local_seq_lens_ptr[local_req[mine]] = seq_lens_ptr[:programs][mine].to(local_seq_lens_ptr.dtype)
        keep = mine[owner_row]
        dst = (local_start[owner_row] + k)[keep]
        _flat(local_logits_indices_ptr)[dst] = logit_index[keep].to(local_logits_indices_ptr.dtype)
        _flat(local_expanded_idx_mapping_ptr)[dst] = states[owner_row][keep].to(
            local_expanded_idx_mapping_ptr.dtype
        )
        _flat(local_expanded_local_pos_ptr)[dst] = k[keep].to(local_expanded_local_pos_ptr.dtype)


def build_shard_plan(
    grid: Grid,
    idx_mapping_ptr: torch.Tensor,
    cu_num_logits_ptr: torch.Tensor,
    query_start_loc_ptr: torch.Tensor,
    seq_lens_ptr: torch.Tensor,
    sorted_logits_indices_ptr: torch.Tensor,
    gathered_src_indices_ptr: torch.Tensor,
    local_idx_mapping_ptr: torch.Tensor,
    local_cu_num_logits_ptr: torch.Tensor,
    local_logits_indices_ptr: torch.Tensor,
    local_expanded_idx_mapping_ptr: torch.Tensor,
    local_expanded_local_pos_ptr: torch.Tensor,
    local_seq_lens_ptr: torch.Tensor,
    num_reqs: int,
    local_logits_start: int,
    max_num_reqs_per_rank: int,
    TP_SIZE: int,
    TP_RANK: int,
    PADDED_NUM_REQS: int,
    PADDED_NUM_LOGITS_PER_REQ: int,
) -> None:
    """The owner-sorted shard plan of a batch, in place. Request ``r < grid[0]`` is owned by rank
    ``idx_mapping[r] % TP_SIZE``; in the owner-sorted order (rank 0's requests in batch order, then rank
    1's, ...) its logits start at ``S`` = the logits of the requests of lower owners plus those of the
    earlier requests of its owner (``L`` of them). Writes ``sorted_logits_indices[S + k]`` (its logits
    rows ``query_start_loc[r + 1] - num_logits + k``), ``gathered_src_indices[r] = owner *
    max_num_reqs_per_rank + L``, ``local_cu_num_logits[0] = 0`` and, for requests of ``TP_RANK``, the
    local batch at local request ``L`` / logits offset ``S - local_logits_start``: idx mapping,
    ``local_cu_num_logits[L + 1]``, logits indices, expanded idx mapping, local positions ``k``, seq
    lens."""
    impl = dispatch_v2(
        "sample_batch_shard", "build_shard_plan", build_shard_plan_torch, idx_mapping_ptr.device
    )
    impl(
        grid,
        idx_mapping_ptr,
        cu_num_logits_ptr,
        query_start_loc_ptr,
        seq_lens_ptr,
        sorted_logits_indices_ptr,
        gathered_src_indices_ptr,
        local_idx_mapping_ptr,
        local_cu_num_logits_ptr,
        local_logits_indices_ptr,
        local_expanded_idx_mapping_ptr,
        local_expanded_local_pos_ptr,
        local_seq_lens_ptr,
        num_reqs,
        local_logits_start,
        max_num_reqs_per_rank,
        TP_SIZE,
        TP_RANK,
        PADDED_NUM_REQS,
        PADDED_NUM_LOGITS_PER_REQ,
    )


def pack_sampler_output_torch(
    grid: Grid,
    packed_ptr: torch.Tensor,
    packed_stride: int,
    sampled_token_ids_ptr: torch.Tensor,
    sampled_token_ids_stride: int,
    num_sampled_ptr: torch.Tensor,
    num_rejected_ptr: torch.Tensor,
    num_nans_ptr: torch.Tensor | None,
    local_cu_num_logits_ptr: torch.Tensor | None,
    max_num_logits_per_req: int,
    num_src_cols: int,
    BLOCK_SIZE: int,
) -> None:
    """Reference of :func:`pack_sampler_output`."""
    num_reqs = grid_dim(grid, 0)
    if num_reqs == 0:
        return
    device = packed_ptr.device
    rows = torch.arange(num_reqs, device=device)
    packed = _flat(packed_ptr)
    base = rows * packed_stride
    cols = _block_cols(max_num_logits_per_req, BLOCK_SIZE, device)
    if cols.numel():
        src_cols = cols.clamp_max(max(int(num_src_cols) - 1, 0))
        tokens = _flat(sampled_token_ids_ptr)[rows[:, None] * sampled_token_ids_stride + src_cols[None, :]]
        tokens = torch.where(cols[None, :] < num_src_cols, tokens, torch.zeros((), dtype=tokens.dtype))
        packed[base[:, None] + cols[None, :]] = tokens.to(packed.dtype)
    packed[base + max_num_logits_per_req] = num_sampled_ptr[:num_reqs].to(packed.dtype)
    packed[base + max_num_logits_per_req + 1] = num_rejected_ptr[:num_reqs].to(packed.dtype)
    if num_nans_ptr is not None:
        assert local_cu_num_logits_ptr is not None
        start = local_cu_num_logits_ptr[:num_reqs].long()
        count = (local_cu_num_logits_ptr[1 : num_reqs + 1].long() - start).clamp(0, BLOCK_SIZE)
        owner = torch.repeat_interleave(rows, count)
        k = torch.arange(int(count.sum()), device=device) - (torch.cumsum(count, 0) - count)[owner]
        nans = _flat(num_nans_ptr)[start[owner] + k].long()
        totals = torch.zeros(num_reqs, dtype=torch.int64, device=device).index_add_(0, owner, nans)
        packed[base + max_num_logits_per_req + 2] = totals.to(packed.dtype)


def pack_sampler_output(
    grid: Grid,
    packed_ptr: torch.Tensor,
    packed_stride: int,
    sampled_token_ids_ptr: torch.Tensor,
    sampled_token_ids_stride: int,
    num_sampled_ptr: torch.Tensor,
    num_rejected_ptr: torch.Tensor,
    num_nans_ptr: torch.Tensor | None,
    local_cu_num_logits_ptr: torch.Tensor | None,
    max_num_logits_per_req: int,
    num_src_cols: int,
    BLOCK_SIZE: int,
) -> None:
    """Packs local request ``r < grid[0]``'s sampler output into int64 row ``r`` of ``packed``: its
    first ``min(max_num_logits_per_req, BLOCK_SIZE)`` sampled token ids (0 past ``num_src_cols``), then
    at column ``max_num_logits_per_req`` its ``num_sampled``, ``num_rejected`` and, with ``num_nans``,
    the sum of its per-logits-row NaN counts (rows ``local_cu_num_logits[r] ..``, at most
    ``BLOCK_SIZE``)."""
    impl = dispatch_v2(
        "sample_batch_shard", "pack_sampler_output", pack_sampler_output_torch, packed_ptr.device
    )
    impl(
        grid,
        packed_ptr,
        packed_stride,
        sampled_token_ids_ptr,
        sampled_token_ids_stride,
        num_sampled_ptr,
        num_rejected_ptr,
        num_nans_ptr,
        local_cu_num_logits_ptr,
        max_num_logits_per_req,
        num_src_cols,
        BLOCK_SIZE,
    )


def unpack_gathered_output_torch(
    grid: Grid,
    gathered_ptr: torch.Tensor,
    gathered_stride: int,
    gathered_src_indices_ptr: torch.Tensor,
    sampled_token_ids_ptr: torch.Tensor,
    num_sampled_ptr: torch.Tensor,
    num_rejected_ptr: torch.Tensor,
    num_nans_ptr: torch.Tensor | None,
    max_num_logits_per_req: int,
    BLOCK_SIZE: int,
) -> None:
    """Reference of :func:`unpack_gathered_output`."""
    num_reqs = grid_dim(grid, 0)
    if num_reqs == 0:
        return
    device = gathered_ptr.device
    base = gathered_src_indices_ptr[:num_reqs].long() * gathered_stride
    gathered = _flat(gathered_ptr)
    cols = _block_cols(max_num_logits_per_req, BLOCK_SIZE, device)
    if cols.numel():
        rows = torch.arange(num_reqs, device=device)
        dst = rows[:, None] * max_num_logits_per_req + cols[None, :]
        tokens = gathered[base[:, None] + cols[None, :]]
        _flat(sampled_token_ids_ptr)[dst] = tokens.to(sampled_token_ids_ptr.dtype)
    num_sampled_ptr[:num_reqs] = (
        gathered[base + max_num_logits_per_req].to(torch.int32).to(num_sampled_ptr.dtype)
    )
    num_rejected_ptr[:num_reqs] = (
        gathered[base + max_num_logits_per_req + 1].to(torch.int32).to(num_rejected_ptr.dtype)
    )
    if num_nans_ptr is not None:
        num_nans_ptr[:num_reqs] = (
            gathered[base + max_num_logits_per_req + 2].to(torch.int32).to(num_nans_ptr.dtype)
        )


def unpack_gathered_output(
    grid: Grid,
    gathered_ptr: torch.Tensor,
    gathered_stride: int,
    gathered_src_indices_ptr: torch.Tensor,
    sampled_token_ids_ptr: torch.Tensor,
    num_sampled_ptr: torch.Tensor,
    num_rejected_ptr: torch.Tensor,
    num_nans_ptr: torch.Tensor | None,
    max_num_logits_per_req: int,
    BLOCK_SIZE: int,
) -> None:
    """Unpacks the all-gathered sampler outputs into batch order: request ``r < grid[0]`` reads packed
    row ``gathered_src_indices[r]``: its ``min(max_num_logits_per_req, BLOCK_SIZE)`` token ids go to
    ``sampled_token_ids[r]`` (rows ``max_num_logits_per_req`` wide), the next columns to
    ``num_sampled[r]``, ``num_rejected[r]`` and (when given) ``num_nans[r]`` as int32."""
    impl = dispatch_v2(
        "sample_batch_shard", "unpack_gathered_output", unpack_gathered_output_torch, gathered_ptr.device
    )
    impl(
        grid,
        gathered_ptr,
        gathered_stride,
        gathered_src_indices_ptr,
        sampled_token_ids_ptr,
        num_sampled_ptr,
        num_rejected_ptr,
        num_nans_ptr,
        max_num_logits_per_req,
        BLOCK_SIZE,
    )


def _logit_rows(
    cu_num_logits_ptr: torch.Tensor, num_reqs: int, positions: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(request, position, logits row)`` of every program ``(r, pos)`` of a ``(num_reqs, positions)``
    grid with ``pos < cu[r + 1] - cu[r]``."""
    device = cu_num_logits_ptr.device
    start = cu_num_logits_ptr[:num_reqs].long()
    count = (cu_num_logits_ptr[1 : num_reqs + 1].long() - start).clamp(0, positions)
    req = torch.repeat_interleave(torch.arange(num_reqs, device=device), count)
    pos = torch.arange(int(count.sum()), device=device) - (torch.cumsum(count, 0) - count)[req]
    return req, pos, start[req] + pos


def pack_logprobs_torch(
    grid: Grid,
    send_ids_ptr: torch.Tensor,
    send_ids_stride: int,
    send_logprobs_ptr: torch.Tensor,
    send_logprobs_stride: int,
    src_ids_ptr: torch.Tensor,
    src_ids_stride: int,
    src_logprobs_ptr: torch.Tensor,
    src_logprobs_stride: int,
    selected_token_ranks_ptr: torch.Tensor,
    local_cu_num_logits_ptr: torch.Tensor,
    max_num_logits_per_req: int,
    num_logprob_cols: int,
    num_src_cols: int,
    BLOCK_SIZE: int,
) -> None:
    """Reference of :func:`pack_logprobs`."""
    num_reqs, positions = grid_dim(grid, 0), grid_dim(grid, 1)
    if num_reqs == 0 or positions == 0:
        return
    device = send_ids_ptr.device
    req, pos, src = _logit_rows(local_cu_num_logits_ptr, num_reqs, positions)
    if src.numel() == 0:
        return
    dst = req * max_num_logits_per_req + pos
    send_ids = _flat(send_ids_ptr)
    cols = _block_cols(num_logprob_cols, BLOCK_SIZE, device)
    if cols.numel():
        live = cols[None, :] < num_src_cols
        src_cols = cols.clamp_max(max(int(num_src_cols) - 1, 0))
        ids = _flat(src_ids_ptr)[src[:, None] * src_ids_stride + src_cols[None, :]]
        ids = torch.where(live, ids, torch.zeros((), dtype=ids.dtype))
        logprobs = _flat(src_logprobs_ptr)[src[:, None] * src_logprobs_stride + src_cols[None, :]].float()
        logprobs = torch.where(live, logprobs, float("-inf"))
        send_ids[dst[:, None] * send_ids_stride + cols[None, :]] = ids.to(send_ids.dtype)
        _flat(send_logprobs_ptr)[dst[:, None] * send_logprobs_stride + cols[None, :]] = logprobs.to(
            send_logprobs_ptr.dtype
        )
    send_ids[dst * send_ids_stride + num_logprob_cols] = selected_token_ranks_ptr[src].to(send_ids.dtype)


def pack_logprobs(
    grid: Grid,
    send_ids_ptr: torch.Tensor,
    send_ids_stride: int,
    send_logprobs_ptr: torch.Tensor,
    send_logprobs_stride: int,
    src_ids_ptr: torch.Tensor,
    src_ids_stride: int,
    src_logprobs_ptr: torch.Tensor,
    src_logprobs_stride: int,
    selected_token_ranks_ptr: torch.Tensor,
    local_cu_num_logits_ptr: torch.Tensor,
    max_num_logits_per_req: int,
    num_logprob_cols: int,
    num_src_cols: int,
    BLOCK_SIZE: int,
) -> None:
    """Packs the local logprobs for the all-gather: logits row ``src = local_cu_num_logits[r] + pos``
    (``r < grid[0]``, ``pos < grid[1]`` and within the request) goes to send row ``r *
    max_num_logits_per_req + pos``: ``min(num_logprob_cols, BLOCK_SIZE)`` token ids (int64, 0 past
    ``num_src_cols``) then its selected-token rank at column ``num_logprob_cols`` of ``send_ids``, the
    logprobs (float32, ``-inf`` past ``num_src_cols``) in ``send_logprobs``."""
    impl = dispatch_v2("sample_batch_shard", "pack_logprobs", pack_logprobs_torch, send_ids_ptr.device)
    impl(
        grid,
        send_ids_ptr,
        send_ids_stride,
        send_logprobs_ptr,
        send_logprobs_stride,
        src_ids_ptr,
        src_ids_stride,
        src_logprobs_ptr,
        src_logprobs_stride,
        selected_token_ranks_ptr,
        local_cu_num_logits_ptr,
        max_num_logits_per_req,
        num_logprob_cols,
        num_src_cols,
        BLOCK_SIZE,
    )


def unpack_logprobs_torch(
    grid: Grid,
    gathered_ids_ptr: torch.Tensor,
    gathered_ids_stride: int,
    gathered_logprobs_ptr: torch.Tensor,
    gathered_logprobs_stride: int,
    gathered_src_indices_ptr: torch.Tensor,
    cu_num_logits_ptr: torch.Tensor,
    logprob_token_ids_ptr: torch.Tensor,
    logprobs_ptr: torch.Tensor,
    selected_token_ranks_ptr: torch.Tensor,
    max_num_logits_per_req: int,
    num_logprob_cols: int,
    BLOCK_SIZE: int,
) -> None:
    """Reference of :func:`unpack_logprobs`."""
    num_reqs, positions = grid_dim(grid, 0), grid_dim(grid, 1)
    if num_reqs == 0 or positions == 0:
        return
    device = gathered_ids_ptr.device
    req, pos, dst = _logit_rows(cu_num_logits_ptr, num_reqs, positions)
    if dst.numel() == 0:
        return
    src = gathered_src_indices_ptr[req].long() * max_num_logits_per_req + pos
    gathered_ids = _flat(gathered_ids_ptr)
    cols = _block_cols(num_logprob_cols, BLOCK_SIZE, device)
    if cols.numel():
        out = dst[:, None] * num_logprob_cols + cols[None, :]
        ids = gathered_ids[src[:, None] * gathered_ids_stride + cols[None, :]]
        _flat(logprob_token_ids_ptr)[out] = ids.to(logprob_token_ids_ptr.dtype)
        logprobs = _flat(gathered_logprobs_ptr)[src[:, None] * gathered_logprobs_stride + cols[None, :]]
        _flat(logprobs_ptr)[out] = logprobs.to(logprobs_ptr.dtype)
    _flat(selected_token_ranks_ptr)[dst] = gathered_ids[src * gathered_ids_stride + num_logprob_cols].to(
        selected_token_ranks_ptr.dtype
    )


def unpack_logprobs(
    grid: Grid,
    gathered_ids_ptr: torch.Tensor,
    gathered_ids_stride: int,
    gathered_logprobs_ptr: torch.Tensor,
    gathered_logprobs_stride: int,
    gathered_src_indices_ptr: torch.Tensor,
    cu_num_logits_ptr: torch.Tensor,
    logprob_token_ids_ptr: torch.Tensor,
    logprobs_ptr: torch.Tensor,
    selected_token_ranks_ptr: torch.Tensor,
    max_num_logits_per_req: int,
    num_logprob_cols: int,
    BLOCK_SIZE: int,
) -> None:
    """Unpacks the all-gathered logprobs into batch order: logits row ``dst = cu_num_logits[r] + pos``
    (``r < grid[0]``, ``pos < grid[1]`` and within the request) reads gathered row
    ``gathered_src_indices[r] * max_num_logits_per_req + pos``: ``min(num_logprob_cols, BLOCK_SIZE)``
    token ids and logprobs (rows ``num_logprob_cols`` wide) and the rank at column
    ``num_logprob_cols`` of the ids."""
    impl = dispatch_v2(
        "sample_batch_shard", "unpack_logprobs", unpack_logprobs_torch, gathered_ids_ptr.device
    )
    impl(
        grid,
        gathered_ids_ptr,
        gathered_ids_stride,
        gathered_logprobs_ptr,
        gathered_logprobs_stride,
        gathered_src_indices_ptr,
        cu_num_logits_ptr,
        logprob_token_ids_ptr,
        logprobs_ptr,
        selected_token_ranks_ptr,
        max_num_logits_per_req,
        num_logprob_cols,
        BLOCK_SIZE,
    )


OVERRIDES: dict[str, Callable[..., Any]] = {
    f"{_VLLM}._build_shard_plan_kernel": build_shard_plan,
    f"{_VLLM}._pack_sampler_output_kernel": pack_sampler_output,
    f"{_VLLM}._unpack_gathered_output_kernel": unpack_gathered_output,
    f"{_VLLM}._pack_logprobs_kernel": pack_logprobs,
    f"{_VLLM}._unpack_logprobs_kernel": unpack_logprobs,
}
