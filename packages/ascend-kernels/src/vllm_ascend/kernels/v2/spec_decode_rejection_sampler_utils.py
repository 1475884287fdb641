"""Overrides of the kernels of vLLM's ``vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py``: the
draft-verification pipeline of speculative decoding (per-vocabulary-block logits statistics, the block
verification's running joint ratio and residual mass, the per-request accept/reject walk, the seeded
resampling of the rejected or bonus token and its insertion).

Randomness matches vLLM's bit for bit: the acceptance uniform of a draft step is Triton's ``tl.rand``
(Philox4x32-10 keyed by the request's seed, counter = the token position; :func:`tl_rand32_torch`),
the resampling noise is ``sample/gumbel.py``'s murmur3 Gumbel stream (or, for watermarked requests,
``sample/watermark.py``'s keyed Philox stream), reused from :mod:`.sample_gumbel` and
:mod:`.sample_watermark`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from vllm_ascend.kernels.v2._launch import Grid, dispatch_v2, grid_dim
from vllm_ascend.kernels.v2.sample_gumbel import gumbel_noise_torch
from vllm_ascend.kernels.v2.sample_watermark import (
    U32,
    philox4x32_10_torch,
    philox_context_state_torch,
    philox_token_words_torch,
    philox_uniform_torch,
)

_VLLM = "vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils"
_MODULE = "spec_decode_rejection_sampler_utils"

#: The smallest positive float32 of Triton's ``tl.rand`` (vLLM's ``_TL_RAND_MIN``): the floor of an
#: acceptance uniform (``includes_zero=False``).
TL_RAND_MIN = 4.6566127342e-10
_NEG_INF = float("-inf")


# ---------------------------------------------------------------------------------------------------
# helpers


def tl_rand32_torch(seed: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """vLLM's ``tl_rand32(seed, offset, includes_zero=False)``: Triton's ``tl.rand`` (float32 in
    ``[0, 1)``) floored at :data:`TL_RAND_MIN`, bit-exact (broadcasting).

    ``tl.rand`` is word 0 of Philox4x32-10 at counter ``(offset low, offset high, 0, 0)`` (the high word
    only for a 64-bit ``offset``) under key ``(seed low, seed high)``, read as int32, negatives
    complemented, times ``4.6566127342e-10`` in float32."""
    wide = offset.dtype in (torch.int64, torch.uint64)
    offset = offset.to(torch.int64)
    seed = seed.to(torch.int64)
    c0 = offset & U32
    c1 = (offset >> 32) & U32 if wide else torch.zeros_like(offset)
    zero = torch.zeros_like(c0)
    k0, k1 = seed & U32, (seed >> 32) & U32
    word = philox4x32_10_torch((c0, c1, zero, zero), (k0, k1))[0]
    signed = torch.where(word >= 2**31, word - 2**32, word)
    signed = torch.where(signed < 0, -signed - 1, signed)
    scale = torch.tensor(TL_RAND_MIN, dtype=torch.float32, device=signed.device)
    return torch.clamp_min(signed.to(torch.float32) * scale, scale)


def _flat(t: torch.Tensor) -> torch.Tensor:
    """A 1-D view from ``t``'s first element to the end of its storage: what ``ptr + offset`` addresses."""
    offset = t.storage_offset()
    return t.as_strided((t.untyped_storage().nbytes() // t.element_size() - offset,), (1,), offset)


def _cells(rows: torch.Tensor, stride: int, cols: torch.Tensor) -> torch.Tensor:
    """Flat offsets ``rows[:, None] * stride + cols[None, :]``."""
    return rows.to(torch.int64)[:, None] * stride + cols.to(torch.int64)[None, :]


def _load_cols(
    ptr: torch.Tensor, base: torch.Tensor, cols: torch.Tensor, limit: int, other: float = _NEG_INF
) -> torch.Tensor:
    """float32 ``[len(base), len(cols)]``: ``ptr[base + col]`` where ``col < limit``, ``other`` elsewhere
    (a masked row load)."""
    out = torch.full((base.numel(), cols.numel()), other, dtype=torch.float32, device=cols.device)
    inside = int((cols < limit).sum())
    if base.numel() and inside:
        out[:, :inside] = _flat(ptr)[base.to(torch.int64)[:, None] + cols[None, :inside]].float()
    return out


def _lse(
    max_ptr: torch.Tensor,
    max_stride: int,
    sum_ptr: torch.Tensor,
    sum_stride: int,
    rows: torch.Tensor,
    blocks: int,
) -> torch.Tensor:
    """vLLM's ``_compute_global_logsumexp`` of logits rows ``rows`` from their per-block maxima and summed
    exponentials: ``max + log(sum(sumexp_b * exp(max_b - max)))`` in float32."""
    cols = torch.arange(blocks, device=rows.device)
    maxes = _flat(max_ptr)[_cells(rows, max_stride, cols)].float()
    sums = _flat(sum_ptr)[_cells(rows, sum_stride, cols)].float()
    top = maxes.amax(dim=-1) if blocks else torch.full((rows.numel(),), _NEG_INF, device=rows.device)
    return top + torch.log((sums * torch.exp(maxes - top[:, None])).sum(dim=-1))


def _leftmost_max(values: torch.Tensor, blocks: int, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per block of ``block`` columns of ``values`` (``[rows, blocks * block]``): Triton's
    ``max(return_indices=True)``: the max and the index in the block of its leftmost occurrence (NaN taken
    as ``-inf``)."""
    grouped = values.reshape(values.shape[0], blocks, block)
    grouped = grouped.masked_fill(grouped.isnan(), _NEG_INF)
    value = grouped.amax(dim=-1)
    first = (grouped == value[..., None]).to(torch.int8).argmax(dim=-1)
    return value, first


def _store(ptr: torch.Tensor, cells: torch.Tensor, values: torch.Tensor) -> None:
    _flat(ptr)[cells] = values.to(ptr.dtype)


# ---------------------------------------------------------------------------------------------------
# _compute_local_logits_stats_kernel


def compute_local_logits_stats_torch(
    grid: Grid,
    target_local_argmax_ptr: torch.Tensor,
    target_local_argmax_stride: int,
    target_local_max_ptr: torch.Tensor,
    target_local_max_stride: int,
    target_local_sumexp_ptr: torch.Tensor,
    target_local_sumexp_stride: int,
    draft_local_max_ptr: torch.Tensor,
    draft_local_max_stride: int,
    draft_local_sumexp_ptr: torch.Tensor,
    draft_local_sumexp_stride: int,
    target_logits_ptr: torch.Tensor,
    target_logits_stride: int,
    draft_logits_ptr: torch.Tensor | None,
    draft_logits_stride_0: int,
    draft_logits_stride_1: int,
    expanded_idx_mapping_ptr: torch.Tensor,
    expanded_local_pos_ptr: torch.Tensor,
    temp_ptr: torch.Tensor,
    vocab_size: int,
    num_speculative_steps: int,
    BLOCK_SIZE: int,
    HAS_DRAFT_LOGITS: bool,
) -> None:
    """Reference of :func:`compute_local_logits_stats`."""
    num_logits, blocks = grid_dim(grid, 0), grid_dim(grid, 1)
    if num_logits == 0 or blocks == 0:
        return
    device = target_logits_ptr.device
    step = expanded_local_pos_ptr[:num_logits].long()
    rows = (step < num_speculative_steps).nonzero().flatten()
    if rows.numel() == 0:
        return
    step = step[rows]
    state = expanded_idx_mapping_ptr[rows].long()
    temp = temp_ptr[state].float()
    cols = torch.arange(blocks * BLOCK_SIZE, device=device)
    block_ids = torch.arange(blocks, device=device)
    target = _load_cols(target_logits_ptr, rows * target_logits_stride, cols, vocab_size)
    greedy = temp == 0.0

    g = greedy.nonzero().flatten()
    if g.numel():
        value, first = _leftmost_max(target[g], blocks, BLOCK_SIZE)
        _store(
            target_local_argmax_ptr,
            _cells(rows[g], target_local_argmax_stride, block_ids),
            first + block_ids * BLOCK_SIZE,
        )
        _store(target_local_max_ptr, _cells(rows[g], target_local_max_stride, block_ids), value)

    s = (~greedy).nonzero().flatten()
    if s.numel() == 0:
        return

    def stats(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        grouped = logits.reshape(logits.shape[0], blocks, BLOCK_SIZE)
        top = grouped.amax(dim=-1)
        sumexp = torch.exp(grouped - top[..., None]).sum(dim=-1)
        return top, torch.where(top > _NEG_INF, sumexp, torch.zeros((), device=device))

    top, sumexp = stats(target[s])
    _store(target_local_max_ptr, _cells(rows[s], target_local_max_stride, block_ids), top)
    _store(target_local_sumexp_ptr, _cells(rows[s], target_local_sumexp_stride, block_ids), sumexp)
    if HAS_DRAFT_LOGITS:
        assert draft_logits_ptr is not None
        base = state[s] * draft_logits_stride_0 + step[s] * draft_logits_stride_1
        draft = _load_cols(draft_logits_ptr, base, cols, vocab_size) / temp[s, None]
        top, sumexp = stats(draft)
        _store(draft_local_max_ptr, _cells(rows[s], draft_local_max_stride, block_ids), top)
        _store(draft_local_sumexp_ptr, _cells(rows[s], draft_local_sumexp_stride, block_ids), sumexp)


def compute_local_logits_stats(grid: Grid, **arguments: Any) -> None:
    """Per logits row ``l < grid[0]`` that is a draft step (``expanded_local_pos[l] <
    num_speculative_steps``; bonus rows untouched) and vocabulary block ``b < grid[1]`` of ``BLOCK_SIZE``
    columns: greedy rows (temperature 0) get the block's target max and leftmost argmax (token id);
    sampled rows the target max and ``sum(exp(logit - max))`` (0 for an all ``-inf`` block), and with
    draft logits the same of ``draft_logits[state, step] / temperature``."""
    device = arguments["target_logits_ptr"].device
    dispatch_v2(_MODULE, "compute_local_logits_stats", compute_local_logits_stats_torch, device)(
        grid, **arguments
    )


# ---------------------------------------------------------------------------------------------------
# _compute_cumulative_log_p_kernel


def _log_probs(
    tokens: torch.Tensor,
    rows: torch.Tensor,
    state: torch.Tensor,
    step: torch.Tensor,
    temp: torch.Tensor,
    target_logits_ptr: torch.Tensor,
    target_logits_stride: int,
    target_local_max_ptr: torch.Tensor,
    target_local_max_stride: int,
    target_local_sumexp_ptr: torch.Tensor,
    target_local_sumexp_stride: int,
    draft_logits_ptr: torch.Tensor | None,
    draft_logits_stride_0: int,
    draft_logits_stride_1: int,
    draft_local_max_ptr: torch.Tensor,
    draft_local_max_stride: int,
    draft_local_sumexp_ptr: torch.Tensor,
    draft_local_sumexp_stride: int,
    vocab_num_blocks: int,
    has_draft_logits: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """vLLM's ``_compute_global_logprobs_and_logsumexp`` of one token per row: target log-prob, draft
    log-prob (0 for a one-hot draft), target and draft logsumexp (0 for a one-hot draft)."""
    target_lse = _lse(
        target_local_max_ptr,
        target_local_max_stride,
        target_local_sumexp_ptr,
        target_local_sumexp_stride,
        rows,
        vocab_num_blocks,
    )
    target = _flat(target_logits_ptr)[rows * target_logits_stride + tokens].float()
    zero = torch.zeros_like(target_lse)
    if not has_draft_logits:
        return target - target_lse, zero, target_lse, zero
    assert draft_logits_ptr is not None
    draft_lse = _lse(
        draft_local_max_ptr,
        draft_local_max_stride,
        draft_local_sumexp_ptr,
        draft_local_sumexp_stride,
        rows,
        vocab_num_blocks,
    )
    base = state * draft_logits_stride_0 + step * draft_logits_stride_1
    draft = _flat(draft_logits_ptr)[base + tokens].float() / temp
    return target - target_lse, draft - draft_lse, target_lse, draft_lse


def compute_cumulative_log_p_torch(
    grid: Grid,
    cumulative_log_p_ptr: torch.Tensor,
    target_logits_ptr: torch.Tensor,
    target_logits_stride: int,
    target_local_max_ptr: torch.Tensor,
    target_local_max_stride: int,
    target_local_sumexp_ptr: torch.Tensor,
    target_local_sumexp_stride: int,
    draft_sampled_ptr: torch.Tensor,
    draft_logits_ptr: torch.Tensor | None,
    draft_logits_stride_0: int,
    draft_logits_stride_1: int,
    draft_local_max_ptr: torch.Tensor,
    draft_local_max_stride: int,
    draft_local_sumexp_ptr: torch.Tensor,
    draft_local_sumexp_stride: int,
    cu_num_logits_ptr: torch.Tensor,
    idx_mapping_ptr: torch.Tensor,
    temp_ptr: torch.Tensor,
    vocab_num_blocks: int,
    PADDED_VOCAB_NUM_BLOCKS: int,
    HAS_DRAFT_LOGITS: bool,
) -> None:
    """Reference of :func:`compute_cumulative_log_p`."""
    num_reqs = grid_dim(grid, 0)
    if num_reqs == 0:
        return
    state = idx_mapping_ptr[:num_reqs].long()
    start = cu_num_logits_ptr[:num_reqs].long()
    num_draft = cu_num_logits_ptr[1 : num_reqs + 1].long() - start - 1
    temp = temp_ptr[state].float()
    live = temp != 0.0
    log_p = torch.zeros(num_reqs, dtype=torch.float32, device=temp.device)
    steps = int(num_draft[live].max()) if bool(live.any()) else 0
    for step in range(steps):
        act = (live & (step < num_draft)).nonzero().flatten()
        rows = start[act] + step
        tokens = draft_sampled_ptr[rows + 1].long()
        valid = tokens >= 0
        v = act[valid]
        if v.numel():
            target_lp, draft_lp, _, _ = _log_probs(
                tokens[valid], rows[valid], state[v], torch.full_like(v, step), temp[v],
                target_logits_ptr, target_logits_stride, target_local_max_ptr, target_local_max_stride,
                target_local_sumexp_ptr, target_local_sumexp_stride, draft_logits_ptr,
                draft_logits_stride_0, draft_logits_stride_1, draft_local_max_ptr, draft_local_max_stride,
                draft_local_sumexp_ptr, draft_local_sumexp_stride, vocab_num_blocks, HAS_DRAFT_LOGITS,
            )  # fmt: skip
            # tl.minimum returns the non-NaN operand (fminf): torch.fmin.
            log_p[v] = torch.fmin(log_p[v] + (target_lp - draft_lp), torch.zeros_like(target_lp))
        cumulative_log_p_ptr[rows] = log_p[act].to(cumulative_log_p_ptr.dtype)


def compute_cumulative_log_p(grid: Grid, **arguments: Any) -> None:
    """Block verification's running joint ratio, per request ``r < grid[0]`` at a non-zero temperature:
    ``cumulative_log_p[start + i] = min(cumulative_log_p[start + i - 1] + log p(d) - log q(d), 0)``
    (0 before the first step) for its draft steps ``i``, ``d`` the draft token of step ``i + 1``
    (``q`` = 1 for a one-hot draft); a ``-1`` placeholder draft carries the previous value."""
    device = arguments["target_logits_ptr"].device
    dispatch_v2(_MODULE, "compute_cumulative_log_p", compute_cumulative_log_p_torch, device)(
        grid, **arguments
    )


# ---------------------------------------------------------------------------------------------------
# _compute_local_residual_mass_kernel


def compute_local_residual_mass_torch(
    grid: Grid,
    local_residual_mass_ptr: torch.Tensor,
    local_residual_mass_stride: int,
    cumulative_log_p_ptr: torch.Tensor,
    target_logits_ptr: torch.Tensor,
    target_logits_stride: int,
    target_local_max_ptr: torch.Tensor,
    target_local_max_stride: int,
    target_local_sumexp_ptr: torch.Tensor,
    target_local_sumexp_stride: int,
    draft_logits_ptr: torch.Tensor,
    draft_logits_stride_0: int,
    draft_logits_stride_1: int,
    draft_local_max_ptr: torch.Tensor,
    draft_local_max_stride: int,
    draft_local_sumexp_ptr: torch.Tensor,
    draft_local_sumexp_stride: int,
    draft_sampled_ptr: torch.Tensor,
    expanded_idx_mapping_ptr: torch.Tensor,
    expanded_local_pos_ptr: torch.Tensor,
    temp_ptr: torch.Tensor,
    vocab_size: int,
    num_speculative_steps: int,
    vocab_num_blocks: int,
    BLOCK_SIZE: int,
    PADDED_VOCAB_NUM_BLOCKS: int,
) -> None:
    """Reference of :func:`compute_local_residual_mass`."""
    num_logits, blocks = grid_dim(grid, 0), grid_dim(grid, 1)
    if num_logits <= 1 or blocks == 0:
        return
    device = target_logits_ptr.device
    step = expanded_local_pos_ptr[: num_logits - 1].long()
    keep = (step != 0) & (step < num_speculative_steps)
    keep &= draft_sampled_ptr[1:num_logits].long() >= 0
    rows = keep.nonzero().flatten()
    state = expanded_idx_mapping_ptr[rows].long()
    temp = temp_ptr[state].float()
    live = temp != 0.0
    step = step[rows][live]
    rows, state, temp = rows[live], state[live], temp[live]
    if rows.numel() == 0:
        return
    cols = torch.arange(blocks * BLOCK_SIZE, device=device)
    target_lse = _lse(
        target_local_max_ptr, target_local_max_stride, target_local_sumexp_ptr, target_local_sumexp_stride,
        rows, vocab_num_blocks,
    )  # fmt: skip
    draft_lse = _lse(
        draft_local_max_ptr, draft_local_max_stride, draft_local_sumexp_ptr, draft_local_sumexp_stride,
        rows, vocab_num_blocks,
    )  # fmt: skip
    target_lp = (
        _load_cols(target_logits_ptr, rows * target_logits_stride, cols, vocab_size) - target_lse[:, None]
    )
    base = state * draft_logits_stride_0 + step * draft_logits_stride_1
    draft_lp = _load_cols(draft_logits_ptr, base, cols, vocab_size) / temp[:, None] - draft_lse[:, None]
    p = torch.exp(cumulative_log_p_ptr[rows - 1].float())
    excess = torch.fmax(
        p[:, None] * torch.exp(target_lp) - torch.exp(draft_lp), torch.zeros((), device=device)
    )
    partial = excess.reshape(rows.numel(), blocks, BLOCK_SIZE).sum(dim=-1)
    _store(
        local_residual_mass_ptr,
        _cells(rows, local_residual_mass_stride, torch.arange(blocks, device=device)),
        partial,
    )


def compute_local_residual_mass(grid: Grid, **arguments: Any) -> None:
    """Block verification's residual mass per vocabulary block, for the logits rows ``l`` of draft steps
    ``1 .. num_speculative_steps - 1`` (not the last row of the grid, not before a ``-1`` placeholder,
    not greedy): ``sum over the block of max(p * M_b(x) - M_s(x), 0)``, ``p = exp(cumulative_log_p[l -
    1])``, ``M_b`` / ``M_s`` the target / draft (tempered) probabilities of row ``l``."""
    device = arguments["target_logits_ptr"].device
    dispatch_v2(_MODULE, "compute_local_residual_mass", compute_local_residual_mass_torch, device)(
        grid, **arguments
    )


# ---------------------------------------------------------------------------------------------------
# _rejection_kernel


def rejection_torch(
    grid: Grid,
    sampled_ptr: torch.Tensor,
    sampled_stride: int,
    rejected_steps_ptr: torch.Tensor,
    target_rejected_logsumexp_ptr: torch.Tensor,
    draft_rejected_logsumexp_ptr: torch.Tensor,
    target_logits_ptr: torch.Tensor,
    target_logits_stride: int,
    target_local_argmax_ptr: torch.Tensor,
    target_local_argmax_stride: int,
    target_local_max_ptr: torch.Tensor,
    target_local_max_stride: int,
    target_local_sumexp_ptr: torch.Tensor,
    target_local_sumexp_stride: int,
    draft_sampled_ptr: torch.Tensor,
    draft_logits_ptr: torch.Tensor | None,
    draft_logits_stride_0: int,
    draft_logits_stride_1: int,
    draft_local_max_ptr: torch.Tensor,
    draft_local_max_stride: int,
    draft_local_sumexp_ptr: torch.Tensor,
    draft_local_sumexp_stride: int,
    cu_num_logits_ptr: torch.Tensor,
    idx_mapping_ptr: torch.Tensor,
    temp_ptr: torch.Tensor,
    seed_ptr: torch.Tensor,
    pos_ptr: torch.Tensor,
    synthetic_conditional_rates_ptr: torch.Tensor | None,
    cumulative_log_p_ptr: torch.Tensor | None,
    local_residual_mass_ptr: torch.Tensor | None,
    local_residual_mass_stride: int,
    vocab_num_blocks: int,
    PADDED_VOCAB_NUM_BLOCKS: int,
    HAS_DRAFT_LOGITS: bool,
    SYNTHETIC_MODE: bool,
    USE_BLOCK_VERIFICATION: bool,
) -> None:
    """Reference of :func:`rejection`."""
    num_reqs = grid_dim(grid, 0)
    if num_reqs == 0:
        return
    device = target_logits_ptr.device
    state = idx_mapping_ptr[:num_reqs].long()
    start = cu_num_logits_ptr[:num_reqs].long()
    num_draft = cu_num_logits_ptr[1 : num_reqs + 1].long() - start - 1
    seed = seed_ptr[state]
    temp = temp_ptr[state].float()
    greedy = temp == 0.0
    accepted_length = torch.zeros(num_reqs, dtype=torch.int64, device=device)
    target_lse = torch.zeros(num_reqs, dtype=torch.float32, device=device)
    draft_lse = torch.zeros(num_reqs, dtype=torch.float32, device=device)
    verifying = torch.ones(num_reqs, dtype=torch.bool, device=device)
    sampled = _flat(sampled_ptr)
    blocks = torch.arange(vocab_num_blocks, device=device)
    stats = (
        target_logits_ptr, target_logits_stride, target_local_max_ptr, target_local_max_stride,
        target_local_sumexp_ptr, target_local_sumexp_stride, draft_logits_ptr, draft_logits_stride_0,
        draft_logits_stride_1, draft_local_max_ptr, draft_local_max_stride, draft_local_sumexp_ptr,
        draft_local_sumexp_stride, vocab_num_blocks, HAS_DRAFT_LOGITS,
    )  # fmt: skip
    steps = int(num_draft.max()) if num_reqs else 0
    for i in range(max(steps, 0)):
        act = i < num_draft
        rows_all = start + i
        token = torch.zeros(num_reqs, dtype=torch.int64, device=device)
        token[act] = draft_sampled_ptr[rows_all[act] + 1].long()
        valid = token >= 0
        token = token.clamp_min(0)
        verifying = torch.where(act & ~greedy, verifying & valid, verifying)
        go = (act & verifying).nonzero().flatten()
        if go.numel() == 0:
            continue
        rows = rows_all[go]
        u = tl_rand32_torch(seed[go], pos_ptr[rows])
        out_cells = go * sampled_stride + i

        g = greedy[go]
        if bool(g.any()):
            gr, grows = go[g], rows[g]
            maxes = _flat(target_local_max_ptr)[_cells(grows, target_local_max_stride, blocks)].float()
            maxes = maxes.masked_fill(maxes.isnan(), _NEG_INF)
            best = (maxes == maxes.amax(dim=-1, keepdim=True)).to(torch.int8).argmax(dim=-1)
            argmax = _flat(target_local_argmax_ptr)[grows * target_local_argmax_stride + best].long()
            if SYNTHETIC_MODE:
                assert synthetic_conditional_rates_ptr is not None
                accepted = u[g] < synthetic_conditional_rates_ptr[i].float()
            else:
                accepted = argmax == token[gr]
            accepted &= valid[gr]
            verifying[gr] = accepted
            accepted_length[gr] += accepted.long()
            sampled[out_cells[g]] = torch.where(accepted, token[gr], argmax).to(sampled.dtype)

        s = ~g
        if not bool(s.any()):
            continue
        sr, srows, su = go[s], rows[s], u[s]
        if USE_BLOCK_VERIFICATION:
            assert cumulative_log_p_ptr is not None
            joint = torch.exp(cumulative_log_p_ptr[srows].float())
            nxt = torch.full_like(srows, -1)
            more = i < num_draft[sr] - 1
            nxt[more] = draft_sampled_ptr[srows[more] + 2].long()
            h = joint.clone()
            has_next = nxt >= 0
            if bool(has_next.any()):
                nrows, njoint = srows[has_next] + 1, joint[has_next]
                if HAS_DRAFT_LOGITS:
                    assert local_residual_mass_ptr is not None
                    cells = _cells(nrows, local_residual_mass_stride, blocks)
                    residual = _flat(local_residual_mass_ptr)[cells].float().sum(dim=-1)
                else:
                    lse = _lse(
                        target_local_max_ptr, target_local_max_stride, target_local_sumexp_ptr,
                        target_local_sumexp_stride, nrows, vocab_num_blocks,
                    )  # fmt: skip
                    logit = _flat(target_logits_ptr)[nrows * target_logits_stride + nxt[has_next]].float()
                    residual = njoint * (1.0 - torch.exp(logit - lse))
                denom = residual + 1.0 - njoint
                h[has_next] = torch.where(denom > 0.0, residual / denom, torch.ones_like(denom))
            accepted_length[sr] = torch.where(su <= h, i + 1, accepted_length[sr])
            sampled[out_cells[s]] = token[sr].to(sampled.dtype)
        else:
            target_lp, draft_lp, t_lse, d_lse = _log_probs(
                token[sr], srows, state[sr], torch.full_like(sr, i), temp[sr], *stats
            )
            target_lse[sr] = t_lse
            draft_lse[sr] = d_lse
            if SYNTHETIC_MODE:
                assert synthetic_conditional_rates_ptr is not None
                accepted = su < synthetic_conditional_rates_ptr[i].float()
            else:
                accepted = target_lp > torch.log(su) + draft_lp
            verifying[sr] = accepted
            accepted_length[sr] += accepted.long()
            sampled[out_cells[s]] = token[sr].to(sampled.dtype)

    rejected_steps_ptr[:num_reqs] = accepted_length.to(rejected_steps_ptr.dtype)
    if USE_BLOCK_VERIFICATION:
        r = (~greedy & (accepted_length < num_draft)).nonzero().flatten()
        if r.numel():
            rows = start[r] + accepted_length[r]
            target_lse[r] = _lse(
                target_local_max_ptr, target_local_max_stride, target_local_sumexp_ptr,
                target_local_sumexp_stride, rows, vocab_num_blocks,
            )  # fmt: skip
            if HAS_DRAFT_LOGITS:
                draft_lse[r] = _lse(
                    draft_local_max_ptr, draft_local_max_stride, draft_local_sumexp_ptr,
                    draft_local_sumexp_stride, rows, vocab_num_blocks,
                )  # fmt: skip
    target_rejected_logsumexp_ptr[:num_reqs] = target_lse.to(target_rejected_logsumexp_ptr.dtype)
    draft_rejected_logsumexp_ptr[:num_reqs] = draft_lse.to(draft_rejected_logsumexp_ptr.dtype)


def rejection(grid: Grid, **arguments: Any) -> None:
    """The accept/reject walk of each request ``r < grid[0]`` over its draft steps ``i`` (draft token =
    ``draft_sampled[start + i + 1]``, ``-1`` a placeholder that is never accepted), with the acceptance
    uniform ``u = tl.rand(seed, pos[start + i])`` (floored): greedy requests accept a draft equal to the
    target argmax and store the argmax at the first rejection; sampled requests accept while ``log p(d) >
    log u + log q(d)`` (or ``u < rate[i]`` in synthetic mode), or, with block verification, take the last
    step whose ``u <= h`` (Sun et al.). Writes the sampled drafts, the accepted count
    (``rejected_steps``) and the target/draft logsumexp of the rejected step."""
    device = arguments["target_logits_ptr"].device
    dispatch_v2(_MODULE, "rejection", rejection_torch, device)(grid, **arguments)


# ---------------------------------------------------------------------------------------------------
# _resample_kernel


def watermark_values_torch(
    logits: torch.Tensor, contexts: torch.Tensor, key_0: int, key_1: int, cols: torch.Tensor, limit: int
) -> torch.Tensor:
    """vLLM's keyed (watermark) Gumbel values ``logit - log(-log(u))`` of token ids ``cols`` for rows of
    ``logits`` (float32, NaN as ``-inf``, ``-inf`` at ``col >= limit``), ``contexts`` the rows' context
    token ids."""
    key_0, key_1 = key_0 & U32, key_1 & U32
    state = philox_context_state_torch(contexts, key_0, key_1)
    words = philox_token_words_torch(state, key_0, key_1, cols[None, :].expand(logits.shape[0], -1))
    logits = torch.where(torch.isnan(logits), _NEG_INF, logits)
    values = logits - torch.log(-torch.log(philox_uniform_torch(words)))
    return torch.where((cols < limit)[None, :], values, _NEG_INF)


def resample_torch(
    grid: Grid,
    resampled_local_argmax_ptr: torch.Tensor,
    resampled_local_argmax_stride: int,
    resampled_local_max_ptr: torch.Tensor,
    resampled_local_max_stride: int,
    target_logits_ptr: torch.Tensor,
    target_logits_stride: int,
    target_rejected_logsumexp_ptr: torch.Tensor,
    draft_logits_ptr: torch.Tensor | None,
    draft_logits_stride_0: int,
    draft_logits_stride_1: int,
    draft_rejected_logsumexp_ptr: torch.Tensor,
    rejected_step_ptr: torch.Tensor,
    cu_num_logits_ptr: torch.Tensor,
    expanded_idx_mapping_ptr: torch.Tensor,
    draft_sampled_ptr: torch.Tensor,
    temp_ptr: torch.Tensor,
    seed_ptr: torch.Tensor,
    pos_ptr: torch.Tensor,
    cumulative_log_p_ptr: torch.Tensor | None,
    contexts_ptr: torch.Tensor | None,
    contexts_stride: int,
    watermarking_ptr: torch.Tensor | None,
    watermarking_skip_mask_ptr: torch.Tensor | None,
    watermark_key_0: int,
    watermark_key_1: int,
    vocab_size: int,
    BLOCK_SIZE: int,
    HAS_DRAFT_LOGITS: bool,
    USE_FP64: bool,
    USE_BLOCK_VERIFICATION: bool,
    CONTEXT_WIDTH: int,
    WATERMARK: bool,
    DEDUPLICATE_CONTEXTS: bool,
) -> None:
    """Reference of :func:`resample`."""
    num_reqs, blocks = grid_dim(grid, 0), grid_dim(grid, 1)
    if num_reqs == 0 or blocks == 0:
        return
    device = target_logits_ptr.device
    reqs = torch.arange(num_reqs, device=device)
    step = rejected_step_ptr[:num_reqs].long()
    end = cu_num_logits_ptr[1 : num_reqs + 1].long()
    rows = cu_num_logits_ptr[:num_reqs].long() + step
    state = expanded_idx_mapping_ptr[rows].long()
    temp = temp_ptr[state].float()
    bonus = rows == end - 1
    work = ~((temp == 0.0) & ~bonus)
    reqs, step, rows, state, temp, bonus = (t[work] for t in (reqs, step, rows, state, temp, bonus))
    n = reqs.numel()
    if n == 0:
        return
    cols = torch.arange(blocks * BLOCK_SIZE, device=device)
    rejected = torch.zeros(n, dtype=torch.int64, device=device)
    rejected[~bonus] = draft_sampled_ptr[rows[~bonus] + 1].long()
    target = _load_cols(target_logits_ptr, rows * target_logits_stride, cols, vocab_size)

    watermarked = torch.zeros(n, dtype=torch.bool, device=device)
    if WATERMARK:
        assert watermarking_ptr is not None
        ok = state >= 0
        watermarked[ok] = watermarking_ptr[state[ok]] != 0
    skip = torch.zeros(n, dtype=torch.bool, device=device)
    if DEDUPLICATE_CONTEXTS:
        assert watermarking_skip_mask_ptr is not None
        skip = (watermarking_skip_mask_ptr[rows] != 0) & watermarked & (temp != 0.0)

    # A bonus step or a -1 placeholder draws from the target itself.
    residual = target.clone()
    d = (~bonus & (rejected >= 0)).nonzero().flatten()
    if d.numel() and HAS_DRAFT_LOGITS:
        assert draft_logits_ptr is not None
        base = state[d] * draft_logits_stride_0 + step[d] * draft_logits_stride_1
        draft = _load_cols(draft_logits_ptr, base, cols, vocab_size) / temp[d, None]
        target_lp = target[d] - target_rejected_logsumexp_ptr[reqs[d]].float()[:, None]
        if USE_BLOCK_VERIFICATION:
            assert cumulative_log_p_ptr is not None
            shift = torch.zeros(d.numel(), dtype=torch.float32, device=device)
            later = step[d] > 0
            shift[later] = cumulative_log_p_ptr[rows[d][later] - 1].float()
            target_lp = target_lp + shift[:, None]
        draft_lp = draft - draft_rejected_logsumexp_ptr[reqs[d]].float()[:, None]
        ratio = torch.exp(draft_lp - target_lp)
        residual[d] = torch.where(ratio < 1.0, target_lp + torch.log1p(-ratio), _NEG_INF)
    elif d.numel():
        residual[d] = torch.where(cols[None, :] != rejected[d, None], target[d], _NEG_INF)

    keyed = watermarked & (temp != 0.0) & ~skip
    values = residual.double() if USE_FP64 else residual.clone()
    k = keyed.nonzero().flatten()
    if k.numel():
        assert contexts_ptr is not None
        contexts = _flat(contexts_ptr)[
            _cells(rows[k], contexts_stride, torch.arange(CONTEXT_WIDTH, device=device))
        ]
        keyed_values = watermark_values_torch(
            residual[k], contexts, watermark_key_0, watermark_key_1, cols, vocab_size
        )
        values[k] = keyed_values.to(values.dtype)
    seeded = (~keyed).nonzero().flatten()
    if seeded.numel():
        # gumbel_block_argmax: temperature and seed of the row's state (0 for a negative state).
        st = state[seeded]
        ok = st >= 0
        row_temp = torch.where(ok, temp_ptr[st.clamp_min(0)].float(), torch.zeros((), device=device))
        row_seed = torch.where(
            ok, seed_ptr[st.clamp_min(0)].long(), torch.zeros((), dtype=torch.int64, device=device)
        )
        noisy = (row_temp != 0.0).nonzero().flatten()
        if noisy.numel():
            idx = seeded[noisy]
            pos = pos_ptr[rows[idx]].long()
            noise = gumbel_noise_torch(row_seed[noisy, None], pos[:, None], cols[None, :], use_fp64=USE_FP64)
            noised = torch.where((cols < vocab_size)[None, :], values[idx] + noise, _NEG_INF)
            values[idx] = noised.to(values.dtype)

    value, first = _leftmost_max(values, blocks, BLOCK_SIZE)
    block_ids = torch.arange(blocks, device=device)
    _store(
        resampled_local_argmax_ptr,
        _cells(reqs, resampled_local_argmax_stride, block_ids),
        first + block_ids * BLOCK_SIZE,
    )
    _store(resampled_local_max_ptr, _cells(reqs, resampled_local_max_stride, block_ids), value)


def resample(grid: Grid, **arguments: Any) -> None:
    """Per request ``r < grid[0]`` whose step ``rejected_step[r]`` needs a draw (sampled requests; greedy
    ones only at the bonus step) and vocabulary block ``b < grid[1]``: the block's Gumbel-max candidate
    (token id and value) of the residual distribution (the target logits for a bonus step or a ``-1``
    placeholder; ``max(p - q, 0)`` in log space with draft logits; the target without the rejected token
    for a one-hot draft), with vLLM's seeded murmur3 noise at the step's position, or the keyed Philox
    noise of its context for watermarked requests."""
    device = arguments["target_logits_ptr"].device
    dispatch_v2(_MODULE, "resample", resample_torch, device)(grid, **arguments)


# ---------------------------------------------------------------------------------------------------
# _insert_resampled_kernel


def insert_resampled_torch(
    grid: Grid,
    sampled_ptr: torch.Tensor,
    sampled_stride: int,
    num_sampled_ptr: torch.Tensor,
    resampled_local_argmax_ptr: torch.Tensor,
    resampled_local_argmax_stride: int,
    resampled_local_max_ptr: torch.Tensor,
    resampled_local_max_stride: int,
    resample_num_blocks: int,
    cu_num_logits_ptr: torch.Tensor,
    expanded_idx_mapping_ptr: torch.Tensor,
    temp_ptr: torch.Tensor,
    PADDED_RESAMPLE_NUM_BLOCKS: int,
) -> None:
    """Reference of :func:`insert_resampled`."""
    num_reqs = grid_dim(grid, 0)
    if num_reqs == 0:
        return
    device = sampled_ptr.device
    count = num_sampled_ptr[:num_reqs].long()
    rows = cu_num_logits_ptr[:num_reqs].long() + count
    state = expanded_idx_mapping_ptr[rows].long()
    num_sampled_ptr[:num_reqs] = (count + 1).to(num_sampled_ptr.dtype)
    bonus = rows == cu_num_logits_ptr[1 : num_reqs + 1].long() - 1
    work = (~((temp_ptr[state].float() == 0.0) & ~bonus)).nonzero().flatten()
    if work.numel() == 0:
        return
    blocks = torch.arange(resample_num_blocks, device=device)
    maxes = _flat(resampled_local_max_ptr)[_cells(work, resampled_local_max_stride, blocks)]
    maxes = maxes.masked_fill(maxes.isnan(), _NEG_INF)
    best = (maxes == maxes.amax(dim=-1, keepdim=True)).to(torch.int8).argmax(dim=-1)
    token = _flat(resampled_local_argmax_ptr)[work * resampled_local_argmax_stride + best]
    _flat(sampled_ptr)[work * sampled_stride + count[work]] = token.to(sampled_ptr.dtype)


def insert_resampled(grid: Grid, **arguments: Any) -> None:
    """Per request ``r < grid[0]``: ``num_sampled[r] += 1``, and for a step that was resampled (sampled
    requests, greedy ones at the bonus step) the token of the block with the largest candidate value
    (leftmost; NaN as ``-inf``) written at ``sampled[r, num_sampled[r]]`` (the old count)."""
    device = arguments["sampled_ptr"].device
    dispatch_v2(_MODULE, "insert_resampled", insert_resampled_torch, device)(grid, **arguments)


OVERRIDES: dict[str, Callable[..., Any]] = {
    f"{_VLLM}._compute_local_logits_stats_kernel": compute_local_logits_stats,
    f"{_VLLM}._compute_cumulative_log_p_kernel": compute_cumulative_log_p,
    f"{_VLLM}._compute_local_residual_mass_kernel": compute_local_residual_mass,
    f"{_VLLM}._rejection_kernel": rejection,
    f"{_VLLM}._resample_kernel": resample,
    f"{_VLLM}._insert_resampled_kernel": insert_resampled,
}
