"""Ascend Triton kernels of :mod:`vllm_ascend.kernels.v2.cp_utils`.

One program per vector core walks UB-bounded tiles of the request rows grid-stride (vLLM: a grid of
``BLOCK_SIZE``-row blocks); rows past ``num_reqs`` (up to ``max_num_reqs``) are written 0.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_ascend.kernels import _geometry
from vllm_ascend.kernels._triton.common import IS_INTERPRETED, ub_cap
from vllm_ascend.kernels.v2._launch import Grid, cdiv

_TILE = 4 if IS_INTERPRETED else 1024


@triton.jit
def _dcp_local_seq_lens_kernel(
    out_ptr,
    seq_lens_ptr,
    dcp_size,
    dcp_rank,
    cp_interleave,
    num_reqs,
    max_num_reqs,
    TILE: tl.constexpr,
):
    # Tokens are dealt to the ranks round-robin in runs of ``cp_interleave``: a rank holds
    # ``cp_interleave`` per full round, plus its part of the last partial round.
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    span = dcp_size * cp_interleave
    for t in range(pid * TILE, max_num_reqs, programs * TILE):
        rows = t + tl.arange(0, TILE)
        real = rows < num_reqs
        seq_lens = tl.load(seq_lens_ptr + rows, mask=real, other=0)
        tail = tl.minimum(tl.maximum(seq_lens % span - dcp_rank * cp_interleave, 0), cp_interleave)
        local = (seq_lens // span) * cp_interleave + tail
        tl.store(out_ptr + rows, tl.where(real, local, 0), mask=rows < max_num_reqs)


def dcp_local_seq_lens(
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
    if max_num_reqs <= 0:
        return
    device = out_ptr.device
    tile = ub_cap(device, min(BLOCK_SIZE, _TILE), live_tiles=4)
    programs = _geometry.programs(device, cdiv(max_num_reqs, tile))
    _dcp_local_seq_lens_kernel[(programs,)](
        out_ptr, seq_lens_ptr, dcp_size, dcp_rank, cp_interleave, num_reqs, max_num_reqs, TILE=tile
    )
