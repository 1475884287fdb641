"""Overrides of the kernels of vLLM's ``vllm/v1/worker/gpu/buffer_utils.py``: staged row writes applied to
persistent device buffers (one buffer, or one per KV-cache group through a pointer array)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from vllm_ascend.kernels.v2._launch import Grid, dispatch_v2, grid_dim, tensor_at

_VLLM = "vllm.v1.worker.gpu.buffer_utils"


def apply_write_torch(
    grid: Grid,
    output_ptr: torch.Tensor,
    output_stride: Any,
    write_indices_ptr: torch.Tensor,
    write_starts_ptr: torch.Tensor,
    write_contents_ptr: torch.Tensor,
    write_cu_lens_ptr: torch.Tensor,
    write_group_ids_ptr: torch.Tensor | None,
    BLOCK_SIZE: int,
    MULTI_GROUP: bool,
) -> None:
    """Reference of :func:`apply_write`."""
    n = grid_dim(grid, 0)
    if n == 0:
        return
    rows = [int(v) for v in write_indices_ptr[:n].tolist()]
    starts = [int(v) for v in write_starts_ptr[:n].tolist()]
    ends = [int(v) for v in write_cu_lens_ptr[:n].tolist()]
    groups = [0] * n
    if MULTI_GROUP:
        if write_group_ids_ptr is None:
            raise ValueError("apply_write: MULTI_GROUP needs write_group_ids_ptr")
        groups = [int(v) for v in write_group_ids_ptr[:n].tolist()]
    device = write_contents_ptr.device
    for write in range(n):
        begin = ends[write - 1] if write else 0
        length = ends[write] - begin
        if length <= 0:
            continue
        if MULTI_GROUP:
            stride = int(output_stride[groups[write]])
            extent = rows[write] * stride + starts[write] + length
            target = tensor_at(int(output_ptr[groups[write]]), torch.int32, extent, device)
        else:
            stride, target = int(output_stride), output_ptr.view(-1)
        offset = rows[write] * stride + starts[write]
        target[offset : offset + length] = write_contents_ptr[begin : begin + length].to(target.dtype)


def apply_write(grid: Grid, **arguments: Any) -> None:
    """Write ``i`` copies ``contents[cu_lens[i-1]:cu_lens[i]]`` to row ``indices[i]`` of its buffer from
    column ``starts[i]`` (the buffer of group ``group_ids[i]`` when ``MULTI_GROUP``)."""
    device = arguments["write_contents_ptr"].device
    dispatch_v2("buffer_utils", "apply_write", apply_write_torch, device)(grid, **arguments)


OVERRIDES: dict[str, Callable[..., Any]] = {
    f"{_VLLM}._apply_write_kernel": apply_write,
}
