"""Overrides of the kernels of vLLM's ``vllm/v1/worker/gpu/spec_decode/acceptance_estimator.py``: the online
acceptance estimator of adaptive verification (draft-logit statistics, the logistic prediction of each
draft step's acceptance, and the Newton-IRLS accumulation and refit of its coefficients)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from vllm_ascend.kernels.v2._launch import Grid, dispatch_v2, grid_dim

_VLLM = "vllm.v1.worker.gpu.spec_decode.acceptance_estimator"
_MODULE = "spec_decode_acceptance_estimator"
_NEG_INF = float("-inf")


def _flat(t: torch.Tensor) -> torch.Tensor:
    """A 1-D view from ``t``'s first element to the end of its storage: what ``ptr + offset`` addresses."""
    offset = t.storage_offset()
    return t.as_strided((t.untyped_storage().nbytes() // t.element_size() - offset,), (1,), offset)


def _f32(value: float, like: torch.Tensor) -> torch.Tensor:
    """A Python float constant as Triton uses it in float32 arithmetic."""
    return torch.tensor(value, dtype=torch.float32, device=like.device)


# ---------------------------------------------------------------------------------------------------
# _accumulate_kernel


def accumulate_torch(
    grid: Grid,
    info_ptr: torch.Tensor,
    grad_ptr: torch.Tensor,
    idx_mapping_ptr: torch.Tensor,
    num_sampled_ptr: torch.Tensor,
    num_rejected_ptr: torch.Tensor,
    features_ptr: torch.Tensor,
    features_stride: int,
    pred_ptr: torch.Tensor,
    pred_stride: int,
    counts_ptr: torch.Tensor,
    num_reqs: int,
    BLOCK_R: int,
) -> None:
    """Reference of :func:`accumulate`."""
    steps = grid_dim(grid, 0)
    n = max(0, min(num_reqs, BLOCK_R))
    if steps == 0:
        return
    device = info_ptr.device
    step = torch.arange(steps, device=device)
    if n:
        state = idx_mapping_ptr[:n].long()
        accepted = torch.clamp_min(num_sampled_ptr[:n].long() - 1, 0)
        admitted = accepted + num_rejected_ptr[:n].long()
        feature = _flat(features_ptr)[state[None, :] * features_stride + step[:, None]].float()
        pred = _flat(pred_ptr)[state[None, :] * pred_stride + step[:, None]].float()
        observed = (step[:, None] <= accepted[None, :]) & (step[:, None] < admitted[None, :])
    else:
        feature = pred = torch.zeros((steps, 0), device=device)
        observed = torch.zeros((steps, 0), dtype=torch.bool, device=device)
        accepted = torch.zeros(0, dtype=torch.int64, device=device)
    one = _f32(1.0, feature)
    zero = _f32(0.0, feature)
    label = torch.where(step[:, None] < accepted[None, :], one, zero)
    w = torch.where(observed, pred * (one - pred), zero)
    resid = torch.where(observed, label - pred, zero)
    info = _flat(info_ptr)
    grad = _flat(grad_ptr)
    cells = step * 3
    info[cells] = info[cells] + (w * feature * feature).sum(dim=1)
    info[cells + 1] = info[cells + 1] + (w * feature).sum(dim=1)
    info[cells + 2] = info[cells + 2] + w.sum(dim=1)
    cells = step * 2
    grad[cells] = grad[cells] + (resid * feature).sum(dim=1)
    grad[cells + 1] = grad[cells + 1] + resid.sum(dim=1)
    counts_ptr[:steps] = counts_ptr[:steps] + torch.where(observed, one, zero).sum(dim=1)


def accumulate(grid: Grid, **arguments: Any) -> None:
    """The Newton-IRLS statistics of the last step's graded drafts, added per draft position ``k <
    grid[0]`` (rows of 3 and 2 in ``info`` / ``grad``): over the requests whose position ``k`` was observed
    (``k <= accepted`` and ``k < accepted + rejected``, accepted = sampled - 1), with weight ``p (1 - p)``
    and residual ``label - p`` (``p`` the stored prediction, label 1 for an accepted position):
    ``sum(w f^2)``, ``sum(w f)``, ``sum(w)``, ``sum(r f)``, ``sum(r)`` and the observation count."""
    device = arguments["info_ptr"].device
    dispatch_v2(_MODULE, "accumulate", accumulate_torch, device)(grid, **arguments)


# ---------------------------------------------------------------------------------------------------
# _refit_kernel


def refit_torch(
    grid: Grid,
    slope_ptr: torch.Tensor,
    intercepts_ptr: torch.Tensor,
    info_ptr: torch.Tensor,
    info_row_stride: int,
    grad_ptr: torch.Tensor,
    grad_row_stride: int,
    counts_ptr: torch.Tensor,
    NUM_SPECULATIVE_STEPS: int,
    L2: float,
    DAMPING: float,
    BLOCK: int,
) -> None:
    """Reference of :func:`refit`."""
    if grid_dim(grid, 0) == 0:
        return
    k = torch.arange(min(NUM_SPECULATIVE_STEPS, BLOCK), device=info_ptr.device)
    info, grad = _flat(info_ptr), _flat(grad_ptr)
    l2, damping = _f32(L2, info), _f32(DAMPING, info)
    a_k = info[k * info_row_stride].float()
    b_k = info[k * info_row_stride + 1].float()
    c_k = info[k * info_row_stride + 2].float() + l2
    a = a_k.sum() + l2
    g0 = grad[k * grad_row_stride].float().sum()
    g1_k = grad[k * grad_row_stride + 1].float()
    n = counts_ptr[k].float()
    w = slope_ptr.reshape(-1)[0].float()
    bias = intercepts_ptr[k].float()

    step_w = (g0 - (b_k * g1_k / c_k).sum()) / (a - (b_k * b_k / c_k).sum())
    total_n = n.sum()
    step_w = step_w * (total_n / (total_n + damping))
    step_w = torch.where((step_w == step_w) & (w + step_w >= 0.0), step_w, _f32(0.0, info))
    step_bias = (g1_k - b_k * step_w) / c_k
    step_bias = step_bias * (n / (n + damping))
    step_bias = torch.where(step_bias == step_bias, step_bias, _f32(0.0, info))

    slope_ptr.reshape(-1)[0] = (w + step_w).to(slope_ptr.dtype)
    intercepts_ptr[k] = (bias + step_bias).to(intercepts_ptr.dtype)
    for column in range(3):
        info[k * info_row_stride + column] = 0.0
    for column in range(2):
        grad[k * grad_row_stride + column] = 0.0
    counts_ptr[k] = 0.0


def refit(grid: Grid, **arguments: Any) -> None:
    """One damped Newton step of the logistic coefficients (shared slope, per-position intercepts) from
    the round's statistics: the ridge-regularised arrowhead system ``(XᵀWX + λI) Δθ = Xᵀr`` solved in
    closed form, the slope step damped by the round's observations (dropped if NaN or if it would make the
    slope negative), each intercept step by its position's (NaN dropped); the statistics then zeroed."""
    device = arguments["info_ptr"].device
    dispatch_v2(_MODULE, "refit", refit_torch, device)(grid, **arguments)


# ---------------------------------------------------------------------------------------------------
# _local_max_sumexp_kernel


def local_max_sumexp_torch(
    grid: Grid,
    local_max_ptr: torch.Tensor,
    local_max_stride: int,
    local_sumexp_ptr: torch.Tensor,
    local_sumexp_stride: int,
    logits_ptr: torch.Tensor,
    logits_stride: int,
    idx_mapping_ptr: torch.Tensor,
    idx_mapping_stride: int,
    temperature_ptr: torch.Tensor,
    num_tokens: int,
    vocab_size: int,
    BLOCK_SIZE: int,
) -> None:
    """Reference of :func:`local_max_sumexp`."""
    rows, blocks = min(grid_dim(grid, 0), num_tokens), grid_dim(grid, 1)
    if rows <= 0 or blocks == 0:
        return
    device = logits_ptr.device
    token = torch.arange(rows, device=device)
    state = _flat(idx_mapping_ptr)[token * idx_mapping_stride].long()
    valid = state >= 0
    temp = torch.ones(rows, dtype=torch.float32, device=device)
    temp[valid] = temperature_ptr[state[valid]].float()
    temp = torch.where(temp > 0.0, temp, _f32(1.0, temp))
    width = blocks * BLOCK_SIZE
    cols = torch.arange(width, device=device)
    logits = torch.full((rows, width), _NEG_INF, dtype=torch.float32, device=device)
    inside = min(vocab_size, width)
    if inside > 0:
        logits[:, :inside] = _flat(logits_ptr)[token[:, None] * logits_stride + cols[None, :inside]].float()
    grouped = (logits / temp[:, None]).reshape(rows, blocks, BLOCK_SIZE)
    top = grouped.amax(dim=-1)
    sumexp = torch.where(top > _NEG_INF, torch.exp(grouped - top[..., None]).sum(dim=-1), _f32(0.0, top))
    top = torch.where(valid[:, None], top, _NEG_INF)
    sumexp = torch.where(valid[:, None], sumexp, _f32(0.0, top))
    block_ids = torch.arange(blocks, device=device)
    _flat(local_max_ptr)[token[:, None] * local_max_stride + block_ids[None, :]] = top.to(local_max_ptr.dtype)
    _flat(local_sumexp_ptr)[token[:, None] * local_sumexp_stride + block_ids[None, :]] = sumexp.to(
        local_sumexp_ptr.dtype
    )


def local_max_sumexp(grid: Grid, **arguments: Any) -> None:
    """Per draft row ``t < min(grid[0], num_tokens)`` and vocabulary block ``b < grid[1]``: the max and
    ``sum(exp(x - max))`` of the block of ``logits / temperature`` (temperature <= 0 read as 1; 0 for an
    all ``-inf`` block); ``-inf`` / 0 for a padded row (negative ``idx_mapping``)."""
    device = arguments["logits_ptr"].device
    dispatch_v2(_MODULE, "local_max_sumexp", local_max_sumexp_torch, device)(grid, **arguments)


# ---------------------------------------------------------------------------------------------------
# _predict_kernel


def predict_torch(
    grid: Grid,
    features_ptr: torch.Tensor,
    features_stride: int,
    pred_ptr: torch.Tensor,
    pred_stride: int,
    conf_ptr: torch.Tensor,
    conf_stride: int,
    slope_ptr: torch.Tensor,
    intercepts_ptr: torch.Tensor,
    local_max_ptr: torch.Tensor,
    local_max_stride: int,
    local_sumexp_ptr: torch.Tensor,
    local_sumexp_stride: int,
    idx_mapping_ptr: torch.Tensor,
    idx_mapping_stride: int,
    step_ptr: torch.Tensor,
    num_tokens: int,
    vocab_num_blocks: int,
    per_token_step: bool,
    NUM_SPECULATIVE_STEPS: int,
    MAX_LOG_ODDS: float,
    PADDED_VOCAB_NUM_BLOCKS: int,
) -> None:
    """Reference of :func:`predict`."""
    rows = min(grid_dim(grid, 0), num_tokens)
    if rows <= 0:
        return
    device = local_max_ptr.device
    token = torch.arange(rows, device=device)
    state = _flat(idx_mapping_ptr)[token * idx_mapping_stride].long()
    live = state >= 0
    token, state = token[live], state[live]
    if token.numel() == 0:
        return
    if per_token_step:
        step = _flat(step_ptr)[token].long()
        batch = token // NUM_SPECULATIVE_STEPS
    else:
        step = _flat(step_ptr)[:1].long().expand(token.numel())
        batch = token
    blocks = torch.arange(vocab_num_blocks, device=device)
    maxes = _flat(local_max_ptr)[token[:, None] * local_max_stride + blocks[None, :]].float()
    sums = _flat(local_sumexp_ptr)[token[:, None] * local_sumexp_stride + blocks[None, :]].float()
    top = maxes.amax(dim=-1) if vocab_num_blocks else torch.full((token.numel(),), _NEG_INF, device=device)
    total = (sums * torch.exp(maxes - top[:, None])).sum(dim=-1)
    # Triton's minimum / maximum return the non-NaN operand (CUDA's fminf / fmaxf): torch's fmin / fmax.
    zero = _f32(0.0, total)
    complement = torch.fmax(total - 1.0, zero)
    limit = _f32(MAX_LOG_ODDS, total)
    feature = torch.fmin(torch.fmax(-torch.log(complement), -limit), limit)
    weight = slope_ptr.reshape(-1)[0].float()
    prob = torch.sigmoid(weight * feature + intercepts_ptr[step].float())
    _flat(features_ptr)[state * features_stride + step] = feature.to(features_ptr.dtype)
    _flat(pred_ptr)[state * pred_stride + step] = prob.to(pred_ptr.dtype)
    _flat(conf_ptr)[batch * conf_stride + step] = prob.to(conf_ptr.dtype)


def predict(grid: Grid, **arguments: Any) -> None:
    """Per draft row ``t < min(grid[0], num_tokens)`` of a live request (non-negative ``idx_mapping``): the
    feature ``logit(max q) = -log(sum_{z != argmax} q(z) / q(max))`` of its draft distribution (from the
    block statistics; clamped to ``±MAX_LOG_ODDS``) and the predicted acceptance ``sigmoid(slope *
    feature + intercept[step])``, stored at ``[state, step]`` of features / predictions and at ``[batch,
    step]`` of the confidences (``step`` per row with ``per_token_step``, rows ``NUM_SPECULATIVE_STEPS`` to
    a request; else one shared step, one row per request)."""
    device = arguments["local_max_ptr"].device
    dispatch_v2(_MODULE, "predict", predict_torch, device)(grid, **arguments)


OVERRIDES: dict[str, Callable[..., Any]] = {
    f"{_VLLM}._accumulate_kernel": accumulate,
    f"{_VLLM}._refit_kernel": refit,
    f"{_VLLM}._local_max_sumexp_kernel": local_max_sumexp,
    f"{_VLLM}._predict_kernel": predict,
}
