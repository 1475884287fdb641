"""Bad-words masking: forbid the last token of a banned sequence when its prefix was just generated."""

from __future__ import annotations

import torch

from vllm_ascend.kernels._backend import dispatch


def apply_bad_words_torch(
    logits: torch.Tensor,
    token_history: torch.Tensor,
    history_lens: torch.Tensor,
    bad_word_tokens: torch.Tensor,
    bad_word_offsets: torch.Tensor,
    bad_word_rows: torch.Tensor,
) -> torch.Tensor:
    """Reference of :func:`apply_bad_words` (a host loop over the bad words)."""
    history = token_history.cpu().tolist()
    lens = history_lens.cpu().tolist()
    tokens = bad_word_tokens.cpu().tolist()
    offsets = bad_word_offsets.cpu().tolist()
    for w, row in enumerate(bad_word_rows.cpu().tolist()):
        word = tokens[offsets[w] : offsets[w + 1]]
        prefix = word[:-1]
        n = lens[row]
        if len(prefix) > n:
            continue
        if history[row][n - len(prefix) : n] == prefix:
            logits[row, word[-1]] = float("-inf")
    return logits


def apply_bad_words(
    logits: torch.Tensor,
    token_history: torch.Tensor,
    history_lens: torch.Tensor,
    bad_word_tokens: torch.Tensor,
    bad_word_offsets: torch.Tensor,
    bad_word_rows: torch.Tensor,
) -> torch.Tensor:
    """Set ``logits[row, last] = -inf`` for each bad word whose prefix ends the row's history; in place.

    ``logits``: ``[B, V]``. ``token_history``: ``[B, L]`` int32/int64, the row's token sequence
    (prompt + generated) left-aligned; ``history_lens``: ``[B]`` int valid lengths. Bad words in CSR
    form: ``bad_word_tokens`` ``[N]`` int (all words concatenated), ``bad_word_offsets`` ``[W + 1]``
    int (word ``w`` is ``tokens[offsets[w]:offsets[w+1]]``, non-empty), ``bad_word_rows`` ``[W]``
    int (the logits row each word belongs to). A one-token word is always masked. Returns ``logits``.
    """
    impl = dispatch("bad_words", "apply_bad_words", apply_bad_words_torch, logits.device)
    return impl(logits, token_history, history_lens, bad_word_tokens, bad_word_offsets, bad_word_rows)
