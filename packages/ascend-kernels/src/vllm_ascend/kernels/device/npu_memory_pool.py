"""The NPU family's tagged memory pool (upstream's ``CaMemAllocator``): CANN virtual memory under torch_npu's
pluggable allocator.

Every block torch_npu's caching allocator asks for inside ``use_memory_pool(tag)`` is one region: a reserved
virtual address range backed by one physical allocation. ``sleep`` unmaps and frees the physical memory and
keeps the address reserved; ``wake_up`` allocates new physical memory and maps it at the same address, so
tensors, their views and captured NPU graphs stay valid (the host counterpart: ``memory_pool.py``).

What it needs of torch_npu (``_C`` names are private; checked against torch_npu's ``npu/memory.py``, whose
``NPUPluggableAllocator`` hands ``_npu_customAllocator`` the two function addresses it dlsym'd; not run on an
NPU here):

- ``torch_npu._C._npu_customAllocator(malloc_address, free_address)``: an allocator calling
  ``void* malloc(ssize_t size, int device, aclrtStream stream)`` and
  ``void free(void* ptr, ssize_t size, int device, aclrtStream stream)`` (ctypes callbacks here, so no C
  extension is built);
- ``torch_npu.npu.memory.MemPool(allocator)`` and ``torch_npu.npu.memory.use_mem_pool(pool)``: the caching
  allocator's segments of the scope come from that allocator;
- ``torch_npu._C._construct_storage_from_data_pointer(address, device, nbytes)`` and
  ``torch_npu._C._construct_NPU_Tensor_From_Storage_And_Metadata(metadata, storage)``: a non-owning ``uint8``
  tensor over a region (what torch_npu's graph trees rebuild outputs with), for the sleep / wake copies and
  :meth:`~TaggedMemoryPool.adopt`.

What it needs of the CANN runtime (``libascendcl.so``; signatures from CANN's ``acl_rt.h`` / API reference,
every call returns ``aclError``, 0 = success):

- ``aclrtGetDevice(int32_t *deviceId)``
- ``aclrtMemGetAllocationGranularity(aclrtPhysicalMemProp *prop, aclrtMemGranularityOptions option,
  size_t *granularity)`` with ``ACL_RT_MEM_ALLOC_GRANULARITY_MINIMUM`` (0)
- ``aclrtReserveMemAddress(void **virPtr, size_t size, size_t alignment, void *expectPtr, uint64_t flags)``
  with alignment 0, expectPtr NULL, flags 0
- ``aclrtMallocPhysical(aclrtDrvMemHandle *handle, size_t size, const aclrtPhysicalMemProp *prop,
  uint64_t flags)`` (``aclrtDrvMemHandle`` is ``void*``; flags 0)
- ``aclrtMapMem(void *virPtr, size_t size, size_t offset, aclrtDrvMemHandle handle, uint64_t flags)`` (offset 0,
  flags 0; size = the physical allocation's)
- ``aclrtUnmapMem(void *virPtr)``, ``aclrtFreePhysical(aclrtDrvMemHandle handle)``,
  ``aclrtReleaseMemAddress(void *virPtr)``
- ``aclrtPhysicalMemProp {aclrtMemHandleType handleType; aclrtMemAllocationType allocationType;
  aclrtMemAttr memAttr; aclrtMemLocation {uint32_t id; aclrtMemLocationType type} location; uint64_t reserve}``
  filled with ``ACL_MEM_HANDLE_TYPE_NONE`` (0), ``ACL_MEM_ALLOCATION_TYPE_PINNED`` (0), ``ACL_HBM_MEM_HUGE``
  (4: 2 MiB pages, upstream's choice), ``{device, ACL_MEM_LOCATION_TYPE_DEVICE (1)}``, 0.

Uncertain: CANN's reference lists these calls for Atlas A2/A3 and "Atlas inference products" (310P), but
whether ``ACL_HBM_MEM_HUGE`` is accepted on 310P's memory is unverified; older CANN documents ``flags`` of
``aclrtReserveMemAddress`` as 0 normal / 1 huge pages (newer: reserved, 0), upstream passes 0. The calls run on
the calling thread's current ACL context (torch_npu's device thread, or the worker after ``set_device``).
torch_npu's expandable segments are refused with this pool (``PYTORCH_NPU_ALLOC_CONF``), as upstream does.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch

from vllm_ascend.core.sdk import DeviceOpError, MemoryPoolError, Region, TaggedMemoryPool

logger = logging.getLogger(__name__)

LIBRARY = "libascendcl.so"
ACL_MEM_HANDLE_TYPE_NONE = 0
ACL_MEM_ALLOCATION_TYPE_PINNED = 0
ACL_HBM_MEM_HUGE = 4
ACL_MEM_LOCATION_TYPE_DEVICE = 1
ACL_RT_MEM_ALLOC_GRANULARITY_MINIMUM = 0
#: torch_npu's allocator setting that cannot be combined with a pool of pluggable allocations.
ALLOC_CONF_ENV = "PYTORCH_NPU_ALLOC_CONF"


class AclError(RuntimeError):
    """A CANN runtime call returned a non-zero ``aclError``."""

    def __init__(self, function: str, code: int) -> None:
        super().__init__(f"{function} failed with ACL error code {code}")
        self.function, self.code = function, code


class AclMemLocation(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint32), ("type", ctypes.c_int)]


class AclPhysicalMemProp(ctypes.Structure):
    _fields_ = [
        ("handleType", ctypes.c_int),
        ("allocationType", ctypes.c_int),
        ("memAttr", ctypes.c_int),
        ("location", AclMemLocation),
        ("reserve", ctypes.c_uint64),
    ]


def device_memory_prop(device: int) -> AclPhysicalMemProp:
    """The physical-memory properties of every region: pinned HBM in 2 MiB pages on ``device``."""
    return AclPhysicalMemProp(
        handleType=ACL_MEM_HANDLE_TYPE_NONE,
        allocationType=ACL_MEM_ALLOCATION_TYPE_PINNED,
        memAttr=ACL_HBM_MEM_HUGE,
        location=AclMemLocation(id=device, type=ACL_MEM_LOCATION_TYPE_DEVICE),
        reserve=0,
    )


_c_void_p_p = ctypes.POINTER(ctypes.c_void_p)
#: name -> argument types of the libascendcl functions the pool calls (all return ``aclError``, an int).
ACL_SIGNATURES: dict[str, list[Any]] = {
    "aclrtGetDevice": [ctypes.POINTER(ctypes.c_int32)],
    "aclrtMemGetAllocationGranularity": [
        ctypes.POINTER(AclPhysicalMemProp),
        ctypes.c_int,
        ctypes.POINTER(ctypes.c_size_t),
    ],
    "aclrtReserveMemAddress": [
        _c_void_p_p,
        ctypes.c_size_t,
        ctypes.c_size_t,
        ctypes.c_void_p,
        ctypes.c_uint64,
    ],
    "aclrtMallocPhysical": [
        _c_void_p_p,
        ctypes.c_size_t,
        ctypes.POINTER(AclPhysicalMemProp),
        ctypes.c_uint64,
    ],
    "aclrtMapMem": [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_uint64],
    "aclrtUnmapMem": [ctypes.c_void_p],
    "aclrtFreePhysical": [ctypes.c_void_p],
    "aclrtReleaseMemAddress": [ctypes.c_void_p],
}


class AclRuntime:
    """The CANN virtual-memory calls the pool makes, over ``lib`` (``libascendcl.so`` loaded by :meth:`load`,
    or an emulation with the same functions); a non-zero return raises :class:`AclError`."""

    def __init__(self, lib: Any) -> None:
        self._lib = lib
        self._granularity: dict[int, int] = {}

    @classmethod
    def load(cls) -> AclRuntime:
        try:
            lib = ctypes.CDLL(LIBRARY)
        except OSError as exc:
            raise DeviceOpError(
                f"the NPU memory pool needs the CANN runtime {LIBRARY} ({exc}); source CANN's set_env.sh "
                "(LD_LIBRARY_PATH) on an Ascend host, or set VLLM_ASCEND_DEVICE=reference to run on the CPU"
            ) from exc
        for name, argtypes in ACL_SIGNATURES.items():
            function = getattr(lib, name)
            function.argtypes, function.restype = argtypes, ctypes.c_int
        return cls(lib)

    def _call(self, name: str, *args: Any) -> None:
        code = int(getattr(self._lib, name)(*args))
        if code != 0:
            raise AclError(name, code)

    def current_device(self) -> int:
        device = ctypes.c_int32(-1)
        self._call("aclrtGetDevice", ctypes.pointer(device))
        return int(device.value)

    def granularity(self, device: int) -> int:
        """The minimum allocation granularity of the pool's memory on ``device`` (cached)."""
        if device not in self._granularity:
            size = ctypes.c_size_t(0)
            prop = device_memory_prop(device)
            self._call(
                "aclrtMemGetAllocationGranularity",
                ctypes.pointer(prop),
                ACL_RT_MEM_ALLOC_GRANULARITY_MINIMUM,
                ctypes.pointer(size),
            )
            self._granularity[device] = int(size.value)
        return self._granularity[device]

    def reserve(self, size: int) -> int:
        address = ctypes.c_void_p(None)
        self._call("aclrtReserveMemAddress", ctypes.pointer(address), size, 0, None, 0)
        return int(address.value or 0)

    def malloc_physical(self, size: int, device: int) -> int:
        handle = ctypes.c_void_p(None)
        prop = device_memory_prop(device)
        self._call("aclrtMallocPhysical", ctypes.pointer(handle), size, ctypes.pointer(prop), 0)
        return int(handle.value or 0)

    def map(self, address: int, size: int, handle: int) -> None:
        self._call("aclrtMapMem", ctypes.c_void_p(address), size, 0, ctypes.c_void_p(handle), 0)

    def unmap(self, address: int) -> None:
        self._call("aclrtUnmapMem", ctypes.c_void_p(address))

    def free_physical(self, handle: int) -> None:
        self._call("aclrtFreePhysical", ctypes.c_void_p(handle))

    def release(self, address: int) -> None:
        self._call("aclrtReleaseMemAddress", ctypes.c_void_p(address))


#: torch_npu's pluggable allocator functions: ``void* malloc(ssize_t, int, aclrtStream)`` and
#: ``void free(void*, ssize_t, int, aclrtStream)``.
MALLOC_FN = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p)
FREE_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p)


@dataclass
class NPUMapping:
    """A region's device state: its device, mapped (granularity-rounded) size and physical handle (None while
    released); ``view`` is the region's tensor until tensors own the region (:meth:`NPUMemoryPool.adopt`)."""

    device: int
    size: int
    physical: int | None
    view: torch.Tensor | None = None


class NPUMemoryPool(TaggedMemoryPool):
    """:class:`TaggedMemoryPool` on CANN virtual memory (see the module docstring). ``runtime`` and
    ``torch_npu`` are injectable (an emulated runtime in the tests); ``device_type`` names the device of the
    region tensors."""

    def __init__(self, runtime: AclRuntime, torch_npu: ModuleType, device_type: str = "npu") -> None:
        super().__init__()
        self._runtime, self._torch_npu, self._device_type = runtime, torch_npu, device_type
        self._tag: str | None = None
        self._callback_device: int | None = None
        self._callback_error: BaseException | None = None
        # ctypes callbacks must outlive every allocation torch_npu makes with them.
        self._malloc_fn = MALLOC_FN(self._malloc)
        self._free_fn = FREE_FN(self._free)
        self._allocator: Any = None
        self._mem_pools: dict[str, Any] = {}

    # -- physical operations --------------------------------------------------------------------
    def _allocate(self, nbytes: int) -> tuple[int, Any]:
        """Reserve a granularity-rounded address range, allocate physical memory and map it there."""
        runtime = self._runtime
        device = self._callback_device if self._callback_device is not None else runtime.current_device()
        granularity = runtime.granularity(device)
        size = max(granularity, -(-nbytes // granularity) * granularity)
        address = runtime.reserve(size)
        try:
            physical = runtime.malloc_physical(size, device)
            try:
                runtime.map(address, size, physical)
            except BaseException:
                runtime.free_physical(physical)
                raise
        except BaseException:
            runtime.release(address)
            raise
        return address, NPUMapping(device=device, size=size, physical=physical)

    def _release(self, region: Region) -> None:
        """Unmap and free the physical memory; the address stays reserved."""
        mapping: NPUMapping = region.handle
        self._runtime.unmap(region.address)
        if mapping.physical is not None:
            self._runtime.free_physical(mapping.physical)
            mapping.physical = None

    def _reback(self, region: Region) -> None:
        """New physical memory mapped at the region's reserved address."""
        mapping: NPUMapping = region.handle
        physical = self._runtime.malloc_physical(mapping.size, mapping.device)
        try:
            self._runtime.map(region.address, mapping.size, physical)
        except BaseException:
            self._runtime.free_physical(physical)
            raise
        mapping.physical = physical

    def region_tensor(self, region: Region) -> torch.Tensor:
        """A non-owning ``uint8`` tensor over the region (torch_npu's external-storage constructors)."""
        mapping: NPUMapping = region.handle
        if mapping.view is None:
            device = torch.device(self._device_type, mapping.device)
            native = self._torch_npu._C
            storage = native._construct_storage_from_data_pointer(region.address, device, region.nbytes)
            metadata = {
                "data_ptr": region.address,
                "device": device,
                "nbytes": region.nbytes,
                "dtype": torch.uint8,
                "size": (region.nbytes,),
                "stride": (1,),
                "storage_offset": 0,
            }
            mapping.view = native._construct_NPU_Tensor_From_Storage_And_Metadata(metadata, storage)
        return mapping.view

    def _owned_by_tensors(self, region: Region) -> None:
        """An adopted region is freed with its storage (kept alive by the tensors re-pointed at it)."""
        mapping: NPUMapping = region.handle
        storage = self.region_tensor(region).untyped_storage()
        mapping.view = None
        weakref.finalize(storage, self._free_memory, region.address)

    # -- torch_npu's pluggable allocator --------------------------------------------------------
    @contextmanager
    def _allocation_scope(self, tag: str) -> Iterator[None]:
        conf = os.environ.get(ALLOC_CONF_ENV, "")
        if "expandable_segments:true" in conf.replace(" ", "").lower():
            raise MemoryPoolError(
                f"{ALLOC_CONF_ENV}={conf!r}: expandable segments cannot be used with the NPU memory pool "
                "(sleep mode); remove expandable_segments:True"
            )
        memory = self._torch_npu.npu.memory
        pool = self._mem_pool(tag)
        previous, self._tag, self._callback_error = self._tag, tag, None
        try:
            with memory.use_mem_pool(pool):
                yield
        except Exception as exc:
            error, self._callback_error = self._callback_error, None
            if error is not None and error is not exc:
                raise error from exc
            raise
        finally:
            self._tag = previous

    def _mem_pool(self, tag: str) -> Any:
        """torch_npu's ``MemPool`` of ``tag`` on the pluggable allocator (both made on first use)."""
        if self._allocator is None:
            self._allocator = self._torch_npu._C._npu_customAllocator(
                _address(self._malloc_fn), _address(self._free_fn)
            )
        pool = self._mem_pools.get(tag)
        if pool is None:
            pool = self._mem_pools[tag] = self._torch_npu.npu.memory.MemPool(self._allocator)
        return pool

    def graph_pool_handle(self) -> Any:
        """The ``graph`` MemPool's id: ``torch.npu.graph(pool=...)`` then allocates the capture's memory through
        the pluggable allocator, as regions of tag ``graph``."""
        return self._mem_pool("graph").id

    def _malloc(self, size: int, device: int, stream: int | None) -> int | None:
        """torch_npu's malloc: a new region of the scope's tag (None, i.e. NULL, on failure: torch_npu then
        raises, and the scope re-raises the cause)."""
        try:
            if self._tag is None:
                raise MemoryPoolError("the NPU memory pool's allocator was called outside use_memory_pool")
            self._callback_device = device
            try:
                return self.new_region(self._tag, size).address
            finally:
                self._callback_device = None
        except BaseException as exc:  # nothing may propagate into torch_npu's C++ caller
            self._callback_error = exc
            logger.error("NPU memory pool: allocating %d bytes failed: %s", size, exc)
            return None

    def _free(self, address: int | None, size: int, device: int, stream: int | None) -> None:
        """torch_npu's free: unmap, free and release the region's memory."""
        try:
            self._free_memory(int(address or 0))
        except BaseException as exc:
            logger.error("NPU memory pool: freeing the region at %#x failed: %s", address or 0, exc)

    def _free_memory(self, address: int) -> None:
        with self._lock:
            region = self._regions.get(address)
        if region is None:
            return
        mapping: NPUMapping = region.handle
        if mapping.physical is not None:
            self._release(region)
        self._runtime.release(address)
        self.free_region(address)


def _address(function: Any) -> int:
    """The C address of a ctypes callback (what torch_npu's allocator calls)."""
    return int(ctypes.cast(function, ctypes.c_void_p).value or 0)


#: upstream vllm-ascend's name for this allocator.
CaMemAllocator = NPUMemoryPool


@functools.cache
def npu_memory_pool(torch_npu: ModuleType) -> NPUMemoryPool:
    """The process's pool on ``torch_npu`` (one per process: torch_npu holds its callbacks). Raises naming
    libascendcl.so where it is missing."""
    return NPUMemoryPool(AclRuntime.load(), torch_npu)
