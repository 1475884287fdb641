"""Overrides of the kernels of vLLM's ``vllm/v1/worker/gpu/cp_utils.py``: decode-context-parallel local
sequence lengths."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from vllm_ascend.kernels.v2._launch import Grid, dispatch_v2

_VLLM = "vllm.v1.worker.gpu.cp_utils"


def dcp_local_seq_lens_torch(
    grid: Grid,
    out_ptr: torch.Tensor,
    seq_lens_ptr: torch.Tensor,
    dcp_size: int,
    dcp_rank: int,
    cp_interleave: int,
    num_reqs: int,
    max_num_reqs: int,
    BLOCK_SIZE: int,
) -> None:
    """Reference of :func:`dcp_local_seq_lens`."""
    seq_lens = seq_lens_ptr[:num_reqs].to(torch.int64)
    span = dcp_size * cp_interleave
    remainder = (seq_lens % span - dcp_rank * cp_interleave).clamp(min=0, max=cp_interleave)
    out_ptr[:num_reqs] = ((seq_lens // span) * cp_interleave + remainder).to(out_ptr.dtype)
    out_ptr[num_reqs:max_num_reqs] = 0


def dcp_local_seq_lens(grid: Grid, **arguments: Any) -> None:
    """This DCP rank's share of each sequence (tokens dealt round-robin in runs of ``cp_interleave``);
    0 for the padded requests up to ``max_num_reqs``."""
    device = arguments["out_ptr"].device
    dispatch_v2("cp_utils", "dcp_local_seq_lens", dcp_local_seq_lens_torch, device)(grid, **arguments)


OVERRIDES: dict[str, Callable[..., Any]] = {
    f"{_VLLM}._dcp_local_seq_lens_kernel": dcp_local_seq_lens,
}
