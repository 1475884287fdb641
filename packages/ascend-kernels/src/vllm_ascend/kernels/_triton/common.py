"""Shared Triton helpers: interpreter detection, block-size choice, the 32-bit hash."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _probe() -> None:
    pass


IS_INTERPRETED = not isinstance(_probe, triton.runtime.JITFunction)


def vocab_block(vocab_size: int, cap: int = 8192) -> int:
    """Power-of-two tile over the vocabulary (smaller under the interpreter, which is slow)."""
    return min(triton.next_power_of_2(vocab_size), 1024 if IS_INTERPRETED else cap)


ROW_WARPS = 16
SMALL_BATCH_ROWS = 128  # up to this many rows, per-row kernels use larger tiles (see row_block callers)


def row_block(vocab_size: int, cap: int = 2048) -> int:
    """Tile of the one-program-per-row kernels (``cap`` tuned per kernel on an H200).

    Those kernels loop over their row and load tile ``i + 1`` before working on tile ``i``: with one
    program per row, the loads in flight per program, not the number of programs, bound bandwidth.
    """
    return min(triton.next_power_of_2(vocab_size), 256 if IS_INTERPRETED else cap)


@triton.jit
def hash32(x):
    """The 32-bit mixer of ``vllm_ascend.kernels.gumbel`` (wrapping ``uint32`` arithmetic)."""
    x = x.to(tl.uint32)
    x = x ^ (x >> 16)
    x = x * 0x7FEB352D
    x = x ^ (x >> 15)
    x = x * 0x846CA68B
    return x ^ (x >> 16)


def check_logits(logits) -> None:
    """The vocabulary kernels need a 2-D tensor whose rows are contiguous."""
    if logits.dim() != 2 or (logits.shape[1] > 1 and logits.stride(1) != 1):
        raise ValueError(
            f"expected [B, V] logits with contiguous rows, got shape {tuple(logits.shape)} stride {logits.stride()}"
        )
