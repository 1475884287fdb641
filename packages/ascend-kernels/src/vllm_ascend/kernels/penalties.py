"""Repetition, frequency and presence penalties from prompt and output token histories."""

from __future__ import annotations

import torch

from vllm_ascend.kernels._backend import dispatch


def token_bincount_torch(token_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``[B, vocab_size]`` int32 occurrence counts of ``token_ids`` ``[B, L]``; ids outside ``[0, V)`` are padding."""
    ids = token_ids.to(torch.int64)
    valid = (ids >= 0) & (ids < vocab_size)
    counts = torch.zeros(ids.shape[0], vocab_size + 1, dtype=torch.int32, device=ids.device)
    counts.scatter_add_(1, torch.where(valid, ids, vocab_size), valid.to(torch.int32))
    return counts[:, :vocab_size]


def apply_penalties_torch(
    logits: torch.Tensor,
    prompt_token_ids: torch.Tensor,
    output_token_ids: torch.Tensor,
    repetition_penalty: torch.Tensor,
    frequency_penalty: torch.Tensor,
    presence_penalty: torch.Tensor,
) -> torch.Tensor:
    """Reference of :func:`apply_penalties` (dense bincounts)."""
    vocab = logits.shape[1]
    out_counts = token_bincount_torch(output_token_ids, vocab)
    in_output = out_counts > 0
    seen = in_output | (token_bincount_torch(prompt_token_ids, vocab) > 0)
    x = logits.to(torch.float32)
    rep = repetition_penalty.to(torch.float32).unsqueeze(1)
    x = torch.where(seen, torch.where(x > 0, x / rep, x * rep), x)
    x = x - frequency_penalty.to(torch.float32).unsqueeze(1) * out_counts.to(torch.float32)
    x = x - presence_penalty.to(torch.float32).unsqueeze(1) * in_output.to(torch.float32)
    logits.copy_(x.to(logits.dtype))
    return logits


def apply_penalties(
    logits: torch.Tensor,
    prompt_token_ids: torch.Tensor,
    output_token_ids: torch.Tensor,
    repetition_penalty: torch.Tensor,
    frequency_penalty: torch.Tensor,
    presence_penalty: torch.Tensor,
) -> torch.Tensor:
    """Apply the three penalties to ``logits`` in place (float32 arithmetic, one rounding).

    ``logits``: ``[B, V]`` float32/bfloat16/float16, row-contiguous.
    ``prompt_token_ids``: ``[B, P]`` int32/int64; ``output_token_ids``: ``[B, O]`` int32/int64;
    entries outside ``[0, V)`` (e.g. ``-1`` or ``V``) are padding. Penalties: ``[B]`` float32.
    For a token seen in the prompt or the output: ``x / rep`` if ``x > 0`` else ``x * rep``; then
    ``x - freq * output_count - presence * (output_count > 0)``.
    The Triton path counts only the history tokens (a scatter into a cached int32 ``[B, V]``
    scratch that it leaves zeroed), so its cost follows ``B * (P + O)``, not ``B * V``.
    Returns ``logits``.
    """
    impl = dispatch("penalties", "apply_penalties", apply_penalties_torch, logits.device)
    return impl(
        logits, prompt_token_ids, output_token_ids, repetition_penalty, frequency_penalty, presence_penalty
    )
