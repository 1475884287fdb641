"""N-gram (prompt-lookup) speculative proposer, vectorised over a batch with numpy.

For each request the last ``n`` tokens of its context are looked up earlier in the same context,
trying ``n = max_n`` first and shorter n-grams down to ``min_n``. For the longest n that occurs,
the most recent earlier occurrence wins (vLLM's proposer takes the earliest) and the (up to) ``k``
tokens that follow it are proposed. Proposals never extend the sequence beyond ``max_model_len``.

Up to a few requests, each is searched on its own with ``bytes.rfind`` over its context's raw
bytes (longest n first; ``rfind`` yields the most recent occurrence). Larger batches are searched
together: one comparison of the batch's token matrix against each request's last token yields the
candidate end positions; the match length of every candidate (up to ``max_n``) is then measured
with one gather, so the work after the first pass is proportional to the number of candidates
rather than to the context length.
"""

from __future__ import annotations

from typing import Any

import numpy as np

_CHUNK_ELEMENTS = 1 << 22
"""Rows are processed in blocks of at most this many token positions (bounds the temporary masks)."""
_SMALL_BATCH = 4
"""Up to this many requests, each is searched on its own (fewer numpy calls than the batched path)."""


class NgramConfigError(ValueError):
    """An invalid n-gram proposer setting."""


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise NgramConfigError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _equal_positions(tokens: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Sorted flat indices where ``tokens[r, c] == values[r]``.

    Matches are sparse, so the boolean mask is scanned as 64-bit words (8 flags at a time) and only
    non-zero words are expanded, which is several times faster than ``np.flatnonzero`` on the mask.
    """
    size = tokens.size
    mask = np.zeros(-(-size // 8) * 8, dtype=bool)
    np.equal(tokens, values[:, None], out=mask[:size].reshape(tokens.shape))
    words = np.flatnonzero(mask.view(np.uint64) != 0)
    flat = (words[:, None] * 8 + np.arange(8)).ravel()
    return flat[mask[flat]]


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
        if live.size <= _SMALL_BATCH:
            for row in live.tolist():
                draft = self._propose_one(token_ids[row, : num_tokens[row]], k)
                drafts[row, : len(draft)] = draft
                counts[row] = len(draft)
            return drafts, counts
        lo, hi = int(live[0]), int(live[-1]) + 1
        step = max(1, _CHUNK_ELEMENTS // max(1, int(num_tokens[lo:hi].max())))
        for start in range(lo, hi, step):
            stop = min(hi, start + step)
            self._propose_rows(token_ids, num_tokens, start, stop, k, drafts, counts)
        return drafts, counts

    def _propose_one(self, context: np.ndarray, k: int) -> np.ndarray:
        """Drafts for one request: byte-level ``rfind`` of the suffix, longest n first.

        ``bytes.rfind`` returns the most recent occurrence; one that does not start on a token
        boundary is skipped by searching again before it.
        """
        size = context.itemsize
        total = len(context)
        raw = context.tobytes()
        for n in range(min(self.max_n, total - 1), self.min_n - 1, -1):
            pattern = raw[(total - n) * size :]
            pos = raw.rfind(pattern, 0, (total - 1) * size)
            while pos > 0 and pos % size:
                pos = raw.rfind(pattern, 0, pos - 1 + len(pattern))
            if pos >= 0:
                first = pos // size + n
                return context[first : first + min(k, total - first, self.max_model_len - total)]
        return context[:0]

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
        last = tokens[np.arange(stop - start), np.maximum(lengths - 1, 0)]
        rows, cols = np.divmod(_equal_positions(tokens[:, :width], last), width)
        keep = cols < lengths[rows] - 1
        rows, cols = rows[keep], cols[keep]
        if rows.size == 0:
            return
        # match length of each candidate end position against the context's suffix, capped at max_n
        back = np.arange(1, self.max_n)
        earlier = cols[:, None] - back
        suffix = (lengths[rows] - 1)[:, None] - back
        equal = (earlier >= 0) & (
            tokens[rows[:, None], np.maximum(earlier, 0)] == tokens[rows[:, None], np.maximum(suffix, 0)]
        )
        match = 1 + np.cumprod(equal, axis=1).sum(axis=1)
        ok = match >= self.min_n
        rows, cols, match = rows[ok], cols[ok], match[ok]
        if rows.size == 0:
            return
        # per row (rows are sorted): the longest match, and among those the most recent
        key = match * (width + 1) + cols
        firsts = np.flatnonzero(np.concatenate(([True], rows[1:] != rows[:-1])))
        found = rows[firsts]
        first = np.maximum.reduceat(key, firsts) % (width + 1) + 1
        n_tokens = lengths[found]
        take = np.minimum(np.minimum(k, n_tokens - first), self.max_model_len - n_tokens)
        offsets = np.arange(k)
        values = tokens[found[:, None], np.minimum(first[:, None] + offsets, n_tokens[:, None] - 1)]
        drafts[start + found] = np.where(offsets < take[:, None], values, -1)
        counts[start + found] = take

    def propose(
        self,
        num_speculative_tokens: int,
        sampled_token_ids: list[list[int]],
        num_tokens_no_spec: np.ndarray,
        token_ids_cpu: np.ndarray,
        slot_mappings: Any = None,
    ) -> list[list[int]]:
        """vLLM 0.32's n-gram drafter call (``GPUModelRunner.propose_draft_token_ids``): one list of
        draft ids per request, empty when there is none.

        Requests that sampled nothing this step (``sampled_token_ids[i] == []``) get no draft;
        ``slot_mappings`` is unused (no model runs). ``num_speculative_tokens`` may be below the
        configured k (vLLM's dynamic speculation), down to 0.
        """
        batch = len(sampled_token_ids)
        if num_speculative_tokens == 0:
            return [[] for _ in range(batch)]
        active = np.fromiter((len(s) > 0 for s in sampled_token_ids), dtype=bool, count=batch)
        drafts, counts = self.propose_batch(
            token_ids_cpu, num_tokens_no_spec[:batch], num_speculative_tokens, active
        )
        return [row[:c] for row, c in zip(drafts.tolist(), counts.tolist(), strict=True)]
