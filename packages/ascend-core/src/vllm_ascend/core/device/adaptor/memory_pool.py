"""The tagged device-memory pool behind sleep mode (upstream's ``CaMemAllocator``): the contract and its bookkeeping.

Memory allocated inside ``use_memory_pool(tag)`` (vLLM tags ``weights`` and ``kv_cache``; ``graph`` for captured
graphs' pools) lives in *regions* whose virtual addresses are fixed for the region's life. ``sleep`` releases the
physical memory behind every region (copying the contents of ``offload_tags`` to the host first); ``wake_up``
backs the same addresses again and copies the contents back. Tensors, their views and captured graphs keep
pointing at valid memory: nothing is re-allocated at a new address.

A family implements the four physical operations (:meth:`_allocate`, :meth:`_release`, :meth:`_reback`, the
allocation scope); everything else — tags, offload backups, states, usage — is here, once.
"""

from __future__ import annotations

import abc
import threading
import weakref
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

#: The tags vLLM's sleep mode uses, plus the captured graphs' pools.
MEMORY_TAGS = ("weights", "kv_cache", "graph")


class MemoryPoolError(RuntimeError):
    """A pool call in the wrong state (a tag not known, a region touched while released)."""


def _check_tags(tags: Iterable[str], what: str) -> tuple[str, ...]:
    tags = tuple(tags)
    unknown = [t for t in tags if t not in MEMORY_TAGS]
    if unknown:
        raise ValueError(f"{what} {unknown} are invalid; allowed: {', '.join(MEMORY_TAGS)}")
    return tags


@dataclass
class Region:
    """One block of pool memory at a fixed address: ``handle`` is the family's (an mmap, a physical handle)."""

    tag: str
    address: int
    nbytes: int
    handle: Any
    resident: bool = True
    backup: torch.Tensor | None = field(default=None, repr=False)


class TaggedMemoryPool(abc.ABC):
    """Regions by tag, released and restored in place. One pool per process (``adaptor.memory_pool()``)."""

    def __init__(self) -> None:
        self._regions: dict[int, Region] = {}
        self._lock = threading.Lock()

    # -- the family's physical operations --------------------------------------------------
    @abc.abstractmethod
    def _allocate(self, nbytes: int) -> tuple[int, Any]:
        """Reserve ``nbytes`` of device memory at a fixed address, backed; return (address, handle)."""

    @abc.abstractmethod
    def _release(self, region: Region) -> None:
        """Give the region's physical memory back to the device, keeping its address reserved."""

    @abc.abstractmethod
    def _reback(self, region: Region) -> None:
        """Back the region's (reserved) address with physical memory again."""

    @abc.abstractmethod
    def _allocation_scope(self, tag: str) -> Any:
        """A context manager under which the device's allocations of ``tag`` are made through :meth:`new_region`."""

    @abc.abstractmethod
    def region_tensor(self, region: Region) -> torch.Tensor:
        """The region's bytes as a ``uint8`` tensor on the device (for copies in and out)."""

    def graph_pool_handle(self) -> Any:
        """The handle a device graph capture takes as its memory pool so that the graph's memory is regions of
        tag ``graph`` (captured inside ``use_memory_pool("graph")``); None where graphs have no pool of their own
        (their allocations are made in the scope like any other)."""
        return None

    # -- regions -----------------------------------------------------------------------------
    def new_region(self, tag: str, nbytes: int) -> Region:
        """Allocate a region of ``tag`` (the allocation hook of :meth:`use_memory_pool` and :meth:`adopt`)."""
        _check_tags([tag], "memory pool tag")
        address, handle = self._allocate(nbytes)
        region = Region(tag=tag, address=address, nbytes=nbytes, handle=handle)
        with self._lock:
            self._regions[address] = region
        return region

    def free_region(self, address: int) -> None:
        """Forget a region whose memory its owner freed (the free hook)."""
        with self._lock:
            self._regions.pop(address, None)

    def regions(self, tags: Iterable[str] | None = None) -> list[Region]:
        with self._lock:
            regions = list(self._regions.values())
        return regions if tags is None else [r for r in regions if r.tag in tuple(tags)]

    @contextmanager
    def use_memory_pool(self, tag: str) -> Iterator[None]:
        """Allocations of the device made in this context are regions of ``tag``."""
        _check_tags([tag], "memory pool tag")
        with self._allocation_scope(tag):
            yield

    # -- sleep mode ------------------------------------------------------------------------------
    def sleep(self, offload_tags: Iterable[str] = ()) -> int:
        """Release every resident region; the contents of ``offload_tags`` regions are kept on the host.
        Returns the bytes released."""
        offload = _check_tags(offload_tags, "offload tags")
        released = 0
        for region in self.regions():
            if not region.resident:
                continue
            if region.tag in offload:
                region.backup = self.region_tensor(region).to("cpu", copy=True)
            self._release(region)
            region.resident = False
            released += region.nbytes
        return released

    def wake_up(self, tags: Iterable[str] | None = None) -> int:
        """Back the released regions of ``tags`` (default: all) at their addresses; restore offloaded
        contents, zero the rest. Returns the bytes restored."""
        wanted = MEMORY_TAGS if tags is None else _check_tags(tags, "wake_up tags")
        restored = 0
        for region in self.regions(wanted):
            if region.resident:
                continue
            self._reback(region)
            region.resident = True
            data = self.region_tensor(region)
            if region.backup is not None:
                data.copy_(region.backup)
                region.backup = None
            else:
                data.zero_()
            restored += region.nbytes
        return restored

    def discard(self, tags: Iterable[str]) -> int:
        """Release the regions of ``tags`` without keeping their contents (they come back zeroed)."""
        wanted = _check_tags(tags, "discard tags")
        released = 0
        for region in self.regions(wanted):
            if region.resident:
                self._release(region)
                region.resident = False
                released += region.nbytes
            region.backup = None
        return released

    def get_current_usage(self, tag: str | None = None) -> int:
        """Bytes of resident regions (of ``tag``, or all)."""
        return sum(r.nbytes for r in self.regions(None if tag is None else [tag]) if r.resident)

    def allocated_bytes(self, tag: str | None = None) -> int:
        """Bytes of all regions (of ``tag``, or all), resident or released."""
        return sum(r.nbytes for r in self.regions(None if tag is None else [tag]))

    def offloaded_bytes(self) -> int:
        """Bytes of region contents kept on the host while asleep (level 1's weights)."""
        return sum(r.backup.numel() for r in self.regions() if r.backup is not None)

    def is_asleep(self, tag: str | None = None) -> bool:
        return any(not r.resident for r in self.regions(None if tag is None else [tag]))

    # -- tensors made outside the pool ----------------------------------------------------------
    def owns(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor``'s storage lies in a region."""
        start = tensor.untyped_storage().data_ptr()
        return any(r.address <= start < r.address + r.nbytes for r in self.regions())

    def adopt(self, tag: str, tensors: Iterable[torch.Tensor], alignment: int = 64) -> int:
        """Move the storages of ``tensors`` that are not pool memory into one new region of ``tag``, each
        tensor re-pointed (``set_``) at the same offset, shape and strides; tensors sharing a storage keep
        sharing it. For tensors built by operations rather than allocations in the pool's scope (a model's
        parameters after ``process_weights_after_loading``). Call it before anything records their
        addresses (graphs). Returns the bytes moved."""
        groups: dict[int, list[torch.Tensor]] = {}
        storages: dict[int, torch.UntypedStorage] = {}
        for tensor in tensors:
            storage = tensor.untyped_storage()
            if storage.nbytes() == 0 or self.owns(tensor):
                continue
            groups.setdefault(storage.data_ptr(), []).append(tensor)
            storages[storage.data_ptr()] = storage
        if not groups:
            return 0
        offsets: dict[int, int] = {}
        total = 0
        for key, storage in storages.items():
            offsets[key] = total
            total += -(-storage.nbytes() // alignment) * alignment
        region = self.new_region(tag, total)
        data = self.region_tensor(region)
        for key, storage in storages.items():
            start, size = offsets[key], storage.nbytes()
            data[start : start + size].copy_(
                torch.tensor([], dtype=torch.uint8, device=data.device).set_(storage)
            )
            for tensor in groups[key]:
                moved = data[start : start + size].view(tensor.dtype)
                with torch.no_grad():
                    tensor.set_(moved.untyped_storage(), moved.storage_offset() + tensor.storage_offset(),
                                tensor.shape, tensor.stride())  # fmt: skip
        self._owned_by_tensors(region)
        return total

    @abc.abstractmethod
    def _owned_by_tensors(self, region: Region) -> None:
        """Tensors now hold the region's memory: from here the region lives as long as they do (the pool stops
        holding it and forgets it when they are collected)."""


def track_region_lifetime(pool: TaggedMemoryPool, owner: Any, address: int) -> None:
    """Forget the region at ``address`` when ``owner`` (the object keeping its memory alive) is collected."""
    weakref.finalize(owner, pool.free_region, address)
