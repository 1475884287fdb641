"""Overrides of the kernels of vLLM's ``vllm/v1/worker/gpu/spec_decode/dflash2/speculator.py`` (the
DFlash2 / LiLiCorr candidate walk: a seeded Gumbel-max choice among each step's top-k candidates, and
the realized proposal scores cached as draft logits)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from vllm_ascend.kernels.v2._launch import Grid, dispatch_v2, grid_dim
from vllm_ascend.kernels.v2.sample_gumbel import DRAFT_NOISE_SALT, gumbel_noise_torch

_VLLM = "vllm.v1.worker.gpu.spec_decode.dflash2.speculator"


def _flat(t: torch.Tensor) -> torch.Tensor:
    """A 1-D view from ``t``'s first element to the end of its storage: what ``ptr + offset`` addresses."""
    offset = t.storage_offset()
    return t.as_strided((t.untyped_storage().nbytes() // t.element_size() - offset,), (1,), offset)


def selector_walk_torch(
    grid: Grid,
    scores_ptr: torch.Tensor,
    candidate_ptr: torch.Tensor,
    sample_pos_ptr: torch.Tensor,
    req_state_ptr: torch.Tensor,
    temperature_ptr: torch.Tensor,
    seeds_ptr: torch.Tensor,
    tokens_ptr: torch.Tensor,
    realized_scores_ptr: torch.Tensor,
    num_steps: int,
    top_k: int,
    BLOCK_K: int,
    SAMPLE_PROBABILISTIC: bool,
    USE_FP64: bool,
) -> None:
    """Reference of :func:`selector_walk`."""
    rows = grid_dim(grid, 0)
    if rows == 0 or num_steps == 0 or top_k == 0:
        return
    device = candidate_ptr.device
    width = min(top_k, BLOCK_K)
    cols = torch.arange(width, device=device)
    first_flat = torch.arange(rows, device=device) * num_steps
    req = _flat(req_state_ptr)[first_flat].long()
    valid = req >= 0
    safe = req.clamp_min(0)
    temp = torch.where(valid, temperature_ptr[safe].float(), torch.zeros((), device=device))
    if not SAMPLE_PROBABILISTIC:
        temp = torch.zeros_like(temp)
    seed = torch.where(valid, seeds_ptr[safe].long(), torch.zeros((), dtype=torch.int64, device=device))
    sampled = temp != 0.0
    dtype = torch.float64 if USE_FP64 else torch.float32
    scores_flat, candidates_flat = _flat(scores_ptr), _flat(candidate_ptr)
    live = valid.nonzero().flatten()
    previous = torch.zeros(rows, dtype=torch.int64, device=device)
    for step in range(num_steps):
        flat = first_flat + step
        score_index = ((flat * top_k + previous) * top_k)[:, None] + cols[None, :]
        scores = torch.where(
            valid[:, None], scores_flat[score_index * valid[:, None]].to(dtype), float("-inf")
        )
        candidate_index = (flat * top_k)[:, None] + cols[None, :]
        candidates = torch.where(valid[:, None], candidates_flat[candidate_index * valid[:, None]].long(), 0)
        values = scores
        if bool(sampled.any()):
            divisor = torch.where(sampled, temp, torch.ones((), device=device)).to(dtype)
            pos = _flat(sample_pos_ptr)[flat].long() - 1 + DRAFT_NOISE_SALT
            noise = gumbel_noise_torch(seed[:, None], pos[:, None], candidates, use_fp64=USE_FP64)
            values = torch.where(sampled[:, None], scores / divisor[:, None] + noise, scores)
        # Triton's max(return_indices=True): the leftmost maximum (0 when all are -inf).
        values = values.nan_to_num(nan=float("-inf"))
        best = values.amax(dim=1, keepdim=True)
        index = (values == best).to(torch.int8).argmax(dim=1).long()
        _flat(realized_scores_ptr)[candidate_index[live]] = scores[live].to(realized_scores_ptr.dtype)
        token = candidates_flat[flat * top_k + index]
        _flat(tokens_ptr)[flat[live]] = token[live].to(tokens_ptr.dtype)
        previous = index


def selector_walk(
    grid: Grid,
    scores_ptr: torch.Tensor,
    candidate_ptr: torch.Tensor,
    sample_pos_ptr: torch.Tensor,
    req_state_ptr: torch.Tensor,
    temperature_ptr: torch.Tensor,
    seeds_ptr: torch.Tensor,
    tokens_ptr: torch.Tensor,
    realized_scores_ptr: torch.Tensor,
    num_steps: int,
    top_k: int,
    BLOCK_K: int,
    SAMPLE_PROBABILISTIC: bool,
    USE_FP64: bool,
) -> None:
    """The candidate walk of row ``r < grid[0]`` (request ``req_state[r * num_steps]``; rows with a
    negative request are skipped), in place: at step ``i`` (``flat = r * num_steps + i``) the
    ``top_k`` scores ``scores[flat, previous choice]`` of the step's candidates are copied to
    ``realized_scores[flat]`` and the choice is their argmax, Gumbel-noised by the request's seed at
    position ``sample_pos[flat] - 1`` (draft salt) and divided by its temperature when
    ``SAMPLE_PROBABILISTIC`` and the temperature is non-zero (float64 with ``USE_FP64``);
    ``tokens[flat]`` = the chosen candidate's token id."""
    impl = dispatch_v2("spec_decode_dflash2", "selector_walk", selector_walk_torch, candidate_ptr.device)
    impl(
        grid,
        scores_ptr,
        candidate_ptr,
        sample_pos_ptr,
        req_state_ptr,
        temperature_ptr,
        seeds_ptr,
        tokens_ptr,
        realized_scores_ptr,
        num_steps,
        top_k,
        BLOCK_K,
        SAMPLE_PROBABILISTIC,
        USE_FP64,
    )


def cache_draft_logits_torch(
    grid: Grid,
    draft_logits_ptr: torch.Tensor,
    cached_candidate_ptr: torch.Tensor,
    candidate_ptr: torch.Tensor,
    scores_ptr: torch.Tensor,
    req_state_ptr: torch.Tensor,
    draft_logits_stride_0: int,
    draft_logits_stride_1: int,
    num_steps: int,
    top_k: int,
    BLOCK_K: int,
) -> None:
    """Reference of :func:`cache_draft_logits`."""
    num_sample = grid_dim(grid, 0)
    if num_sample == 0 or num_steps == 0 or top_k == 0:
        return
    device = candidate_ptr.device
    width = min(top_k, BLOCK_K)
    cols = torch.arange(width, device=device)[None, :]
    flat = torch.arange(num_sample, device=device)
    req = _flat(req_state_ptr)[flat].long()
    live = req >= 0
    flat, req = flat[live], req[live]
    if flat.numel() == 0:
        return
    step = flat % num_steps
    cache_index = ((req * num_steps + step) * top_k)[:, None] + cols
    row_base = (req * draft_logits_stride_0 + step * draft_logits_stride_1)[:, None]
    cached = _flat(cached_candidate_ptr)
    logits = _flat(draft_logits_ptr)
    old = cached[cache_index].long()
    logits[row_base + old] = float("-inf")
    token_ids = _flat(candidate_ptr)[(flat * top_k)[:, None] + cols]
    scores = _flat(scores_ptr)[(flat * top_k)[:, None] + cols]
    logits[row_base + token_ids.long()] = scores.to(logits.dtype)
    cached[cache_index] = token_ids.to(cached.dtype)


def cache_draft_logits(
    grid: Grid,
    draft_logits_ptr: torch.Tensor,
    cached_candidate_ptr: torch.Tensor,
    candidate_ptr: torch.Tensor,
    scores_ptr: torch.Tensor,
    req_state_ptr: torch.Tensor,
    draft_logits_stride_0: int,
    draft_logits_stride_1: int,
    num_steps: int,
    top_k: int,
    BLOCK_K: int,
) -> None:
    """Sparse draft logits of each sampled step ``flat < grid[0]`` (request ``s = req_state[flat]``,
    skipped when negative; step ``flat % num_steps``), in place: the previous candidates of
    ``(s, step)`` (``cached_candidate``) are reset to ``-inf`` in ``draft_logits[s, step]``, then the
    step's ``top_k`` candidates get their realized scores and become the cached candidates."""
    impl = dispatch_v2(
        "spec_decode_dflash2", "cache_draft_logits", cache_draft_logits_torch, draft_logits_ptr.device
    )
    impl(
        grid,
        draft_logits_ptr,
        cached_candidate_ptr,
        candidate_ptr,
        scores_ptr,
        req_state_ptr,
        draft_logits_stride_0,
        draft_logits_stride_1,
        num_steps,
        top_k,
        BLOCK_K,
    )


OVERRIDES: dict[str, Callable[..., Any]] = {
    f"{_VLLM}._selector_walk_kernel": selector_walk,
    f"{_VLLM}._cache_draft_logits_kernel": cache_draft_logits,
}
