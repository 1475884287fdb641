"""Replay recorded generations through a CPU drafter, as the model runner calls it, and time ``propose``.

Each request's prompt and its recorded output (what greedy decoding produced) stand in for the target
model: a step accepts the longest prefix of the request's draft that matches the recorded output, plus
one more recorded token (the target's own), exactly as greedy verification would. Requests run in waves
of ``batch_size``; a finished request leaves the batch. Only the ``propose`` calls are timed.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class ReplayStats:
    """What a replay measured."""

    steps: int
    """``propose`` calls."""
    request_steps: int
    """Requests drafted for, summed over the calls."""
    propose_s: float
    """Seconds spent in ``propose`` (all calls)."""
    first_call_ms: float
    """Milliseconds of the first call (compile or warm-up stalls show here)."""
    drafted_tokens: int
    accepted_tokens: int

    @property
    def propose_us_per_request_step(self) -> float:
        return 1e6 * self.propose_s / max(1, self.request_steps)

    @property
    def accepted_per_request_step(self) -> float:
        """Draft tokens accepted per request per step (the verified token not included)."""
        return self.accepted_tokens / max(1, self.request_steps)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / max(1, self.drafted_tokens)


def replay(
    proposer: Any,
    prompts: Sequence[Sequence[int]],
    outputs: Sequence[Sequence[int]],
    num_speculative_tokens: int,
    batch_size: int = 8,
) -> ReplayStats:
    """Drive ``proposer.propose`` (vLLM's CPU-drafter call; with ``req_ids``/``num_prompt_tokens`` when the
    proposer ``tracks_requests``) over ``prompts`` generating ``outputs``; see the module docstring."""
    if len(prompts) != len(outputs):
        raise ValueError(f"prompts ({len(prompts)}) and outputs ({len(outputs)}) must pair up")
    if batch_size < 1 or num_speculative_tokens < 1:
        raise ValueError(f"batch_size ({batch_size}) and num_speculative_tokens must be >= 1")
    tracks = bool(getattr(proposer, "tracks_requests", False))
    steps = request_steps = drafted = accepted = 0
    propose_s = 0.0
    first_call_ms = -1.0
    for wave in range(0, len(prompts), batch_size):
        ids = list(range(wave, min(wave + batch_size, len(prompts))))
        width = max(len(prompts[i]) + len(outputs[i]) for i in ids)
        tokens = np.zeros((len(ids), width), dtype=np.int64)
        lengths = np.zeros(len(ids), dtype=np.int64)
        num_prompt = np.array([len(prompts[i]) for i in ids], dtype=np.int64)
        done = np.zeros(len(ids), dtype=np.int64)  # output tokens already produced
        drafts: list[list[int]] = [[] for _ in ids]
        for row, i in enumerate(ids):
            tokens[row, : len(prompts[i])] = prompts[i]
            lengths[row] = len(prompts[i])
        while True:
            live = [row for row, i in enumerate(ids) if done[row] < len(outputs[i])]
            if not live:
                break
            sampled = []
            for row in live:
                out = outputs[ids[row]]
                draft = drafts[row]
                good = 0
                while (
                    good < len(draft) and done[row] + good < len(out) and draft[good] == out[done[row] + good]
                ):
                    good += 1
                take = list(out[done[row] : min(len(out), done[row] + good + 1)])
                drafted += len(draft)
                accepted += min(
                    good, len(take)
                )  # the last token of ``take`` is the target's unless the draft ran out
                tokens[row, lengths[row] : lengths[row] + len(take)] = take
                lengths[row] += len(take)
                done[row] += len(take)
                sampled.append(take)
            rows = np.array(live)
            args = (num_speculative_tokens, sampled, lengths[rows], tokens[rows])
            kwargs: dict[str, Any] = {}
            if tracks:
                kwargs = {"req_ids": [f"req-{ids[r]}" for r in live], "num_prompt_tokens": num_prompt[rows]}
            start = time.perf_counter()
            new = proposer.propose(*args, **kwargs)
            elapsed = time.perf_counter() - start
            if first_call_ms < 0:
                first_call_ms = 1e3 * elapsed
            propose_s += elapsed
            steps += 1
            request_steps += len(live)
            for row, draft in zip(live, new, strict=True):
                drafts[row] = list(draft)
    return ReplayStats(steps, request_steps, propose_s, max(first_call_ms, 0.0), drafted, accepted)
