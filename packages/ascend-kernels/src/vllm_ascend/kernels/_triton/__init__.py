"""Triton implementations, one module per public kernel module; imported only when Triton is used."""

from __future__ import annotations

import functools


@functools.cache
def compiled_interpreted() -> bool:
    """Whether ``@triton.jit`` in this process yields interpreter functions (``TRITON_INTERPRET=1`` at import)."""
    from vllm_ascend.kernels._triton import common

    return common.IS_INTERPRETED
