"""Speculative-decoding verification: accept or reject each request's draft tokens on the device.

A step verifies ``N`` draft tokens of ``B`` requests (request ``i`` owns the draft positions
``[cu[i-1], cu[i])`` of the flat ``[N]`` tensors, ``cu`` = ``cu_num_draft_tokens``). Each request
writes one row of ``output`` (``[B, max_spec_len + 1]``, int32, filled with
:data:`PLACEHOLDER_TOKEN_ID` by the caller): its accepted draft tokens, then the token that replaces
the first rejected one, or, when every draft token is accepted, the request's bonus token.

* Greedy requests accept a draft token while it equals the target argmax; the first mismatch
  writes the argmax and stops.
* Random requests accept draft token ``d`` at a position when ``d >= 0`` (``-1`` pads a short
  draft and is always rejected), ``q(d) > 0`` and ``p(d) / q(d) >= u`` (``p``: target probability,
  ``q``: draft probability, 1 for drafts without probabilities such as n-gram; ``u`` a uniform
  draw per position). The first rejection writes the position's recovered token: a draw from
  ``max(p - q, 0)`` (``p`` with ``d`` removed when there is no ``q``), taken as the argmax of
  ``(p - q)+ / E`` with one exponential draw ``E`` per request and token, the same exponential-race
  idea as Gumbel-max. All randomness comes in as tensors, so the kernels are deterministic.

Every function has a plain-torch reference (``<name>_torch``) with the same signature.
"""

from __future__ import annotations

import torch

from vllm_ascend.kernels._backend import dispatch

PLACEHOLDER_TOKEN_ID = -1


def _bounds(cu_num_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(start, end)`` of each request's tokens from the inclusive cumulative counts (int64)."""
    end = cu_num_tokens.to(torch.int64)
    return torch.cat([end.new_zeros(1), end[:-1]]), end


def _request_of_tokens(cu_num_tokens: torch.Tensor, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(request, position)`` of each of the ``num_tokens`` flat tokens."""
    start, end = _bounds(cu_num_tokens)
    req = torch.repeat_interleave(
        torch.arange(end.numel(), device=end.device), end - start, output_size=num_tokens
    )
    return req, torch.arange(num_tokens, device=end.device) - start[req]


def _write_until_first_rejection(
    output: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    tokens: torch.Tensor,
    rejected: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    requests: torch.Tensor,
) -> None:
    """Write ``tokens`` up to and including each request's first rejected position; append the
    bonus token to the requests in ``requests`` (bool ``[B]``) with no rejection."""
    req, pos = _request_of_tokens(cu_num_draft_tokens, tokens.numel())
    start, end = _bounds(cu_num_draft_tokens)
    # running[i]: rejections among the first i flat tokens (one prefix sum serves every request)
    running = torch.cat([rejected.new_zeros(1, dtype=torch.int64), torch.cumsum(rejected.to(torch.int64), 0)])
    written = (running[:-1] == running[start][req]) & requests[req]
    output[req[written], pos[written]] = tokens[written].to(output.dtype)
    rows = torch.nonzero(requests & (running[end] == running[start])).flatten()
    output[rows, (end - start)[rows]] = bonus_token_ids.reshape(-1)[rows].to(output.dtype)


def check_output(output: torch.Tensor, cu_num_draft_tokens: torch.Tensor) -> None:
    """``output`` must be ``[B, max_spec_len + 1]`` int32 with contiguous rows, one row per request."""
    if (
        output.dim() != 2
        or output.shape[0] != cu_num_draft_tokens.numel()
        or (output.shape[1] > 1 and output.stride(1) != 1)
        or output.dtype != torch.int32
    ):
        raise ValueError(
            f"output must be int32 [B, max_spec_len + 1] with contiguous rows and B = {cu_num_draft_tokens.numel()} "
            f"(entries of cu_num_draft_tokens); got {output.dtype} {tuple(output.shape)} stride {output.stride()}"
        )


def check_probs(target_probs: torch.Tensor, draft_probs: torch.Tensor | None, num_tokens: int) -> None:
    """Target (and draft) probabilities must be float32 ``[N, V]``, one row per draft token."""
    for name, probs in (("target_probs", target_probs), ("draft_probs", draft_probs)):
        if probs is None:
            continue
        if probs.dtype != torch.float32 or probs.dim() != 2 or probs.shape[0] != num_tokens:
            raise ValueError(
                f"{name} must be float32 [N, V] with N = {num_tokens} draft tokens; "
                f"got {probs.dtype} {tuple(probs.shape)}"
            )
    if draft_probs is not None and draft_probs.shape != target_probs.shape:
        raise ValueError(
            f"draft_probs must have the shape of target_probs {tuple(target_probs.shape)}, "
            f"got {tuple(draft_probs.shape)}"
        )


def rejection_greedy_sample_torch(
    output: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    draft_token_ids: torch.Tensor,
    target_argmax: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    is_greedy: torch.Tensor | None = None,
) -> torch.Tensor:
    """Reference of :func:`rejection_greedy_sample`."""
    batch = output.shape[0]
    requests = (
        torch.ones(batch, dtype=torch.bool, device=output.device) if is_greedy is None else is_greedy.bool()
    )
    rejected = draft_token_ids.to(torch.int64) != target_argmax.to(torch.int64)
    _write_until_first_rejection(
        output, cu_num_draft_tokens, target_argmax, rejected, bonus_token_ids, requests
    )
    return output


def rejection_greedy_sample(
    output: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    draft_token_ids: torch.Tensor,
    target_argmax: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    is_greedy: torch.Tensor | None = None,
) -> torch.Tensor:
    """Verify the draft tokens of greedy requests against the target argmax, in place in ``output``.

    ``output``: ``[B, S + 1]`` int32 (``S`` = max draft tokens per request), pre-filled with
    :data:`PLACEHOLDER_TOKEN_ID`. ``cu_num_draft_tokens``: ``[B]`` inclusive cumulative draft
    counts. ``draft_token_ids`` / ``target_argmax``: ``[N]``. ``bonus_token_ids``: ``[B]`` or
    ``[B, 1]``. ``is_greedy``: ``[B]`` bool, or ``None`` when every request is greedy; other rows
    are left as they are. Returns ``output``.
    """
    check_output(output, cu_num_draft_tokens)
    return dispatch("rejection", "rejection_greedy_sample", rejection_greedy_sample_torch, output.device)(
        output, cu_num_draft_tokens, draft_token_ids, target_argmax, bonus_token_ids, is_greedy
    )


def rejection_random_sample_torch(
    output: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    recovered_token_ids: torch.Tensor,
    uniform_probs: torch.Tensor,
    is_greedy: torch.Tensor,
) -> torch.Tensor:
    """Reference of :func:`rejection_random_sample`."""
    draft = draft_token_ids.to(torch.int64)
    valid = draft >= 0
    at = draft.clamp(min=0).unsqueeze(1)
    p = target_probs.gather(1, at).squeeze(1)
    q = torch.ones_like(p) if draft_probs is None else draft_probs.gather(1, at).squeeze(1)
    accepted = valid & (q > 0) & (p / torch.where(q > 0, q, 1.0) >= uniform_probs)
    tokens = torch.where(accepted, draft, recovered_token_ids.to(torch.int64))
    _write_until_first_rejection(
        output, cu_num_draft_tokens, tokens, ~accepted, bonus_token_ids, ~is_greedy.bool()
    )
    return output


def rejection_random_sample(
    output: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    recovered_token_ids: torch.Tensor,
    uniform_probs: torch.Tensor,
    is_greedy: torch.Tensor,
) -> torch.Tensor:
    """Probabilistic verification of the non-greedy requests' draft tokens, in place in ``output``.

    ``draft_probs``: ``[N, V]`` float32 or ``None`` (drafts without probabilities: ``q = 1``).
    ``target_probs``: ``[N, V]`` float32. ``recovered_token_ids``: ``[N]`` (from
    :func:`sample_recovered_tokens`). ``uniform_probs``: ``[N]`` float64 in ``[0, 1)``. Rows whose
    ``is_greedy`` is set are left as they are. Other arguments as in :func:`rejection_greedy_sample`.
    """
    check_output(output, cu_num_draft_tokens)
    check_probs(target_probs, draft_probs, draft_token_ids.numel())
    return dispatch("rejection", "rejection_random_sample", rejection_random_sample_torch, output.device)(
        output,
        cu_num_draft_tokens,
        draft_token_ids,
        draft_probs,
        target_probs,
        bonus_token_ids,
        recovered_token_ids,
        uniform_probs,
        is_greedy,
    )


def sample_recovered_tokens_torch(
    max_spec_len: int,
    cu_num_draft_tokens: torch.Tensor,
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    inv_q: torch.Tensor,
) -> torch.Tensor:
    """Reference of :func:`sample_recovered_tokens`."""
    num_tokens = draft_token_ids.numel()
    req, _ = _request_of_tokens(cu_num_draft_tokens, num_tokens)
    if draft_probs is None:
        prob = target_probs.clone()
        draft = draft_token_ids.to(torch.int64)
        valid = (draft >= 0).nonzero().flatten()
        prob[valid, draft[valid]] = 0.0
    else:
        prob = (target_probs - draft_probs).clamp(min=0.0)
    score = prob * inv_q[req].to(prob.dtype)
    return score.argmax(dim=1).to(draft_token_ids.dtype)


def sample_recovered_tokens(
    max_spec_len: int,
    cu_num_draft_tokens: torch.Tensor,
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    inv_q: torch.Tensor,
) -> torch.Tensor:
    """The token each draft position falls back to when rejected: per position, the lowest-id
    argmax of ``max(p - q, 0) * inv_q[request]`` (without ``q``: ``p`` with the draft token zeroed).

    ``max_spec_len``: the most draft tokens any request has (sizes the launch without reading
    ``cu_num_draft_tokens`` on the host). ``inv_q``: ``[B, V]`` float32, the reciprocals of one
    exponential draw per request and token (the caller seeds them per request). Returns ``[N]`` with
    the dtype of ``draft_token_ids``.
    """
    check_probs(target_probs, draft_probs, draft_token_ids.numel())
    if inv_q.dim() != 2 or inv_q.shape != (cu_num_draft_tokens.numel(), target_probs.shape[-1]):
        raise ValueError(
            f"inv_q must be [B, V] = {(cu_num_draft_tokens.numel(), target_probs.shape[-1])}, got {tuple(inv_q.shape)}"
        )
    return dispatch(
        "rejection", "sample_recovered_tokens", sample_recovered_tokens_torch, target_probs.device
    )(max_spec_len, cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs, inv_q)


def expand_batch_to_tokens_torch(
    x: torch.Tensor, cu_num_tokens: torch.Tensor, num_tokens: int, replace_from: int = 0, replace_to: int = 0
) -> torch.Tensor:
    """Reference of :func:`expand_batch_to_tokens`."""
    req, _ = _request_of_tokens(cu_num_tokens, num_tokens)
    out = x[req]
    return torch.where(out == replace_from, torch.full_like(out, replace_to), out)


def expand_batch_to_tokens(
    x: torch.Tensor, cu_num_tokens: torch.Tensor, num_tokens: int, replace_from: int = 0, replace_to: int = 0
) -> torch.Tensor:
    """Repeat each request's value over its tokens: ``[B]`` → ``[num_tokens]`` (e.g. temperatures
    with ``cu_num_tokens = [2, 5, 6]`` give ``[t0, t0, t1, t1, t1, t2]``); values equal to
    ``replace_from`` become ``replace_to`` (e.g. greedy temperature 0 → 1 before a division)."""
    if cu_num_tokens.numel() != x.numel():
        raise ValueError(
            f"cu_num_tokens must hold one entry per request: got {cu_num_tokens.numel()} for {x.numel()} requests"
        )
    return dispatch("rejection", "expand_batch_to_tokens", expand_batch_to_tokens_torch, x.device)(
        x, cu_num_tokens, num_tokens, replace_from, replace_to
    )
