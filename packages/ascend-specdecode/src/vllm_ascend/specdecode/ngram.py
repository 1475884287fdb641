"""N-gram (prompt-lookup) speculative proposer, vectorised over a batch with numpy.

For each request the last ``n`` tokens of its context are looked up earlier in the same context,
trying ``n = max_n`` first and shorter n-grams down to ``min_n``. For the longest n that occurs,
the most recent earlier occurrence wins and the (up to) ``k`` tokens that follow it are proposed.
Proposals never extend the sequence beyond ``max_model_len``.

All requests are searched together: one comparison of the batch's token matrix against each
request's last token yields the candidate end positions, and each further n-gram length only
filters the surviving candidates, so the work after the first pass is proportional to the number
of partial matches rather than to the context length.
"""

from __future__ import annotations

from typing import Any

import numpy as np

_CHUNK_ELEMENTS = 1 << 22
"""Rows are processed in blocks of at most this many token positions (bounds the temporary masks)."""


class NgramConfigError(ValueError):
    """An invalid n-gram proposer setting."""


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise NgramConfigError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


class NgramProposer:
    """Prompt-lookup decoding for a batch of requests.

    ``min_n``/``max_n``: n-gram lengths searched (1 <= min_n <= max_n); ``num_speculative_tokens``:
    the most tokens proposed per request (k); ``max_model_len``: proposals stop at this length.
    """

    def __init__(self, min_n: int, max_n: int, num_speculative_tokens: int, max_model_len: int) -> None:
        self.min_n = _check_int("min_n", min_n, 1)
        self.max_n = _check_int("max_n", max_n, 1)
        if self.min_n > self.max_n:
            raise NgramConfigError(f"min_n ({self.min_n}) must be <= max_n ({self.max_n})")
        self.k = _check_int("num_speculative_tokens", num_speculative_tokens, 1)
        self.max_model_len = _check_int("max_model_len", max_model_len, 2)

    @classmethod
    def from_vllm_config(cls, vllm_config: Any) -> NgramProposer:
        """Build from a vLLM config's ``speculative_config`` (prompt_lookup_min/max) and model length."""
        spec = getattr(vllm_config, "speculative_config", None)
        if spec is None:
            raise NgramConfigError("vllm_config.speculative_config is required for the ngram method")
        for field in ("prompt_lookup_min", "prompt_lookup_max", "num_speculative_tokens"):
            if getattr(spec, field, None) is None:
                raise NgramConfigError(f"speculative_config.{field} must be set for the ngram method")
        return cls(
            spec.prompt_lookup_min,
            spec.prompt_lookup_max,
            spec.num_speculative_tokens,
            vllm_config.model_config.max_model_len,
        )

    def __repr__(self) -> str:
        return f"NgramProposer(min_n={self.min_n}, max_n={self.max_n}, k={self.k}, max_model_len={self.max_model_len})"

    def propose_batch(
        self,
        token_ids: np.ndarray,
        num_tokens: np.ndarray,
        k: int | None = None,
        active: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Drafts for rows ``0..len(num_tokens)-1`` of ``token_ids``.

        ``token_ids``: ``[rows >= B, cols]`` integer array (row i holds request i's context in its
        first ``num_tokens[i]`` columns). ``active``: optional boolean mask ``[B]`` of requests to
        draft for (others get none). Returns ``(drafts [B, k] int64, padded with -1; counts [B])``.
        """
        k = self.k if k is None else _check_int("k", k, 1)
        if k > self.k:
            raise NgramConfigError(f"k ({k}) must be <= num_speculative_tokens ({self.k})")
        num_tokens = np.asarray(num_tokens, dtype=np.int64)
        if token_ids.ndim != 2 or num_tokens.ndim != 1:
            raise ValueError(
                f"token_ids must be 2-D and num_tokens 1-D, got shapes {token_ids.shape} and {num_tokens.shape}"
            )
        batch = num_tokens.shape[0]
        if batch > token_ids.shape[0]:
            raise ValueError(f"num_tokens has {batch} requests but token_ids only {token_ids.shape[0]} rows")
        if batch and (num_tokens.min() < 0 or num_tokens.max() > token_ids.shape[1]):
            raise ValueError(f"num_tokens must lie in [0, {token_ids.shape[1]}] (the columns of token_ids)")
        if active is not None:
            active = np.asarray(active, dtype=bool)
            if active.shape != (batch,):
                raise ValueError(f"active must have shape ({batch},), got {active.shape}")
            num_tokens = np.where(active, num_tokens, 0)
        # a request needs an earlier position to match and room left before max_model_len
        num_tokens = np.where((num_tokens >= 2) & (num_tokens < self.max_model_len), num_tokens, 0)

        drafts = np.full((batch, k), -1, dtype=np.int64)
        counts = np.zeros(batch, dtype=np.int64)
        live = np.flatnonzero(num_tokens)
        if live.size == 0:
            return drafts, counts
        lo, hi = int(live[0]), int(live[-1]) + 1
        step = max(1, _CHUNK_ELEMENTS // max(1, int(num_tokens[lo:hi].max())))
        for start in range(lo, hi, step):
            stop = min(hi, start + step)
            self._propose_rows(token_ids, num_tokens, start, stop, k, drafts, counts)
        return drafts, counts

    def _propose_rows(
        self,
        token_ids: np.ndarray,
        num_tokens: np.ndarray,
        start: int,
        stop: int,
        k: int,
        drafts: np.ndarray,
        counts: np.ndarray,
    ) -> None:
        lengths = num_tokens[start:stop]
        width = int(lengths.max()) - 1  # candidate end positions: 0 .. n_tokens - 2
        if width <= 0:
            return
        tokens = token_ids[start:stop]
        row_ids = np.arange(stop - start)
        last = tokens[row_ids, np.maximum(lengths - 1, 0)]
        flat = np.flatnonzero(tokens[:, :width] == last[:, None])
        rows, cols = np.divmod(flat, width)
        keep = cols < lengths[rows] - 1
        rows, cols = rows[keep], cols[keep]

        best_end = np.full(stop - start, -1, dtype=np.int64)
        for n in range(1, self.max_n + 1):
            if n > 1:
                back = cols - (n - 1)
                ok = back >= 0
                rows, cols, back = rows[ok], cols[ok], back[ok]
                ok = tokens[rows, back] == tokens[rows, lengths[rows] - n]
                rows, cols = rows[ok], cols[ok]
            if rows.size == 0:
                break
            if n >= self.min_n:
                # candidates are sorted by (row, col): the last of each row is its most recent match
                ends = np.flatnonzero(np.append(rows[1:] != rows[:-1], True))
                best_end[rows[ends]] = cols[ends]

        found = np.flatnonzero(best_end >= 0)
        if found.size == 0:
            return
        first = best_end[found] + 1
        n_tokens = lengths[found]
        take = np.minimum(np.minimum(k, n_tokens - first), self.max_model_len - n_tokens)
        offsets = np.arange(k)
        index = np.minimum(first[:, None] + offsets, n_tokens[:, None] - 1)
        values = tokens[found[:, None], index]
        valid = offsets < take[:, None]
        drafts[start + found] = np.where(valid, values, -1)
        counts[start + found] = take

    def propose(
        self,
        num_speculative_tokens: int,
        sampled_token_ids: list[list[int]],
        num_tokens_no_spec: np.ndarray,
        token_ids_cpu: np.ndarray,
        **_unused: Any,
    ) -> list[list[int]]:
        """vLLM's drafter call shape: one list of draft ids per request (empty when none).

        Requests that sampled nothing this step (``sampled_token_ids[i] == []``) get no draft.
        """
        batch = len(sampled_token_ids)
        active = np.fromiter((len(s) > 0 for s in sampled_token_ids), dtype=bool, count=batch)
        drafts, counts = self.propose_batch(
            token_ids_cpu, num_tokens_no_spec[:batch], num_speculative_tokens, active
        )
        return [row[:c].tolist() for row, c in zip(drafts, counts.tolist(), strict=True)]
