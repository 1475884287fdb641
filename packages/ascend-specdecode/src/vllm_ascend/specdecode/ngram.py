"""N-gram (prompt-lookup) speculative proposer: a byte search per request (``bytes.rfind``).

For each request the last ``n`` tokens of its context are looked up earlier in the same context,
trying ``n = max_n`` first and shorter n-grams down to ``min_n``. For the longest n that occurs,
the most recent earlier occurrence wins (vLLM's proposer takes the earliest) and the (up to) ``k``
tokens that follow it are proposed. Proposals never extend the sequence beyond ``max_model_len``.

Per call, one numpy pass reduces the batch's tokens to one byte each (their low byte); then each
request is searched with ``bytes.rfind`` on those bytes, most recent occurrence first, for its last
``a`` tokens (the anchor: ``a = min(max_n, max(min_n, 2))``, two tokens unless the settings forbid).
Every hit is extended backwards while it matches; once the best match has n tokens only an earlier
occurrence of the last n+1 tokens can beat it, so the search goes on with that longer, rarer pattern,
and stops at ``max_n``. One backward scan of the context thus finds the answer, with Python work per
improvement rather than per occurrence of the last token(s). With ``min_n == 1`` and no anchor
occurrence, a second ``rfind`` looks for the last token alone. The answer is then checked on the exact
tokens; if tokens that differ only above their low byte fooled it, the search runs again checking every
candidate exactly.
"""

from __future__ import annotations

from typing import Any

import numpy as np


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

    def _check_k(self, k: int) -> int:
        if type(k) is int and 0 < k <= self.k:  # the common case, without building error context
            return k
        k = _check_int("k", k, 1)
        if k > self.k:
            raise NgramConfigError(f"k ({k}) must be <= num_speculative_tokens ({self.k})")
        return k

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
        k = self.k if k is None else self._check_k(k)
        num_tokens = np.asarray(num_tokens, dtype=np.int64)
        if token_ids.ndim != 2 or num_tokens.ndim != 1:
            raise ValueError(
                f"token_ids must be 2-D and num_tokens 1-D, got shapes {token_ids.shape} and {num_tokens.shape}"
            )
        batch = num_tokens.shape[0]
        if active is not None:
            active = np.asarray(active, dtype=bool)
            if active.shape != (batch,):
                raise ValueError(f"active must have shape ({batch},), got {active.shape}")
        lengths = num_tokens.tolist()
        if active is not None:
            lengths = [n if a else 0 for n, a in zip(lengths, active.tolist(), strict=True)]
        drafts = np.full((batch, k), -1, dtype=np.int64)
        counts = np.zeros(batch, dtype=np.int64)
        for row, draft in enumerate(self._drafts(token_ids, lengths, k)):
            drafts[row, : len(draft)] = draft
            counts[row] = len(draft)
        return drafts, counts

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
        k = self._check_k(num_speculative_tokens)
        lengths = [
            n if s else 0 for n, s in zip(num_tokens_no_spec[:batch].tolist(), sampled_token_ids, strict=True)
        ]
        return self._drafts(token_ids_cpu, lengths, k)

    def _drafts(self, token_ids: np.ndarray, lengths: list[int], k: int) -> list[list[int]]:
        """One draft (a list of token ids, maybe empty) per entry of ``lengths``: row i's context is
        ``token_ids[i, :lengths[i]]``; a length of 0 asks for no draft."""
        if token_ids.ndim != 2:
            raise ValueError(f"token_ids must be 2-D, got shape {token_ids.shape}")
        rows, cols = token_ids.shape
        if len(lengths) > rows:
            raise ValueError(f"num_tokens has {len(lengths)} requests but token_ids only {rows} rows")
        if not lengths:
            return []
        width = max(lengths)
        if min(lengths) < 0 or width > cols:
            raise ValueError(f"num_tokens must lie in [0, {cols}] (the columns of token_ids)")
        limit = self.max_model_len
        array = np.ascontiguousarray(token_ids)
        size = array.itemsize
        # one byte per token (its low byte) for the search; candidates are checked on the exact tokens
        low = array[: len(lengths), :width].astype(np.uint8).tobytes()
        typed = array.reshape(-1).data  # one flat view, read as tokens (drafts) and as bytes (checks)
        exact = typed.cast("B")
        min_n, max_n = self.min_n, self.max_n
        out: list[list[int]] = []
        lo, base = -width, -cols
        for total in lengths:
            lo += width
            base += cols
            first = (
                -1
                if total >= limit
                else _continuation(low, lo, exact, base * size, total, size, min_n, max_n)
            )
            if first < 0:
                out.append([])
            else:
                out.append(typed[base + first : base + first + min(k, total - first, limit - total)].tolist())
        return out


def _continuation(
    low: bytes, lo: int, exact: memoryview, at: int, total: int, size: int, min_n: int, max_n: int
) -> int:
    """Index of the first token after the most recent earlier occurrence of the longest suffix n-gram
    (``min_n <= n <= max_n``) of a context of ``total`` tokens; -1 if none occurs.

    The context's tokens are ``low[lo : lo + total]`` reduced to their low byte (the search) and
    ``exact[at : at + total * size]`` as they are (``size`` bytes each). The search runs on the low
    bytes alone; its answer is the exact one when its occurrence also matches exactly (an exact match
    is a low-byte match, so none can be longer or more recent). Otherwise (tokens that differ only
    above their low byte) it runs again, checking every candidate exactly.
    """
    first, n = _search(low, lo, total, min_n, max_n, None)
    if (
        first < 0
        or exact[at + (first - n) * size : at + first * size]
        == exact[at + (total - n) * size : at + total * size]
    ):
        return first
    return _search(low, lo, total, min_n, max_n, (exact, at, size))[0]


def _search(
    low: bytes, lo: int, total: int, min_n: int, max_n: int, checked: tuple[memoryview, int, int] | None
) -> tuple[int, int]:
    """(index after the chosen occurrence or -1, its length) on the low bytes; with ``checked``
    (``exact, at, size`` as in :func:`_continuation`) a candidate must also match exactly.

    Once an n-gram matched, only occurrences of the (n+1)-gram (further back) can beat it, so the
    search continues with that longer, rarer pattern: the Python work is per improvement, not per
    occurrence.
    """
    top = min(max_n, total - 1)
    if top < min_n:
        return -1, 0
    n = min(top, max(min_n, 2))  # the anchor
    end = lo + total - 1  # an occurrence must end before the last token
    tail_low = low[end + 1 - top : end + 1]
    pos = low.rfind(tail_low[top - n :], lo, end)
    first = -1
    while pos >= 0:
        stop = pos - lo + n  # the token after this occurrence of the last n tokens (low bytes)
        while (
            n <= top
            and stop >= n
            and low.startswith(tail_low[top - n :], lo + stop - n)
            and (checked is None or _same(checked, stop, total, n))
        ):
            first = stop
            n += 1
        if n > top:
            return first, top
        pos = low.rfind(tail_low[top - n :], lo, lo + stop - 1)
    if first >= 0 or n == min_n:  # (with no match, n is still the anchor)
        return first, n - 1
    pos = low.rfind(tail_low[top - 1 :], lo, end)  # min_n == 1, no anchor occurrence: the last token alone
    while pos >= 0 and checked is not None and not _same(checked, pos - lo + 1, total, 1):
        pos = low.rfind(tail_low[top - 1 :], lo, pos)
    return (pos - lo + 1, 1) if pos >= 0 else (-1, 0)


def _same(checked: tuple[memoryview, int, int], stop: int, total: int, n: int) -> bool:
    """Whether the n tokens before index ``stop`` equal the context's last n tokens exactly."""
    exact, at, size = checked
    return (
        exact[at + (stop - n) * size : at + stop * size] == exact[at + (total - n) * size : at + total * size]
    )
