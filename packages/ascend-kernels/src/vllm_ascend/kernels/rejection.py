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

Other verification rules (``rejection_sampler_config.verify_method`` and vLLM's
``rejection_sample_method``) reuse the same output contract:

* :func:`rejection_block_sample`: block verification (Sun et al. 2024, "Block Verification
  Accelerates Speculative Decoding"): the accepted prefix is chosen jointly from the whole draft,
  so the output keeps the target distribution and accepts, in expectation, at least as many drafts
  as token-wise rejection.
* :func:`rejection_entropy_sample`: entropy verification, the typical acceptance of Medusa (Cai et
  al. 2024): accept ``d`` while ``p(d) >= min(epsilon, alpha * exp(-H(p)))``. **Lossy**: the output
  does not follow the target distribution (see its docstring for the law it does follow).
* :func:`rejection_synthetic_sample`: accept with given per-position rates, for benchmarking only
  (ignores the probabilities; not distribution-preserving).

Every kernel has a plain-torch reference (``<name>_torch``) with the same signature;
:func:`rejection_entropy_sample` is composed of dispatching kernels.
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


def check_inv_q(inv_q: torch.Tensor, cu_num_draft_tokens: torch.Tensor, target_probs: torch.Tensor) -> None:
    """The exponential-race reciprocals must be ``[B, V]``, one row per request."""
    if inv_q.dim() != 2 or inv_q.shape != (cu_num_draft_tokens.numel(), target_probs.shape[-1]):
        raise ValueError(
            f"inv_q must be [B, V] = {(cu_num_draft_tokens.numel(), target_probs.shape[-1])}, got {tuple(inv_q.shape)}"
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
    check_inv_q(inv_q, cu_num_draft_tokens, target_probs)
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


def _draft_rows(
    draft: torch.Tensor, draft_probs: torch.Tensor | None, shape: torch.Size, dtype: torch.dtype
) -> torch.Tensor:
    """``q`` as ``[N, V]``: the draft probabilities, or one-hot rows of the draft tokens when a
    proposer gives none; zero rows where the draft is ``-1`` (padding)."""
    valid = draft >= 0
    if draft_probs is None:
        rows = torch.zeros(shape, dtype=dtype, device=draft.device)
        idx = valid.nonzero().flatten()
        rows[idx, draft[idx]] = 1.0
        return rows
    return torch.where(valid.unsqueeze(1), draft_probs, 0.0)


def rejection_block_sample_torch(
    output: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    uniform_probs: torch.Tensor,
    inv_q: torch.Tensor,
    is_greedy: torch.Tensor,
) -> torch.Tensor:
    """Reference of :func:`rejection_block_sample`."""
    num_tokens = draft_token_ids.numel()
    req, pos = _request_of_tokens(cu_num_draft_tokens, num_tokens)
    start, end = _bounds(cu_num_draft_tokens)
    draft = draft_token_ids.to(torch.int64)
    valid = draft >= 0
    at = draft.clamp(min=0).unsqueeze(1)
    p_d = target_probs.gather(1, at).squeeze(1)
    q_d = valid.to(p_d.dtype) if draft_probs is None else draft_probs.gather(1, at).squeeze(1)
    ratio = torch.where(valid & (q_d > 0), p_d / torch.where(q_d > 0, q_d, 1.0), 0.0)
    # weight[t]: the block weight before draft token t (1 at each request's first token)
    weight = torch.ones_like(ratio)
    for j in range(1, int(pos.max()) + 1 if num_tokens else 0):
        idx = (pos == j).nonzero().flatten()
        weight[idx] = (weight[idx - 1] * ratio[idx - 1]).clamp(max=1.0)
    q = _draft_rows(draft, draft_probs, target_probs.shape, target_probs.dtype)
    scaled = weight.unsqueeze(1) * target_probs
    num = (scaled - q).clamp(min=0.0).sum(dim=1)
    den = (q - scaled).clamp(min=0.0).sum(dim=1)
    stop_prob = torch.where(den > 0, num / torch.where(den > 0, den, 1.0), (num > 0).to(num.dtype))
    # stopping after j >= 1 accepted drafts uses the uniform of draft j - 1
    previous_u = torch.cat([uniform_probs.new_ones(1), uniform_probs[:-1]])
    stops_here = (pos >= 1) & (previous_u <= stop_prob.clamp(max=1.0))
    batch = output.shape[0]
    stop = torch.zeros(batch, dtype=torch.int64, device=output.device)
    stop.scatter_reduce_(0, req, torch.where(stops_here, pos, 0), reduce="amax")
    has_draft = end > start
    last = (end - 1).clamp(min=0)
    full_weight = (weight[last] * ratio[last]).clamp(max=1.0) if num_tokens else weight.new_zeros(batch)
    whole = has_draft & (uniform_probs[last] <= full_weight) if num_tokens else has_draft
    stop = torch.where(whole, end - start, stop)
    residual = (scaled - q).clamp(min=0.0) * inv_q[req].to(scaled.dtype)
    recovered = residual.argmax(dim=1)
    tokens = torch.where(pos < stop[req], draft, recovered)
    _write_until_first_rejection(
        output, cu_num_draft_tokens, tokens, pos == stop[req], bonus_token_ids, ~is_greedy.bool()
    )
    return output


def rejection_block_sample(
    output: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    uniform_probs: torch.Tensor,
    inv_q: torch.Tensor,
    is_greedy: torch.Tensor,
) -> torch.Tensor:
    """Block verification of the non-greedy requests' drafts (Sun et al. 2024), in place in ``output``.

    For a request with ``n`` drafts ``d_0..d_{n-1}`` (``q_j``/``p_j``: draft/target rows of draft
    position ``j``; ``q_j`` one-hot at ``d_j`` without draft probabilities, zero for a ``-1`` pad):
    weights ``w_0 = 1``, ``w_{j+1} = min(w_j p_j(d_j) / q_j(d_j), 1)``; stopping after ``j`` drafts
    has probability ``h_j = sum (w_j p_j - q_j)+ / sum (q_j - w_j p_j)+`` (``h_n = w_n``); the
    accepted length is the largest ``j`` in ``1..n`` with ``u_{j-1} <= h_j``, else 0. After ``j < n``
    accepted drafts comes a draw from ``(w_j p_j - q_j)+`` (exponential race with ``inv_q``, lowest
    id on ties), after all ``n`` the bonus token. The output sequence, continued by target
    sampling, has the target distribution, and the expected accepted length is at least that of
    :func:`rejection_random_sample`. Arguments as in :func:`rejection_random_sample` and
    :func:`sample_recovered_tokens`; greedy rows are left as they are.
    """
    check_output(output, cu_num_draft_tokens)
    check_probs(target_probs, draft_probs, draft_token_ids.numel())
    check_inv_q(inv_q, cu_num_draft_tokens, target_probs)
    return dispatch("rejection", "rejection_block_sample", rejection_block_sample_torch, output.device)(
        output,
        cu_num_draft_tokens,
        draft_token_ids,
        draft_probs,
        target_probs,
        bonus_token_ids,
        uniform_probs,
        inv_q,
        is_greedy,
    )


def typical_acceptance_threshold_torch(
    target_probs: torch.Tensor, epsilon: float, alpha: float
) -> torch.Tensor:
    """Reference of :func:`typical_acceptance_threshold`."""
    entropy = torch.special.entr(target_probs).sum(dim=1)
    return torch.minimum(torch.full_like(entropy, epsilon), alpha * torch.exp(-entropy))


def typical_acceptance_threshold(target_probs: torch.Tensor, epsilon: float, alpha: float) -> torch.Tensor:
    """Per row of ``target_probs`` (float32 ``[N, V]``): ``min(epsilon, alpha * exp(-H(p)))`` with
    ``H(p) = -sum p log p`` in nats, the acceptance threshold of entropy verification. ``[N]`` float32."""
    check_probs(target_probs, None, target_probs.shape[0])
    return dispatch(
        "rejection", "typical_acceptance_threshold", typical_acceptance_threshold_torch, target_probs.device
    )(target_probs, epsilon, alpha)


def rejection_entropy_sample(
    output: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    draft_token_ids: torch.Tensor,
    target_probs: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    inv_q: torch.Tensor,
    is_greedy: torch.Tensor,
    epsilon: float,
    alpha: float,
) -> torch.Tensor:
    """Entropy verification (typical acceptance, Cai et al. 2024) of the non-greedy requests' drafts.

    A draft ``d >= 0`` is accepted while ``p(d) >= min(epsilon, alpha * exp(-H(p)))``
    (:func:`typical_acceptance_threshold`): confident positions (low entropy) demand a likely draft,
    uncertain ones accept any plausible draft. The first rejected position takes a draw from ``p``
    itself (``argmax(p * inv_q)``), all accepted the bonus token. Deterministic given the draft: no
    uniform draw, draft probabilities are not used. **Not distribution-preserving**: at a position
    where drafts come from ``q`` the output law is ``q(x) [p(x) >= t] + p(x) sum_{y: p(y) < t} q(y)``,
    not ``p`` (tokens with ``p >= epsilon`` are always accepted). Greedy rows are left as they are.
    Composed of :func:`typical_acceptance_threshold`, :func:`sample_recovered_tokens` and
    :func:`rejection_random_sample`, each dispatched on its own.
    """
    check_output(output, cu_num_draft_tokens)
    threshold = typical_acceptance_threshold(target_probs, epsilon, alpha)
    no_draft = torch.full_like(draft_token_ids, PLACEHOLDER_TOKEN_ID)  # nothing removed: a draw from p
    samples = sample_recovered_tokens(
        output.shape[1] - 1, cu_num_draft_tokens, no_draft, None, target_probs, inv_q
    )
    return rejection_random_sample(
        output,
        cu_num_draft_tokens,
        draft_token_ids,
        None,
        target_probs,
        bonus_token_ids,
        samples,
        threshold.to(torch.float64),
        is_greedy,
    )


def rejection_synthetic_sample_torch(
    output: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    draft_token_ids: torch.Tensor,
    replacement_token_ids: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    uniform_probs: torch.Tensor,
    conditional_rates: torch.Tensor,
) -> torch.Tensor:
    """Reference of :func:`rejection_synthetic_sample`."""
    _, pos = _request_of_tokens(cu_num_draft_tokens, draft_token_ids.numel())
    draft = draft_token_ids.to(torch.int64)
    rate = conditional_rates.to(uniform_probs.dtype)[pos.clamp(max=conditional_rates.numel() - 1)]
    accepted = (draft >= 0) & (pos < conditional_rates.numel()) & (uniform_probs < rate)
    tokens = torch.where(accepted, draft, replacement_token_ids.to(torch.int64))
    rows = torch.ones(output.shape[0], dtype=torch.bool, device=output.device)
    _write_until_first_rejection(output, cu_num_draft_tokens, tokens, ~accepted, bonus_token_ids, rows)
    return output


def rejection_synthetic_sample(
    output: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    draft_token_ids: torch.Tensor,
    replacement_token_ids: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    uniform_probs: torch.Tensor,
    conditional_rates: torch.Tensor,
) -> torch.Tensor:
    """Synthetic acceptance for benchmarking (vLLM's ``rejection_sample_method="synthetic"``), every row.

    Draft position ``j`` (``d >= 0``) is accepted while ``u < conditional_rates[j]`` (``[S]``
    float32, the probability of accepting position ``j`` given ``j - 1`` accepted; positions past
    ``S`` are rejected); the first rejection writes ``replacement_token_ids`` (``[N]``: the target
    argmax or recovered token), all accepted the bonus token. The target distribution plays no
    part: **not distribution-preserving**, for measuring speed at a chosen acceptance only.
    """
    check_output(output, cu_num_draft_tokens)
    if conditional_rates.dim() != 1 or conditional_rates.numel() == 0:
        raise ValueError(f"conditional_rates must be [S] with S >= 1, got {tuple(conditional_rates.shape)}")
    return dispatch(
        "rejection", "rejection_synthetic_sample", rejection_synthetic_sample_torch, output.device
    )(
        output,
        cu_num_draft_tokens,
        draft_token_ids,
        replacement_token_ids,
        bonus_token_ids,
        uniform_probs,
        conditional_rates,
    )
