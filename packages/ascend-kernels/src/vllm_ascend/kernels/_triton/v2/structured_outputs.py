"""Ascend Triton kernels of :mod:`vllm_ascend.kernels.v2.structured_outputs`.

One program per vector core walks the ``(mask, vocabulary tile)`` pairs grid-stride (vLLM: a 2-D grid of
one program per pair). A tile of ``WORDS * 32`` tokens is handled as a ``[WORDS, 32]`` block: the packed
int32 words are loaded once, each bit tested in place (bit ``b`` of word ``w`` = token ``32 w + b``), and
the tokens whose bit is clear get -inf.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_ascend.kernels import _geometry
from vllm_ascend.kernels._triton.common import IS_INTERPRETED, ub_cap
from vllm_ascend.kernels.v2._launch import Grid, cdiv, grid_dim, next_power_of_2

_TILE_TOKENS = 64 if IS_INTERPRETED else 8192


@triton.jit
def _apply_grammar_bitmask_kernel(
    logits_ptr,
    logits_stride,
    logits_indices_ptr,
    cu_num_logits_ptr,
    bitmask_ptr,
    bitmask_stride,
    vocab_size,
    num_masks,
    num_tiles,
    MASK_STRIDE: tl.constexpr,
    WORDS: tl.constexpr,
):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    for work in range(pid, num_masks * num_tiles, programs):
        mask_index = work // num_tiles
        tile = work % num_tiles
        mapping = tl.load(logits_indices_ptr + mask_index)
        req = mapping // MASK_STRIDE
        position = mapping % MASK_STRIDE
        logits_begin = tl.load(cu_num_logits_ptr + req)
        # A position past the request's logits (drafts trimmed on device) has no row to mask.
        if position < tl.load(cu_num_logits_ptr + req + 1) - logits_begin:
            words = tile * WORDS + tl.arange(0, WORDS)
            packed = tl.load(
                bitmask_ptr + mask_index * bitmask_stride + words, mask=words < bitmask_stride, other=0
            )
            bits = tl.arange(0, 32)
            allowed = (packed[:, None] >> bits[None, :]) & 1
            tokens = words[:, None] * 32 + bits[None, :]
            row = logits_ptr + (logits_begin + position).to(tl.int64) * logits_stride
            tl.store(
                row + tokens,
                tl.full([WORDS, 32], float("-inf"), tl.float32),
                mask=(allowed == 0) & (tokens < vocab_size),
            )


def apply_grammar_bitmask(
    grid: Grid,
    logits_ptr: torch.Tensor,
    logits_stride: int,
    logits_indices_ptr: torch.Tensor,
    cu_num_logits_ptr: torch.Tensor,
    bitmask_ptr: torch.Tensor,
    bitmask_stride: int,
    vocab_size: int,
    MASK_STRIDE: int,
    BLOCK_SIZE: int,
) -> None:
    num_masks = grid_dim(grid, 0)
    if num_masks == 0 or vocab_size <= 0:
        return
    device = logits_ptr.device
    tokens = ub_cap(device, min(max(32, next_power_of_2(vocab_size)), _TILE_TOKENS), live_tiles=4)
    tokens = max(tokens, 32)
    num_tiles = cdiv(vocab_size, tokens)
    programs = _geometry.programs(device, num_masks * num_tiles)
    _apply_grammar_bitmask_kernel[(programs,)](
        logits_ptr,
        logits_stride,
        logits_indices_ptr,
        cu_num_logits_ptr,
        bitmask_ptr,
        bitmask_stride,
        vocab_size,
        num_masks,
        num_tiles,
        MASK_STRIDE=MASK_STRIDE,
        WORDS=tokens // 32,
    )
