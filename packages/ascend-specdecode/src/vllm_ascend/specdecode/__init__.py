"""vllm_ascend.specdecode: speculative decoding proposers (lazy exports)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vllm_ascend.core.lazy import lazy_exports
from vllm_ascend.specdecode._version import __version__

if TYPE_CHECKING:  # real signatures for type checkers; at runtime the names load lazily
    from vllm_ascend.specdecode.ngram import NgramConfigError as NgramConfigError
    from vllm_ascend.specdecode.ngram import NgramProposer as NgramProposer

_LAZY: dict[str, str] = {
    "NgramConfigError": "vllm_ascend.specdecode.ngram",
    "NgramProposer": "vllm_ascend.specdecode.ngram",
}

__all__ = ["__version__", *sorted(_LAZY)]


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
