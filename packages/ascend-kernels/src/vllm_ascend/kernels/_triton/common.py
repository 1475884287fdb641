"""Shared Triton helpers: interpreter detection, block-size choice, the 32-bit hash."""

from __future__ import annotations

import triton


@triton.jit
def _probe() -> None:
    pass


IS_INTERPRETED = not isinstance(_probe, triton.runtime.JITFunction)


def vocab_block(vocab_size: int, cap: int = 8192) -> int:
    """Power-of-two tile over the vocabulary (smaller under the interpreter, which is slow)."""
    return min(triton.next_power_of_2(vocab_size), 1024 if IS_INTERPRETED else cap)


def num_chunks(vocab_size: int, block: int) -> int:
    return triton.cdiv(vocab_size, block)


@triton.jit
def hash32(x):
    """The 32-bit mixer of ``vllm_ascend.kernels.gumbel`` on ``tl.uint32`` values."""
    x = x ^ (x >> 16)
    x = x * 0x7FEB352D
    x = x ^ (x >> 15)
    x = x * 0x846CA68B
    return x ^ (x >> 16)
