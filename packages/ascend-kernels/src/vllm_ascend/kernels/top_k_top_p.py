"""Top-k and top-p (nucleus) filtering, defined by value thresholds.

A row keeps every token whose logit is ``>= t``: for top-k, ``t`` is the k-th largest logit (ties
with it are kept); top-p then applies to the distribution left by top-k, with ``t`` the largest
logit value ``v`` such that the probability mass of ``{x >= v}`` is ``>= p``. This definition does
not depend on a sort order, so a threshold search and a full sort give the same result.
"""

from __future__ import annotations

import torch

from vllm_ascend.kernels._backend import dispatch


def apply_top_k_top_p_torch(
    logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None
) -> torch.Tensor:
    """Reference of :func:`apply_top_k_top_p` (one sort per row, float64 mass sums; top-k alone: ``topk``)."""
    if k is None and p is None:
        return logits
    vocab = logits.shape[1]
    x = logits.to(torch.float32)
    sorted_desc = x.sort(dim=1, descending=True).values if p is not None else None
    keep = torch.ones_like(x, dtype=torch.bool)
    if k is not None:
        kk = k.to(torch.int64)
        at = (kk.clamp(1, vocab) - 1).unsqueeze(1)
        if sorted_desc is None:
            kth = x.topk(int(at.max()) + 1, dim=1).values.gather(1, at)
        else:
            kth = sorted_desc.gather(1, at)
        active = ((kk > 0) & (kk < vocab)).unsqueeze(1)
        kth = torch.where(active, kth, torch.full_like(kth, float("-inf")))
        keep &= x >= kth
        if sorted_desc is not None:  # the top-k survivors, still in descending order
            sorted_desc = sorted_desc.masked_fill(sorted_desc < kth, float("-inf"))
    if p is not None and sorted_desc is not None:
        pp = p.to(torch.float64)
        probs = torch.softmax(sorted_desc.to(torch.float64), dim=1)
        mass = probs.cumsum(dim=1)
        first = (mass < pp.unsqueeze(1)).sum(dim=1).clamp(max=vocab - 1)
        t = sorted_desc.gather(1, first.unsqueeze(1))
        active = pp < 1.0
        keep &= ~active.unsqueeze(1) | (x >= t)
    logits.masked_fill_(~keep, float("-inf"))
    return logits


def apply_top_k_top_p(logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None) -> torch.Tensor:
    """Mask tokens outside the top-k / top-p set of each row to ``-inf``, in place.

    ``logits``: ``[B, V]`` float32/bfloat16/float16, row-contiguous. ``k``: ``[B]`` int32/int64 or
    ``None``; rows with ``k <= 0`` or ``k >= V`` skip top-k. ``p``: ``[B]`` float32 in ``(0, 1]`` or
    ``None``; rows with ``p >= 1`` skip top-p. Probabilities are ``softmax`` of the logits as given
    (apply temperature first). Returns ``logits``.
    """
    impl = dispatch("top_k_top_p", "apply_top_k_top_p", apply_top_k_top_p_torch, logits.device)
    return impl(logits, k, p)
