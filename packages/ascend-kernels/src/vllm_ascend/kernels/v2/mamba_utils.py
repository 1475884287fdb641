"""Overrides of the kernels of vLLM's ``vllm/v1/worker/mamba_utils.py`` that Model Runner V2 launches: the
prefix-caching (``mamba_cache_mode="align"``) bookkeeping and state copies of hybrid models.

Before each step (``preprocess_mamba_align_fused``) every request's running-state block column advances to
the block its last scheduled token falls in, remembering the column it leaves; ``precopy_mamba_align_fused``
then copies each request's state (every layer's conv and temporal state) from the column it leaves into the
new one, so the layers read their initial state where they write the final one and the left block keeps the
state of a block-aligned prefix. After the step ``postprocess_mamba_fused`` saves the state at an aligned
position when speculative tokens were accepted past one (a no-op without speculative decoding).

States are reached as vLLM lays them out for its kernels (``MambaSpecDecodeGPUContext``): per state tensor a
base address, block stride, element size, inner size, conv width (0: temporal state), mamba group, and for
conv states stored dim-first a row count and row stride; per group a block-table address. The references
read that memory with ``tensor_at`` (host memory: the reference device).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from vllm_ascend.kernels.state_copy import copy_bytes_torch
from vllm_ascend.kernels.v2._launch import Grid, dispatch_v2, grid_dim, tensor_at

_VLLM = "vllm.v1.worker.mamba_utils"


def preprocess_mamba_align_fused_torch(
    grid: Grid,
    idx_mapping_ptr: torch.Tensor,
    state_idx_ptr: torch.Tensor,
    num_computed_tokens_ptr: torch.Tensor,
    query_start_loc_ptr: torch.Tensor,
    num_accepted_tokens_ptr: torch.Tensor,
    src_col_ptr: torch.Tensor,
    src_off_ptr: torch.Tensor,
    num_reqs: int,
    BLOCK_SIZE: int,
    MAMBA_BLOCK_SIZE: int,
) -> None:
    """Reference of :func:`preprocess_mamba_align_fused`."""
    if num_reqs == 0:
        return
    reqs = idx_mapping_ptr[:num_reqs].long()
    old = state_idx_ptr[reqs].clone()
    src_col_ptr[reqs] = old
    src_off_ptr[reqs] = (num_accepted_tokens_ptr[reqs] - 1).clamp_min(0).to(src_off_ptr.dtype)
    query = query_start_loc_ptr[1 : num_reqs + 1] - query_start_loc_ptr[:num_reqs]
    computed = num_computed_tokens_ptr[reqs].long() + query.long()
    new = (computed + MAMBA_BLOCK_SIZE - 1) // MAMBA_BLOCK_SIZE - 1
    state_idx_ptr[reqs] = new.to(state_idx_ptr.dtype)
    crossed = (old >= 0) & (old.long() != new)
    num_accepted_tokens_ptr[reqs[crossed]] = 1


def preprocess_mamba_align_fused(grid: Grid, **arguments: Any) -> None:
    """For each batch row ``b < num_reqs`` (request slot ``r = idx_mapping[b]``): remember the running
    block column ``state_idx[r]`` in ``src_col[r]`` and the accepted-token offset
    ``max(num_accepted[r] - 1, 0)`` in ``src_off[r]``; advance ``state_idx[r]`` to the column of the row's
    last scheduled token (``ceil((num_computed[r] + query_len) / MAMBA_BLOCK_SIZE) - 1``), resetting
    ``num_accepted[r]`` to 1 when it changes from a live column."""
    device = arguments["state_idx_ptr"].device
    dispatch_v2("mamba_utils", "preprocess_mamba_align_fused", preprocess_mamba_align_fused_torch, device)(
        grid, **arguments
    )


@dataclass(frozen=True)
class _States:
    """vLLM's per-state layout metadata and block-table pointers, read on the host (references only)."""

    base: list[int]
    block_stride: list[int]
    elem: list[int]
    inner: list[int]
    width: list[int]
    group: list[int]
    dim_rows: list[int]
    row_stride: list[int]
    tables: list[int]
    table_stride: int
    dim_first: bool
    device: torch.device

    @classmethod
    def read(
        cls,
        block_table_ptrs_ptr: torch.Tensor,
        block_table_stride_req: int,
        state_base_addrs_ptr: torch.Tensor,
        state_block_strides_ptr: torch.Tensor,
        state_elem_sizes_ptr: torch.Tensor,
        state_inner_sizes_ptr: torch.Tensor,
        state_conv_widths_ptr: torch.Tensor,
        state_group_indices_ptr: torch.Tensor,
        state_dim_row_count_ptr: torch.Tensor,
        state_dim_row_stride_ptr: torch.Tensor,
        dim_first: bool,
    ) -> _States:
        def ints(t: torch.Tensor) -> list[int]:
            return [int(x) for x in t.tolist()]

        return cls(
            base=ints(state_base_addrs_ptr),
            block_stride=ints(state_block_strides_ptr),
            elem=ints(state_elem_sizes_ptr),
            inner=ints(state_inner_sizes_ptr),
            width=ints(state_conv_widths_ptr),
            group=ints(state_group_indices_ptr),
            dim_rows=ints(state_dim_row_count_ptr),
            row_stride=ints(state_dim_row_stride_ptr),
            tables=ints(block_table_ptrs_ptr),
            table_stride=int(block_table_stride_req),
            dim_first=bool(dim_first),
            device=state_base_addrs_ptr.device,
        )

    def block(self, state: int, row: int, col: int) -> int:
        """Block id at column ``col`` of request slot ``row`` in ``state``'s group's block table."""
        address = self.tables[self.group[state]] + 4 * (row * self.table_stride + col)
        return int(tensor_at(address, torch.int32, 1, self.device)[0])

    def copy(self, row: int, src_col: int, dst_col: int, bias: int) -> None:
        """vLLM's ``_copy_mamba_state_block`` for every state: a conv state's window shifted left by ``bias``
        tokens from block column ``src_col`` into ``dst_col``; a temporal state from column ``src_col + bias``."""
        for state, (base, stride, elem, width) in enumerate(
            zip(self.base, self.block_stride, self.elem, self.width, strict=True)
        ):
            dst = base + self.block(state, row, dst_col) * stride
            if width == 0:
                src = base + self.block(state, row, src_col + bias) * stride
                copy_bytes_torch(src, dst, self.inner[state] * elem, self.device)
                continue
            src = base + self.block(state, row, src_col) * stride
            if self.dim_first:
                for r in range(self.dim_rows[state]):
                    offset = r * self.row_stride[state]
                    copy_bytes_torch(
                        src + offset + bias * elem, dst + offset, (width - bias) * elem, self.device
                    )
                continue
            token = self.inner[state] * elem
            copy_bytes_torch(src + bias * token, dst, (width - bias) * token, self.device)


def _request_slots(idx_mapping: torch.Tensor | None, num_reqs: int, has_mapping: bool) -> list[int]:
    """Request slot of each batch row (negative: skipped)."""
    if has_mapping:
        assert idx_mapping is not None
        return [int(r) for r in idx_mapping[:num_reqs].tolist()]
    return list(range(num_reqs))


def precopy_mamba_align_fused_torch(
    grid: Grid,
    mamba_state_idx_ptr: torch.Tensor,
    src_col_ptr: torch.Tensor,
    token_bias_ptr: torch.Tensor,
    block_table_ptrs_ptr: torch.Tensor,
    block_table_stride_req: int,
    state_base_addrs_ptr: torch.Tensor,
    state_block_strides_ptr: torch.Tensor,
    state_elem_sizes_ptr: torch.Tensor,
    state_inner_sizes_ptr: torch.Tensor,
    state_conv_widths_ptr: torch.Tensor,
    state_group_indices_ptr: torch.Tensor,
    state_dim_row_count_ptr: torch.Tensor,
    state_dim_row_stride_ptr: torch.Tensor,
    idx_mapping_ptr: torch.Tensor | None,
    num_reqs: int,
    COPY_BLOCK_SIZE: int,
    CONV_STATE_DIM_FIRST: bool,
    HAS_IDX_MAPPING: bool = True,
    TEMPORAL_TILES: int = 1,
) -> None:
    """Reference of :func:`precopy_mamba_align_fused`."""
    num_reqs = min(num_reqs, grid_dim(grid, 0))
    if num_reqs == 0 or grid_dim(grid, 1) == 0:
        return
    states = _States.read(
        block_table_ptrs_ptr, block_table_stride_req, state_base_addrs_ptr, state_block_strides_ptr,
        state_elem_sizes_ptr, state_inner_sizes_ptr, state_conv_widths_ptr, state_group_indices_ptr,
        state_dim_row_count_ptr, state_dim_row_stride_ptr, CONV_STATE_DIM_FIRST,
    )  # fmt: skip
    src_cols, dst_cols = src_col_ptr.tolist(), mamba_state_idx_ptr.tolist()
    biases = token_bias_ptr.tolist()
    for row in _request_slots(idx_mapping_ptr, num_reqs, HAS_IDX_MAPPING):
        if row >= 0 and src_cols[row] >= 0 and src_cols[row] != dst_cols[row]:
            states.copy(row, src_cols[row], dst_cols[row], biases[row])


def precopy_mamba_align_fused(grid: Grid, **arguments: Any) -> None:
    """For each batch row ``b < grid[0]`` (request slot ``r``, through ``idx_mapping`` when
    ``HAS_IDX_MAPPING``) whose ``src_col[r]`` is live and differs from ``mamba_state_idx[r]``: copy each of
    the ``grid[1]`` states from block column ``src_col[r]`` into ``mamba_state_idx[r]`` (conv windows
    shifted by ``token_bias[r]`` tokens, temporal states taken from column ``src_col[r] + token_bias[r]``)."""
    device = arguments["state_base_addrs_ptr"].device
    dispatch_v2("mamba_utils", "precopy_mamba_align_fused", precopy_mamba_align_fused_torch, device)(
        grid, **arguments
    )


def postprocess_mamba_fused_torch(
    grid: Grid,
    num_accepted_tokens_ptr: torch.Tensor,
    mamba_state_idx_ptr: torch.Tensor,
    num_scheduled_tokens_ptr: torch.Tensor | None,
    num_computed_tokens_ptr: torch.Tensor,
    num_draft_tokens_ptr: torch.Tensor | None,
    block_table_ptrs_ptr: torch.Tensor,
    block_table_stride_req: int,
    state_base_addrs_ptr: torch.Tensor,
    state_block_strides_ptr: torch.Tensor,
    state_elem_sizes_ptr: torch.Tensor,
    state_inner_sizes_ptr: torch.Tensor,
    state_conv_widths_ptr: torch.Tensor,
    state_group_indices_ptr: torch.Tensor,
    state_dim_row_count_ptr: torch.Tensor,
    state_dim_row_stride_ptr: torch.Tensor,
    num_accepted_tokens_out_ptr: torch.Tensor,
    idx_mapping_ptr: torch.Tensor | None,
    num_reqs: int,
    block_size: int,
    COPY_BLOCK_SIZE: int,
    CONV_STATE_DIM_FIRST: bool,
    HAS_IDX_MAPPING: bool = False,
    PRECOMPUTED_NEW_COMPUTED: bool = False,
    TEMPORAL_TILES: int = 1,
) -> None:
    """Reference of :func:`postprocess_mamba_fused`."""
    num_reqs = min(num_reqs, grid_dim(grid, 0))
    if num_reqs == 0 or grid_dim(grid, 1) == 0:
        return
    states = _States.read(
        block_table_ptrs_ptr, block_table_stride_req, state_base_addrs_ptr, state_block_strides_ptr,
        state_elem_sizes_ptr, state_inner_sizes_ptr, state_conv_widths_ptr, state_group_indices_ptr,
        state_dim_row_count_ptr, state_dim_row_stride_ptr, CONV_STATE_DIM_FIRST,
    )  # fmt: skip
    accepted, src_cols = num_accepted_tokens_ptr.tolist(), mamba_state_idx_ptr.tolist()
    computed = num_computed_tokens_ptr.tolist()
    for row in _request_slots(idx_mapping_ptr, num_reqs, HAS_IDX_MAPPING):
        if row < 0:
            continue
        if PRECOMPUTED_NEW_COMPUTED:
            new_computed = computed[row]
            running = new_computed - accepted[row] + 1
        else:
            assert num_scheduled_tokens_ptr is not None and num_draft_tokens_ptr is not None
            running = computed[row] + int(num_scheduled_tokens_ptr[row]) - int(num_draft_tokens_ptr[row])
            new_computed = running + accepted[row] - 1
        aligned = new_computed // block_size * block_size
        if aligned < running:
            continue
        bias, dst_col = aligned - running, aligned // block_size - 1
        if src_cols[row] == dst_col:
            num_accepted_tokens_out_ptr[row] = 1
        if src_cols[row] != dst_col or bias != 0:
            states.copy(row, src_cols[row], dst_col, bias)


def postprocess_mamba_fused(grid: Grid, **arguments: Any) -> None:
    """After a step, for each batch row (request slot ``r``) whose new computed-token count passes a
    ``block_size`` boundary beyond its running state (``num_computed + num_scheduled - num_draft``, or
    ``num_computed - num_accepted + 1`` when ``PRECOMPUTED_NEW_COMPUTED``): copy its states from column
    ``mamba_state_idx[r]`` (shifted by the accepted tokens past the running state) into the column ending
    at the boundary; ``num_accepted_out[r] = 1`` where that is the running column itself."""
    device = arguments["state_base_addrs_ptr"].device
    dispatch_v2("mamba_utils", "postprocess_mamba_fused", postprocess_mamba_fused_torch, device)(
        grid, **arguments
    )


OVERRIDES: dict[str, Callable[..., Any]] = {
    f"{_VLLM}.preprocess_mamba_align_fused_kernel": preprocess_mamba_align_fused,
    f"{_VLLM}.precopy_mamba_align_fused_kernel": precopy_mamba_align_fused,
    f"{_VLLM}.postprocess_mamba_fused_kernel": postprocess_mamba_fused,
}
