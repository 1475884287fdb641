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


def compute_topk_logprobs_torch(
    logits: torch.Tensor, num_logprobs: int, token_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Reference of :func:`compute_topk_logprobs`."""
    x = logits.to(torch.float32)
    lse = torch.logsumexp(x, dim=1, keepdim=True)
    chosen = token_ids.to(torch.int64).unsqueeze(1)
    chosen_x = x.gather(1, chosen)
    top_x, top_ids = x.topk(num_logprobs, dim=1)
    ranks = (x > chosen_x).sum(dim=1) + 1
    return torch.cat([chosen, top_ids], dim=1), torch.cat([chosen_x, top_x], dim=1) - lse, ranks


def compute_topk_logprobs(
    logits: torch.Tensor, num_logprobs: int, token_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The chosen token and the ``num_logprobs`` most likely tokens of each row; not in place.

    ``logits``: ``[B, V]`` float32/bfloat16/float16; ``token_ids``: ``[B]`` int (the sampled tokens);
    ``num_logprobs`` >= 0. Returns ``(ids [B, 1 + n] int64, logprobs [B, 1 + n] float32,
    ranks [B] int64)``: column 0 is the chosen token, columns 1.. the top ``n`` in descending order;
    ``rank = 1 + #{tokens with a strictly larger logit}``. On the Triton path the log-sum-exp and
    ranks come from one fused pass over the row; the top-``n`` ids come from ``torch.topk``.
    """
    impl = dispatch("logprobs", "compute_topk_logprobs", compute_topk_logprobs_torch, logits.device)
    return impl(logits, num_logprobs, token_ids)
