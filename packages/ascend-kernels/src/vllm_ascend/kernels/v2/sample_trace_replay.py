"""Overrides of the kernels of vLLM's ``vllm/v1/worker/gpu/sample/trace_replay.py`` (inference trace
replay: sampled tokens overwritten by a request's predetermined trace)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from vllm_ascend.kernels.v2._launch import Grid, dispatch_v2, grid_dim

_VLLM = "vllm.v1.worker.gpu.sample.trace_replay"


def trace_replay_torch(
    grid: Grid,
    sampled_ptr: torch.Tensor,
    idx_mapping_ptr: torch.Tensor,
    trace_token_ids_ptr: torch.Tensor,
    trace_token_ids_stride: int,
    trace_len_ptr: torch.Tensor,
    total_len_ptr: torch.Tensor,
    prompt_len_ptr: torch.Tensor,
) -> None:
    """Reference of :func:`trace_replay`."""
    num_reqs = grid_dim(grid, 0)
    if num_reqs == 0:
        return
    states = idx_mapping_ptr[:num_reqs].long()
    live = states >= 0
    rows = live.nonzero().flatten()
    states = states[rows]
    trace_len = trace_len_ptr[states].long()
    step = total_len_ptr[states].long() - prompt_len_ptr[states].long()
    replay = (trace_len > 0) & (step >= 0) & (step < trace_len)
    rows, states, step = rows[replay], states[replay], step[replay]
    if rows.numel() == 0:
        return
    trace = trace_token_ids_ptr.as_strided(
        (int(states.max()) + 1, int(step.max()) + 1),
        (trace_token_ids_stride, 1),
        trace_token_ids_ptr.storage_offset(),
    )
    sampled_ptr[rows] = trace[states, step].to(sampled_ptr.dtype)


def trace_replay(
    grid: Grid,
    sampled_ptr: torch.Tensor,
    idx_mapping_ptr: torch.Tensor,
    trace_token_ids_ptr: torch.Tensor,
    trace_token_ids_stride: int,
    trace_len_ptr: torch.Tensor,
    total_len_ptr: torch.Tensor,
    prompt_len_ptr: torch.Tensor,
) -> None:
    """Replays traces, in place: for request ``b < grid[0]`` (state ``s = idx_mapping[b] >= 0``) with a
    trace (``trace_len[s] > 0``) and output step ``total_len[s] - prompt_len[s]`` in ``[0, trace_len)``,
    ``sampled[b] = trace_token_ids[s, step]``; other entries are left as sampled."""
    impl = dispatch_v2("sample_trace_replay", "trace_replay", trace_replay_torch, sampled_ptr.device)
    impl(
        grid,
        sampled_ptr,
        idx_mapping_ptr,
        trace_token_ids_ptr,
        trace_token_ids_stride,
        trace_len_ptr,
        total_len_ptr,
        prompt_len_ptr,
    )


OVERRIDES: dict[str, Callable[..., Any]] = {
    f"{_VLLM}._trace_replay_kernel": trace_replay,
}
