"""vllm_ascend.specdecode: speculative decoding proposers (lazy exports)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vllm_ascend.core.sdk import lazy_exports
from vllm_ascend.specdecode._version import __version__

if TYPE_CHECKING:  # real signatures for type checkers; at runtime the names load lazily
    from vllm_ascend.specdecode.dynamic import DynamicSpecConfig as DynamicSpecConfig
    from vllm_ascend.specdecode.dynamic import DynamicSpecInputError as DynamicSpecInputError
    from vllm_ascend.specdecode.dynamic import DynamicSpecScheduler as DynamicSpecScheduler
    from vllm_ascend.specdecode.ngram import NgramConfigError as NgramConfigError
    from vllm_ascend.specdecode.ngram import NgramProposer as NgramProposer
    from vllm_ascend.specdecode.replay import ReplayStats as ReplayStats
    from vllm_ascend.specdecode.replay import replay as replay
    from vllm_ascend.specdecode.suffix import SuffixCache as SuffixCache
    from vllm_ascend.specdecode.suffix import SuffixConfigError as SuffixConfigError
    from vllm_ascend.specdecode.suffix import SuffixDecodingProposer as SuffixDecodingProposer
    from vllm_ascend.specdecode.suffix import SuffixTree as SuffixTree

_LAZY: dict[str, str] = {
    "DynamicSpecConfig": "vllm_ascend.specdecode.dynamic",
    "DynamicSpecInputError": "vllm_ascend.specdecode.dynamic",
    "DynamicSpecScheduler": "vllm_ascend.specdecode.dynamic",
    "NgramConfigError": "vllm_ascend.specdecode.ngram",
    "NgramProposer": "vllm_ascend.specdecode.ngram",
    "ReplayStats": "vllm_ascend.specdecode.replay",
    "replay": "vllm_ascend.specdecode.replay",
    "SuffixCache": "vllm_ascend.specdecode.suffix",
    "SuffixConfigError": "vllm_ascend.specdecode.suffix",
    "SuffixDecodingProposer": "vllm_ascend.specdecode.suffix",
    "SuffixTree": "vllm_ascend.specdecode.suffix",
}

__all__ = ["__version__", *sorted(_LAZY)]


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
