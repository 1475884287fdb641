"""What the Ascend attention backend serves: head sizes, dtypes (from the device profile), KV dtypes."""

from __future__ import annotations

import torch

from vllm_ascend.core.sdk import get_current_hardware_profile

#: Head sizes the fused-infer-attention op takes: multiples of 16 up to 512.
HEAD_SIZE_MULTIPLE = 16
MAX_HEAD_SIZE = 512
KV_CACHE_DTYPES = ("auto", "float16", "bfloat16")
#: Every dtype some device profile may allow; the current profile narrows it (``supported_dtypes()``).
ALL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


class AttentionConfigError(ValueError):
    """A model/config that the Ascend attention backend cannot serve."""


def supported_dtypes() -> tuple[torch.dtype, ...]:
    """Model dtypes of the current device, from its hardware profile."""
    return tuple(getattr(torch, name) for name in get_current_hardware_profile().supported_dtypes)


def check_supported(head_size: int, dtype: torch.dtype, kv_cache_dtype: str | None) -> None:
    """Raise :class:`AttentionConfigError` naming the field and the allowed values."""
    device = get_current_hardware_profile().name
    if head_size % HEAD_SIZE_MULTIPLE != 0 or not 0 < head_size <= MAX_HEAD_SIZE:
        raise AttentionConfigError(
            f"head_size={head_size} is not supported by the Ascend attention backend on {device}; "
            f"allowed: multiples of {HEAD_SIZE_MULTIPLE} from {HEAD_SIZE_MULTIPLE} to {MAX_HEAD_SIZE}"
        )
    allowed = supported_dtypes()
    if dtype not in allowed:
        raise AttentionConfigError(
            f"dtype={dtype} is not supported by the Ascend attention backend on {device}; "
            f"allowed: {', '.join(str(d).removeprefix('torch.') for d in allowed)}"
        )
    if kv_cache_dtype is not None and kv_cache_dtype not in KV_CACHE_DTYPES:
        raise AttentionConfigError(
            f"kv_cache_dtype={kv_cache_dtype!r} is not supported by the Ascend attention backend; "
            f"allowed: {', '.join(KV_CACHE_DTYPES)}"
        )
