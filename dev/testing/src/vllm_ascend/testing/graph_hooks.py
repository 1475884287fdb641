"""Test-only hooks that break the graph-replay contract on purpose, so tests can show it is exercised."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from vllm_ascend.runner.graph_wrapper import ACLGraphWrapper


@contextmanager
def stale_attention_params() -> Iterator[None]:
    """While active, FULL graph replays skip the attention-parameter update: they read the sequence lengths,
    query offsets and block tables left in the captured metadata's static buffers by the capture (or the
    last updated replay), as a runner that forgot to refresh them would. Tokens must change."""

    def skip(self: ACLGraphWrapper, captured: Any, current: Any) -> None:
        return None

    saved = ACLGraphWrapper.refresh_attention_params
    ACLGraphWrapper.refresh_attention_params = skip  # type: ignore[method-assign]
    try:
        yield
    finally:
        ACLGraphWrapper.refresh_attention_params = saved  # type: ignore[method-assign]
