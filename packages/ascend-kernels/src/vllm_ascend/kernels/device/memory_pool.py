"""The reference device's tagged memory pool: host memory that sleep really gives back to the OS.

Each region is a private anonymous ``mmap``: its address is fixed for its life; ``madvise(MADV_DONTNEED)``
returns the physical pages (the process's resident set shrinks) and the next touch maps zero pages at the same
address — the host counterpart of unmapping an NPU region's physical handle and mapping a new one
(``npu_memory_pool.py``). torch has no pluggable allocator for its cpu device, so the allocations of a
``use_memory_pool`` scope are routed here by a dispatch mode over torch's factory operators (``empty``,
``zeros``, ...): the tensors vLLM allocates for the KV cache, and the weights the model loader allocates.
"""

from __future__ import annotations

import functools
import mmap
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from vllm_ascend.core.sdk import Region, TaggedMemoryPool, track_region_lifetime

_PAGE = mmap.PAGESIZE
#: Smaller allocations stay with torch's allocator (a region costs a page at least).
MIN_REGION_BYTES = _PAGE

_aten = torch.ops.aten
#: factory op -> where its result's fill value is: None (uninitialised), a constant, or ``("arg", index)``.
_FACTORIES: dict[Any, Any] = {
    _aten.empty.memory_format: None,
    _aten.empty_strided.default: None,
    _aten.zeros.default: 0,
    _aten.ones.default: 1,
    _aten.full.default: ("arg", 1),
    _aten.empty_like.default: None,
    _aten.zeros_like.default: 0,
    _aten.ones_like.default: 1,
    _aten.full_like.default: ("arg", 1),
    _aten.new_empty.default: None,
    _aten.new_zeros.default: 0,
    _aten.new_ones.default: 1,
    _aten.new_full.default: ("arg", 2),
}


def _target_device(args: tuple, kwargs: dict) -> torch.device:
    device = kwargs.get("device")
    if device is None and args and isinstance(args[0], torch.Tensor):
        return args[0].device  # *_like / new_*: the input's device
    return torch.device(device if device is not None else "cpu")


class _RouteAllocations(TorchDispatchMode):
    """Serve torch's factory ops on the host device from the pool: the op run on the meta device gives the
    result's sizes, strides and dtype; its storage is a region of the scope's tag."""

    def __init__(self, pool: HostMemoryPool, tag: str) -> None:
        super().__init__()
        self._pool, self._tag = pool, tag

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func not in _FACTORIES or kwargs.get("pin_memory") or _target_device(args, kwargs).type != "cpu":
            return func(*args, **kwargs)
        shape = func(*args, **{**kwargs, "device": "meta"})
        nbytes = shape.untyped_storage().nbytes()
        if nbytes < MIN_REGION_BYTES:
            return func(*args, **kwargs)
        storage = self._pool.allocate_tensor(self._tag, [nbytes], torch.uint8).untyped_storage()
        tensor = torch.empty(0, dtype=shape.dtype).set_(storage, 0, shape.shape, shape.stride())
        fill = _FACTORIES[func]
        if isinstance(fill, tuple):
            fill = args[fill[1]]
        if fill:
            tensor.fill_(fill)
        if kwargs.get("requires_grad"):
            tensor.requires_grad_(True)
        return tensor


class _Mapping:
    """A region's mapping: held strongly until tensors own it (their storage keeps it alive), weakly after."""

    def __init__(self, mapping: mmap.mmap) -> None:
        self._ref = weakref.ref(mapping)
        self._strong: mmap.mmap | None = mapping

    def get(self) -> mmap.mmap:
        mapping = self._ref()
        if mapping is None:
            raise RuntimeError("the pool region's mapping was freed")
        return mapping

    def hand_over(self) -> None:
        self._strong = None


class HostMemoryPool(TaggedMemoryPool):
    """:class:`TaggedMemoryPool` on private anonymous host mappings (see the module docstring)."""

    def _allocate(self, nbytes: int) -> tuple[int, Any]:
        size = max(_PAGE, -(-nbytes // _PAGE) * _PAGE)
        mapping = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        return torch.frombuffer(mapping, dtype=torch.uint8).data_ptr(), _Mapping(mapping)

    def _release(self, region: Region) -> None:
        region.handle.get().madvise(mmap.MADV_DONTNEED)

    def _reback(self, region: Region) -> None:
        """Nothing to map: the first touch of a released private page maps a zero page at its address."""

    def region_tensor(self, region: Region) -> torch.Tensor:
        return torch.frombuffer(region.handle.get(), dtype=torch.uint8, count=region.nbytes)

    def _owned_by_tensors(self, region: Region) -> None:
        mapping = region.handle.get()
        region.handle.hand_over()
        track_region_lifetime(self, mapping, region.address)

    @contextmanager
    def _allocation_scope(self, tag: str) -> Iterator[None]:
        with _RouteAllocations(self, tag):
            yield

    def allocate_tensor(self, tag: str, size: list[int], dtype: torch.dtype) -> torch.Tensor:
        """A new contiguous tensor in a region of ``tag``; the region is forgotten when the tensor's storage
        (which holds the mapping) is collected."""
        numel = 1
        for dim in size:
            numel *= dim
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        region = self.new_region(tag, nbytes)
        tensor = self.region_tensor(region).view(dtype).view(size)
        self._owned_by_tensors(region)
        return tensor


@functools.cache
def host_memory_pool() -> HostMemoryPool:
    """The process's pool (one per process, like the device's)."""
    return HostMemoryPool()
