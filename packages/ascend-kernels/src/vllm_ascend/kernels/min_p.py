"""Min-p filtering."""

from __future__ import annotations

import torch

from vllm_ascend.kernels._backend import dispatch


def apply_min_p_torch(
    logits: torch.Tensor, min_p: torch.Tensor, temperature: torch.Tensor | None = None
) -> torch.Tensor:
    """Reference of :func:`apply_min_p`."""
    x = logits.to(torch.float32)
    mp = min_p.to(torch.float32).unsqueeze(1)
    log_p = torch.log(torch.where(mp > 0, mp, torch.ones_like(mp)))
    if temperature is not None:
        t = temperature.to(torch.float32).unsqueeze(1)
        log_p = log_p * torch.where(t > 0, t, torch.ones_like(t))
    threshold = x.max(dim=1, keepdim=True).values + log_p
    drop = (mp > 0) & (x < threshold)
    logits.masked_fill_(drop, float("-inf"))
    return logits


def apply_min_p(
    logits: torch.Tensor, min_p: torch.Tensor, temperature: torch.Tensor | None = None
) -> torch.Tensor:
    """Mask tokens whose probability is below ``min_p * max probability`` to ``-inf``, in place.

    ``logits``: ``[B, V]`` float32/bfloat16/float16, row-contiguous. ``min_p``: ``[B]`` float32;
    rows with ``min_p <= 0`` are unchanged. Equivalent test in logit space (computed in float32):
    drop ``x`` when ``x < max(x) + log(min_p)``. ``temperature`` (``[B]`` float32): the probabilities
    are those of ``softmax(logits / T)`` while ``logits`` stay unscaled, so a sampler need not scale
    them first: drop ``x`` when ``x < max(x) + T * log(min_p)`` (rows with ``T <= 0`` as ``T = 1``).
    Returns ``logits``.
    """
    impl = dispatch("min_p", "apply_min_p", apply_min_p_torch, logits.device)
    return impl(logits, min_p, temperature)
