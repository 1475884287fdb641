"""Log-probabilities of chosen tokens, and top-k log-probabilities with the chosen token's rank."""

from __future__ import annotations

import torch

from vllm_ascend.kernels._backend import dispatch


def compute_token_logprobs_torch(logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """Reference of :func:`compute_token_logprobs`."""
    lp = torch.log_softmax(logits.to(torch.float32), dim=-1)
    ids = token_ids.to(torch.int64)
    return lp.gather(1, ids if ids.dim() == 2 else ids.unsqueeze(1)).reshape(ids.shape)


def compute_token_logprobs(logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """``log_softmax(logits)[row, token]`` in float32; not in place.

    ``logits``: ``[B, V]`` float32/bfloat16/float16. ``token_ids``: ``[B]`` or ``[B, K]`` int32/int64
    ids in ``[0, V)``. Returns float32 of ``token_ids``' shape.
    """
    impl = dispatch("logprobs", "compute_token_logprobs", compute_token_logprobs_torch, logits.device)
    return impl(logits, token_ids)


TRITON_MAX_LOGPROBS = 256
"""Largest ``num_logprobs`` the Triton path serves (it ranks its entries pairwise); above, the
reference's stable sort is the faster way anyway."""


def compute_topk_logprobs_torch(
    logits: torch.Tensor, num_logprobs: int, token_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Reference of :func:`compute_topk_logprobs` (a stable sort: equal logits in token order)."""
    x = logits.to(torch.float32)
    lse = torch.logsumexp(x, dim=1, keepdim=True)
    chosen = token_ids.to(torch.int64).unsqueeze(1)
    chosen_x = x.gather(1, chosen)
    top_ids = torch.sort(x, dim=1, descending=True, stable=True).indices[:, :num_logprobs]
    ranks = (x > chosen_x).sum(dim=1) + 1
    return (
        torch.cat([chosen, top_ids], dim=1),
        torch.cat([chosen_x, x.gather(1, top_ids)], dim=1) - lse,
        ranks,
    )


def compute_topk_logprobs(
    logits: torch.Tensor, num_logprobs: int, token_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The chosen token and the ``num_logprobs`` most likely tokens of each row; not in place.

    ``logits``: ``[B, V]`` float32/bfloat16/float16; ``token_ids``: ``[B]`` int (the sampled tokens);
    ``0 <= num_logprobs <= V``. Returns ``(ids [B, 1 + n] int64, logprobs [B, 1 + n] float32,
    ranks [B] int64)``: column 0 is the chosen token, columns 1.. the top ``n`` in descending order,
    equal logits in token-id order (so the result is deterministic);
    ``rank = 1 + #{tokens with a strictly larger logit}``. The Triton path reads each row once
    (log-sum-exp, rank and sub-tile maxima) and then only the few sub-tiles that hold the top ``n``.
    """
    vocab = logits.shape[-1]
    if not 0 <= num_logprobs <= vocab:
        raise ValueError(f"num_logprobs must be in [0, {vocab}] (the vocabulary size), got {num_logprobs}")
    if num_logprobs > TRITON_MAX_LOGPROBS:
        return compute_topk_logprobs_torch(logits, num_logprobs, token_ids)
    impl = dispatch("logprobs", "compute_topk_logprobs", compute_topk_logprobs_torch, logits.device)
    return impl(logits, num_logprobs, token_ids)
