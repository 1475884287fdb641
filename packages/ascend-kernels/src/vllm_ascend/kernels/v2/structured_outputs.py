"""Overrides of the kernels of vLLM's ``vllm/v1/worker/gpu/structured_outputs.py``: grammar bitmasks
applied to the logits."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from vllm_ascend.kernels.v2._launch import Grid, dispatch_v2, grid_dim

_VLLM = "vllm.v1.worker.gpu.structured_outputs"
_BITS = torch.arange(32, dtype=torch.int32)


def apply_grammar_bitmask_torch(
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
    """Reference of :func:`apply_grammar_bitmask`."""
    num_masks = grid_dim(grid, 0)
    if num_masks == 0:
        return
    mapping = logits_indices_ptr[:num_masks].to(torch.int64)
    req, position = mapping // MASK_STRIDE, mapping % MASK_STRIDE
    start = cu_num_logits_ptr.to(torch.int64)[req]
    active = position < cu_num_logits_ptr.to(torch.int64)[req + 1] - start
    if not bool(active.any()):
        return
    packed = bitmask_ptr.view(-1)[: num_masks * bitmask_stride].view(num_masks, bitmask_stride)[active]
    allowed = ((packed.to(torch.int32)[:, :, None] >> _BITS.to(packed.device)) & 1).flatten(1)[:, :vocab_size]
    rows = logits_ptr.view(-1)
    targets = (start + position)[active]
    for target, keep in zip(targets.tolist(), allowed, strict=True):
        row = rows[target * logits_stride : target * logits_stride + vocab_size]
        row.masked_fill_(keep == 0, float("-inf"))


def apply_grammar_bitmask(grid: Grid, **arguments: Any) -> None:
    """Mask ``i`` (packed 32 tokens per int32, bit set = allowed) sets the disallowed tokens of logits row
    ``cu_num_logits[r] + p`` to -inf, where ``logits_indices[i] = r * MASK_STRIDE + p``; positions past the
    request's logits are skipped."""
    device = arguments["logits_ptr"].device
    dispatch_v2("structured_outputs", "apply_grammar_bitmask", apply_grammar_bitmask_torch, device)(
        grid, **arguments
    )


OVERRIDES: dict[str, Callable[..., Any]] = {
    f"{_VLLM}._apply_grammar_bitmask_kernel": apply_grammar_bitmask,
}
