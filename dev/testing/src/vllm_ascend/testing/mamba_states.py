"""Mamba state caches as vLLM describes them to its align-mode kernels (``vllm/v1/worker/mamba_utils.py``), for
the tests that run those kernels, ours and the references side by side: per group a conv state and a temporal
state, conv states stored token-first or dim-first, a conv row of 14 bytes (the byte path) and temporal pages
padded past their size."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

BLOCKS, MAX_REQS, COLS = 40, 6, 6

#: (mamba group, state cache, conv width or 0 for a temporal state)
State = tuple[int, torch.Tensor, int]


def states(seed: int, dim_first: bool) -> list[State]:
    """Two groups' conv and temporal states over :data:`BLOCKS` blocks (fp32, fp16, bf16, padded fp32)."""
    g = torch.Generator().manual_seed(seed)

    def conv(width: int, dim: int, dtype: torch.dtype) -> torch.Tensor:
        shape = (BLOCKS, dim, width) if dim_first else (BLOCKS, width, dim)
        return torch.randn(shape, generator=g).to(dtype)

    padded = torch.randn(BLOCKS, 20, generator=g).as_strided((BLOCKS, 5, 3), (20, 3, 1))
    return [
        (0, conv(4, 10, torch.float32), 4),
        (0, torch.randn(BLOCKS, 2, 4, 6, generator=g).to(torch.float16), 0),
        (1, conv(3, 7, torch.bfloat16), 3),
        (1, padded, 0),
    ]


def layout(states: list[State], tables: list[torch.Tensor], dim_first: bool) -> dict[str, Any]:
    """The metadata vLLM's ``MambaSpecDecodeGPUContext`` gives the kernels, for ``states`` and block ``tables``."""
    meta: dict[str, list[int]] = {
        k: [] for k in ("base", "stride", "elem", "inner", "width", "group", "rows", "rs")
    }
    for group, cache, width in states:
        meta["base"].append(cache.data_ptr())
        meta["stride"].append(cache.stride(0) * cache.element_size())
        meta["elem"].append(cache.element_size())
        meta["group"].append(group)
        meta["width"].append(width)
        if width and dim_first:
            meta["inner"].append(1)
            meta["rows"].append(cache.size(1))
            meta["rs"].append(cache.stride(1) * cache.element_size())
        else:
            meta["inner"].append(cache.stride(1) if width else cache[0].numel())
            meta["rows"].append(0)
            meta["rs"].append(0)
    i64, i32 = torch.int64, torch.int32
    return {
        "block_table_ptrs_ptr": torch.tensor([t.data_ptr() for t in tables], dtype=i64),
        "block_table_stride_req": tables[0].stride(0),
        "state_base_addrs_ptr": torch.tensor(meta["base"], dtype=i64),
        "state_block_strides_ptr": torch.tensor(meta["stride"], dtype=i64),
        "state_elem_sizes_ptr": torch.tensor(meta["elem"], dtype=i32),
        "state_inner_sizes_ptr": torch.tensor(meta["inner"], dtype=i64),
        "state_conv_widths_ptr": torch.tensor(meta["width"], dtype=i32),
        "state_group_indices_ptr": torch.tensor(meta["group"], dtype=i32),
        "state_dim_row_count_ptr": torch.tensor(meta["rows"], dtype=i32),
        "state_dim_row_stride_ptr": torch.tensor(meta["rs"], dtype=i64),
        "CONV_STATE_DIM_FIRST": dim_first,
        "COPY_BLOCK_SIZE": 1024,
        "TEMPORAL_TILES": 16,
    }


def tables() -> list[torch.Tensor]:
    """Per group, distinct blocks for every (request slot, column)."""
    g = torch.Generator().manual_seed(3)
    return [
        torch.randperm(BLOCKS, generator=g)[: MAX_REQS * COLS].view(MAX_REQS, COLS).int() for _ in range(2)
    ]


def run_pair(
    kernels: tuple[Callable[..., Any], Callable[..., Any]],
    grid: tuple[int, ...],
    dim_first: bool,
    **arguments: Any,
) -> list[tuple[list[torch.Tensor], dict[str, Any]]]:
    """Each of two kernels (e.g. a Triton kernel and its reference) on its own copy of the caches and of
    ``arguments``: ``(caches, arguments)`` after each, for the caller to compare."""
    block_tables = tables()
    results = []
    for run in kernels:
        cache_states = states(11, dim_first)
        args = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in arguments.items()}
        run(grid, **args, **layout(cache_states, block_tables, dim_first))
        results.append(([cache for _, cache, _ in cache_states], args))
    return results


def i32(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)
