"""How a Model Runner V2 kernel override is launched, and what it may read.

vLLM's V2 runner launches each kernel as ``kernel[grid](*args, **kwargs)``; the runner's dispatcher
registration (``vllm_ascend.runner.kernel_overrides``) hands every launch to the override here as
``override(grid, **arguments)``: ``grid`` the launch grid as a tuple (a grid callable already evaluated
on the arguments), the arguments bound by the names of vLLM's kernel parameters (its ``tl.constexpr``
defaults included). Many V2 kernels read the number of requests from the grid (``tl.num_programs``),
so the grid is part of the contract.

Each override dispatches per call on its tensors' device (``dispatch_v2``): the Ascend Triton kernel in
``vllm_ascend.kernels._triton.v2.<module>`` where Triton runs there, else the torch reference
``<name>_torch`` in the same module (on the cpu its host form ``<name>_host`` where the module has one).
All take exactly the override's arguments. The choice is remembered
(making it probes the platform: tens of microseconds per launch otherwise); the launches' host-side
arithmetic uses the plain-int ``cdiv`` / ``next_power_of_2`` here (Triton's cost microseconds a call in
recent releases).
"""

from __future__ import annotations

import ctypes
import functools
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from vllm_ascend.kernels._backend import KernelBackendError, dispatch

Grid = tuple[int, ...]


def grid_dim(grid: Sequence[int], axis: int) -> int:
    """Programs along ``axis`` of a launch grid (1 past its rank, as ``tl.num_programs``)."""
    return int(grid[axis]) if axis < len(grid) else 1


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` of host ints (``triton.cdiv`` costs microseconds per call in recent Triton)."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The least power of two ``>= n`` (0 for ``n <= 0``), as ``triton.next_power_of_2``, for host ints."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


def tensor_at(address: int, dtype: torch.dtype, numel: int, device: torch.device) -> torch.Tensor:
    """A flat ``numel``-element view of the memory at ``address`` (a pointer a V2 kernel receives as an
    integer, e.g. one row of a block-table pointer array). Host memory only: the references run on the
    reference device; on an NPU the Triton kernels load through the pointer themselves."""
    if device.type != "cpu":
        raise KernelBackendError(
            f"a raw pointer on device {device.type!r} cannot be read by the torch reference; "
            "the Ascend Triton kernel serves this launch there"
        )
    if address == 0 or numel <= 0:
        return torch.empty(0, dtype=dtype)
    return _host_view(int(address), dtype, numel)


@functools.lru_cache(maxsize=256)
def _host_view(address: int, dtype: torch.dtype, numel: int) -> torch.Tensor:
    """The view :func:`tensor_at` gives, made once per (address, dtype, size): it owns no memory, so a cached
    one reads exactly what a new one would (V2's block tables stay at their addresses, read every step)."""
    itemsize = torch.empty(0, dtype=dtype).element_size()
    buffer = (ctypes.c_char * (numel * itemsize)).from_address(address)
    return torch.frombuffer(buffer, dtype=dtype, count=numel)


def dispatch_v2(
    module: str, name: str, reference: Callable[..., Any], device: torch.device
) -> Callable[..., Any]:
    """Override ``name`` of module ``module`` for ``device``: the Ascend Triton kernel in ``_triton.v2``, or
    ``reference`` (remembered as :func:`~vllm_ascend.kernels._backend.dispatch` remembers its choices). On the
    cpu a torch reference ``<x>_torch`` with a host form ``<x>_host`` beside it in its module serves as that
    form (numpy views of the host tensors: an op costs a third of a torch op's, and a decode step launches
    dozens); the torch form stays the spec both are tested against."""
    chosen = dispatch(f"v2.{module}", name, reference, device)
    if chosen is reference and device.type == "cpu" and reference.__name__.endswith("_torch"):
        host = reference.__name__.removesuffix("_torch") + "_host"
        return getattr(sys.modules[reference.__module__], host, reference)
    return chosen


def lanes(counts: np.ndarray, cap: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(row, j)`` for every ``j < counts[row]`` in row order, counts clamped to ``[0, cap]``: a kernel's
    (request, lane) grid, flattened to the lanes that do work. One row (a single request) is built directly:
    a fifth of the general form's cost, which a decode step pays several times."""
    if counts.shape[0] == 1:
        count = max(int(counts[0]), 0) if cap is None else min(max(int(counts[0]), 0), cap)
        return np.zeros(count, np.intp), np.arange(count)
    counts = np.maximum(counts, 0) if cap is None else np.minimum(np.maximum(counts, 0), cap)
    row = np.repeat(np.arange(counts.shape[0]), counts)
    return row, np.arange(row.shape[0]) - np.repeat(np.cumsum(counts) - counts, counts)


def host_flat(tensor: torch.Tensor) -> np.ndarray:
    """``tensor.view(-1).numpy()`` without the torch op: a flat numpy view of a host tensor's memory, refused
    (``ValueError``) where its strides allow none, as torch's ``view`` refuses."""
    return tensor.numpy().reshape(-1, copy=False)
