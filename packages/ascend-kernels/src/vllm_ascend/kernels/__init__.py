"""Sampling, KV-cache and sequence kernels: portable Triton with plain-torch references.

Every public function dispatches per call on its tensors' device (see ``_backend``): the Triton
kernel where Triton can run there, else the torch reference of the same signature
(``<name>_torch`` in the same module). Importing this package imports neither vLLM nor Triton;
attributes load lazily.
"""

from __future__ import annotations

import importlib
from typing import Any

from vllm_ascend.kernels._version import __version__

_EXPORTS = {
    "apply_temperature": "temperature",
    "gumbel_sample": "gumbel",
    "apply_min_p": "min_p",
    "apply_top_k_top_p": "top_k_top_p",
    "apply_penalties": "penalties",
    "apply_bad_words": "bad_words",
    "compute_token_logprobs": "logprobs",
    "compute_topk_logprobs": "logprobs",
    "zero_kv_blocks": "kv_zero",
    "compute_slot_mapping": "slot_mapping",
    "causal_conv1d_fn": "conv1d",
    "causal_conv1d_update": "conv1d",
    "fused_gdn_gating": "gdn_gating",
    "PAD_SLOT_ID": "slot_mapping",
    "KernelBackendError": "_backend",
    "use_triton": "_backend",
    "kernel_warmup": "warmup",
    "penalties_warmup": "warmup",
    "register_warmup": "warmup",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
