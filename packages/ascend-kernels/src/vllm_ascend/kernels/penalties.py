"""Repetition, frequency and presence penalties from token counts kept across steps.

The counts live in three device tensors owned by the caller (the sampler's state), indexed by *slot*
(one per request, independent of its row in the batch):

- ``counts``: ``[S, V]`` int32, one word per token: bit 30 (:data:`PROMPT_BIT`) set when the token is
  in the prompt, bits 0-29 (:data:`COUNT_MASK`) its number of output occurrences.
- ``seen``: ``[S, C]`` int32, the tokens whose word is nonzero, in no particular order (an index of
  ``counts``: the kernels touch only these tokens, so their cost follows the distinct tokens a request
  has seen, not ``V``). ``C`` must hold every distinct token of a request: ``min(V, max_model_len)``.
- ``num_seen``: ``[S]`` int32, the length of each slot's ``seen`` list.

:func:`penalty_counts_add` adds a step's tokens (or a new request's prompt) in place,
:func:`penalty_counts_clear` empties slots for reuse and :func:`apply_penalties` applies the three
penalties to a batch of logits in one pass. The references keep the same state; their
``apply_penalties`` reads the dense ``counts`` only (that is the meaning of the state; ``seen`` is the
index the kernels walk).
"""

from __future__ import annotations

import torch

from vllm_ascend.kernels._backend import dispatch

PROMPT_BIT = 1 << 30
COUNT_MASK = PROMPT_BIT - 1


def penalty_counts_add_torch(
    counts: torch.Tensor,
    seen: torch.Tensor,
    num_seen: torch.Tensor,
    slots: torch.Tensor,
    tokens: torch.Tensor,
    is_prompt: torch.Tensor,
) -> None:
    """Reference of :func:`penalty_counts_add` (``seen`` grows in entry order)."""
    vocab, capacity = counts.shape[1], seen.shape[1]
    slots, tokens = slots.to(torch.int64), tokens.to(torch.int64)
    valid = (slots >= 0) & (tokens >= 0) & (tokens < vocab)
    s, t, p = slots[valid], tokens[valid], is_prompt.to(torch.bool)[valid]
    if not s.numel():
        return
    old = counts[s, t]
    # The first entry of each (slot, token) whose word was zero appends the token to its slot's list.
    key = s * vocab + t
    pairs, inverse = torch.unique(key, return_inverse=True)
    entry = torch.arange(key.numel(), device=key.device)
    first = torch.full((pairs.numel(),), key.numel(), dtype=torch.int64, device=key.device)
    first = first.scatter_reduce(0, inverse, entry, "amin")
    new = first[old[first] == 0].sort().values
    counts[s[p], t[p]] = counts[s[p], t[p]] | PROMPT_BIT
    counts.index_put_((s[~p], t[~p]), torch.ones_like(t[~p], dtype=counts.dtype), accumulate=True)
    if not new.numel():
        return
    new_slots, order = s[new].sort(stable=True)
    new_tokens = t[new][order]
    group_start = torch.searchsorted(new_slots, new_slots)  # index of each slot's first new token
    pos = num_seen[new_slots].to(torch.int64) + torch.arange(new.numel(), device=key.device) - group_start
    kept = pos < capacity
    seen[new_slots[kept], pos[kept]] = new_tokens[kept].to(seen.dtype)
    num_seen.index_put_((new_slots,), torch.ones_like(new_slots, dtype=num_seen.dtype), accumulate=True)


def penalty_counts_add(
    counts: torch.Tensor,
    seen: torch.Tensor,
    num_seen: torch.Tensor,
    slots: torch.Tensor,
    tokens: torch.Tensor,
    is_prompt: torch.Tensor,
) -> None:
    """Add ``N`` tokens to the kept counts, in place: entry ``i`` adds ``tokens[i]`` to slot
    ``slots[i]`` as a prompt token (sets :data:`PROMPT_BIT`) where ``is_prompt[i]``, else as one more
    output occurrence. A token whose word was zero is appended to its slot's ``seen`` list (once,
    whatever the entries repeating it). ``slots``, ``tokens``: ``[N]`` int32/int64; ``is_prompt``:
    ``[N]`` bool. Entries with a negative slot or a token outside ``[0, V)`` are skipped."""
    impl = dispatch("penalties", "penalty_counts_add", penalty_counts_add_torch, counts.device)
    impl(counts, seen, num_seen, slots, tokens, is_prompt)


def penalty_counts_clear_torch(
    counts: torch.Tensor, seen: torch.Tensor, num_seen: torch.Tensor, slots: torch.Tensor
) -> None:
    """Reference of :func:`penalty_counts_clear`."""
    slots = slots.to(torch.int64)
    counts[slots] = 0
    num_seen[slots] = 0


def penalty_counts_clear(
    counts: torch.Tensor, seen: torch.Tensor, num_seen: torch.Tensor, slots: torch.Tensor
) -> None:
    """Empty the kept counts of ``slots`` (``[N]`` int, each a valid slot), in place: every word their
    ``seen`` lists name is zeroed and their ``num_seen`` set to 0, so a slot can take a new request."""
    impl = dispatch("penalties", "penalty_counts_clear", penalty_counts_clear_torch, counts.device)
    impl(counts, seen, num_seen, slots)


def apply_penalties_torch(
    logits: torch.Tensor,
    slots: torch.Tensor,
    counts: torch.Tensor,
    seen: torch.Tensor,
    num_seen: torch.Tensor,
    repetition_penalty: torch.Tensor,
    frequency_penalty: torch.Tensor,
    presence_penalty: torch.Tensor,
    extra_output_ids: torch.Tensor | None = None,
    max_seen: int | None = None,
) -> torch.Tensor:
    """Reference of :func:`apply_penalties` (dense over ``counts``; ``seen`` and ``max_seen`` unused)."""
    vocab = logits.shape[1]
    slots = slots.to(torch.int64)
    rep, freq, pres = (p.to(torch.float32) for p in (repetition_penalty, frequency_penalty, presence_penalty))
    active = ((slots >= 0) & ((rep != 1.0) | (freq != 0.0) | (pres != 0.0))).nonzero().flatten()
    if not active.numel():
        return logits
    words = counts[slots[active]].to(torch.int64)
    out = words & COUNT_MASK
    if extra_output_ids is not None and extra_output_ids.numel():
        extra = extra_output_ids[active].to(torch.int64)
        valid = (extra >= 0) & (extra < vocab)
        out.scatter_add_(1, torch.where(valid, extra, 0), valid.to(torch.int64))
    in_output = out > 0
    seen_any = in_output | ((words & PROMPT_BIT) != 0)
    x = logits[active].to(torch.float32)
    r, f, p = rep[active, None], freq[active, None], pres[active, None]
    x = torch.where(seen_any, torch.where(x > 0, x / r, x * r), x)
    x = x - f * out.to(torch.float32) - p * in_output.to(torch.float32)
    logits[active] = x.to(logits.dtype)
    return logits


def apply_penalties(
    logits: torch.Tensor,
    slots: torch.Tensor,
    counts: torch.Tensor,
    seen: torch.Tensor,
    num_seen: torch.Tensor,
    repetition_penalty: torch.Tensor,
    frequency_penalty: torch.Tensor,
    presence_penalty: torch.Tensor,
    extra_output_ids: torch.Tensor | None = None,
    max_seen: int | None = None,
) -> torch.Tensor:
    """Apply the three penalties to ``logits`` in place from the kept counts (float32 arithmetic, one
    rounding); only the tokens a row's request has seen are read and written.

    ``logits``: ``[B, V]`` float32/bfloat16/float16, row-contiguous. ``slots``: ``[B]`` int, the state
    slot of each row (negative: no penalties). Penalties: ``[B]`` float32; rows with ``rep == 1``,
    ``freq == 0`` and ``pres == 0`` are untouched. ``extra_output_ids``: ``[B, K]`` int, tokens counted
    as output occurrences of that row on top of its slot's (speculative draft tokens; entries outside
    ``[0, V)`` are padding). ``max_seen``: an upper bound of the rows' ``num_seen`` (sizes the launch;
    default ``C``). For a token in the prompt or the output: ``x / rep`` if ``x > 0`` else ``x * rep``;
    then ``x - freq * count - pres * (count > 0)``. Returns ``logits``.
    """
    impl = dispatch("penalties", "apply_penalties", apply_penalties_torch, logits.device)
    return impl(
        logits,
        slots,
        counts,
        seen,
        num_seen,
        repetition_penalty,
        frequency_penalty,
        presence_penalty,
        extra_output_ids,
        max_seen,
    )
