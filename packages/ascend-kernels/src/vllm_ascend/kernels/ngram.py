"""Batched n-gram (prompt-lookup) drafting on the device: the search of the CPU n-gram proposer
(``vllm_ascend.specdecode.ngram``) for a whole batch at once, without a host round trip."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from vllm_ascend.kernels._backend import dispatch

#: The length bound used when ``max_model_len`` is None (no bound).
NO_LIMIT = 2**31 - 1


def ngram_propose_torch(
    token_ids: torch.Tensor,
    num_tokens: torch.Tensor,
    min_n: int,
    max_n: int,
    k: int,
    max_model_len: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference of :func:`ngram_propose`: every (row, continuation index) at once.

    For each index ``stop`` of a row, ``m`` is the number of tokens before ``stop`` (at most
    ``max_n``) that equal the context's last ``m`` tokens; the best ``stop`` has the largest
    ``m >= min_n``, then the largest ``stop``."""
    rows, cols = token_ids.shape
    device = token_ids.device
    limit = NO_LIMIT if max_model_len is None else max_model_len
    if cols == 0:
        return torch.full((rows, k), -1, dtype=torch.int64, device=device), torch.zeros(
            rows, dtype=torch.int32, device=device
        )
    total = num_tokens.to(torch.int64).clamp(0, cols).unsqueeze(1)  # [B, 1]
    stop = torch.arange(cols, device=device).unsqueeze(0)  # [1, L]
    alive = (stop >= 1) & (stop < total)
    matched = torch.zeros(rows, cols, dtype=torch.int64, device=device)
    for j in range(max_n):
        pos = stop - 1 - j
        alive &= pos >= 0
        got = token_ids.gather(1, pos.clamp(min=0).expand(rows, cols))
        want = token_ids.gather(1, (total - 1 - j).clamp(min=0))
        alive &= got == want
        matched += alive
    matched = torch.where(matched >= min_n, matched, 0)
    key = torch.where(matched > 0, matched * (cols + 1) + stop, -1).amax(1)
    first = key % (cols + 1)
    total = total.squeeze(1)
    count = torch.minimum(torch.minimum(total - first, limit - total), torch.full_like(total, k))
    count = torch.where((key >= 0) & (total < limit), count, 0)
    offs = torch.arange(k, device=device).unsqueeze(0)
    taken = token_ids.gather(1, (first.unsqueeze(1) + offs).clamp(max=cols - 1)).to(torch.int64)
    drafts = torch.where(offs < count.unsqueeze(1), taken, -1)
    return drafts, count.to(torch.int32)


def _check(token_ids: torch.Tensor, num_tokens: torch.Tensor, min_n: int, max_n: int, k: int, limit) -> None:
    if token_ids.ndim != 2 or token_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(
            "token_ids must be a 2-D int32 or int64 tensor, "
            f"got {token_ids.dtype} of shape {tuple(token_ids.shape)}"
        )
    if num_tokens.shape != (token_ids.shape[0],) or num_tokens.dtype.is_floating_point:
        raise ValueError(
            f"num_tokens must be an integer tensor of shape ({token_ids.shape[0]},), got {num_tokens.dtype} "
            f"of shape {tuple(num_tokens.shape)}"
        )
    for name, value, low in (("min_n", min_n, 1), ("k", k, 1), ("max_n", max_n, min_n)):
        if type(value) is not int or value < low:
            raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    if limit is not None and (type(limit) is not int or not 1 <= limit <= NO_LIMIT):
        raise ValueError(f"max_model_len must be None or an int in [1, {NO_LIMIT}], got {limit!r}")


def ngram_propose(
    token_ids: torch.Tensor,
    num_tokens: torch.Tensor,
    min_n: int,
    max_n: int,
    k: int,
    max_model_len: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompt-lookup drafts for a batch: per row, the tokens that followed the most recent earlier
    occurrence of the longest suffix n-gram of its context (``min_n <= n <= max_n``).

    ``token_ids``: ``[B, L]`` int32/int64, row ``i``'s context in its first ``num_tokens[i]`` columns.
    ``num_tokens``: ``[B]`` integer, read clamped to ``[0, L]`` (0: an inactive row, no draft).
    An occurrence must end before the context's last token; the draft is the (up to) ``k`` tokens
    after it, never past the context's end nor ``max_model_len`` (no draft once the context has
    ``max_model_len`` tokens; None: no bound). The semantics of vLLM's ``ngram`` search except that
    the most recent occurrence wins (vLLM's takes the earliest); those of our CPU ``NgramProposer``.
    Returns ``(drafts [B, k] int64 padded with -1, counts [B] int32)``; no host synchronisation.
    """
    _check(token_ids, num_tokens, min_n, max_n, k, max_model_len)
    impl = dispatch("ngram", "ngram_propose", ngram_propose_torch, token_ids.device)
    return impl(token_ids, num_tokens, min_n, max_n, k, max_model_len)


def ngram_warmup(device: torch.device | str, vocab_size: int, dtypes: Sequence[torch.dtype]) -> None:
    """Warm-up item ``ngram`` of :func:`~vllm_ascend.kernels.warmup.kernel_warmup`: the n-gram kernel has one compiled variant per token dtype
    for every ``k <= 16``; this compiles the int32 one (the dtype of vLLM's ``ngram_gpu`` token
    buffer). ``vocab_size`` only bounds the dummy tokens; ``dtypes`` (the logits') do not matter."""
    device = torch.device(device)
    tokens = torch.randint(0, max(vocab_size, 1), (2, 64), dtype=torch.int32, device=device)
    ngram_propose(tokens, torch.tensor([64, 0], dtype=torch.int32, device=device), 1, 4, 4, 256)
