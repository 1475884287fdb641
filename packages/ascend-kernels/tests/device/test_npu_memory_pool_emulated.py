"""The NPU memory pool's bookkeeping and CANN call sequence against an emulated ``libascendcl`` and ``torch_npu``.

The emulated runtime implements the pool's ACL calls over host memory the way CANN's virtual memory behaves:
``aclrtReserveMemAddress`` reserves an inaccessible address range (``mmap`` ``PROT_NONE``), a physical handle is
a memfd of its own, ``aclrtMapMem`` maps it at the reserved address (``MAP_FIXED``), ``aclrtUnmapMem`` makes the
range inaccessible again and ``aclrtFreePhysical`` closes the memfd: released memory really is gone, and a
remapped region reads back only what wake-up restores. Calls out of CANN's documented order (freeing a mapped
handle, mapping an unreserved address, a size other than the handle's) return an error code. The emulated
torch_npu calls the pool's malloc/free through the C function addresses handed to ``_npu_customAllocator``
(so through the real ctypes trampolines), as torch_npu's caching allocator does for each segment.
"""

from __future__ import annotations

import ctypes
import gc
import itertools
import mmap
import os
import sys
import types
from contextlib import contextmanager

import pytest
import torch

from vllm_ascend.core.sdk import DeviceOpError, MemoryPoolError
from vllm_ascend.kernels.device import npu_memory_pool as npm
from vllm_ascend.kernels.device.a5 import A5DeviceAdaptor
from vllm_ascend.kernels.device.npu import A2A3DeviceAdaptor

GRANULARITY = 16 * mmap.PAGESIZE  # CANN's is 2 MiB; smaller keeps the emulation light
ACL_ERROR_RT_PARAM_INVALID = 107000
PROT_NONE, MAP_FIXED, MAP_NORESERVE = 0, 0x10, 0x4000  # Linux (not in Python's mmap module)

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]


def _mmap(address: int | None, size: int, prot: int, flags: int, fd: int = -1) -> int:
    result = _libc.mmap(address, size, prot, flags, fd, 0)
    assert result not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
    return int(result)


def _value(arg) -> int:
    if isinstance(arg, ctypes.c_void_p):
        return int(arg.value or 0)
    return 0 if arg is None else int(arg)


class EmulatedAscendCL:
    """The pool's libascendcl functions over host memory (see the module docstring)."""

    _PROT_NONE_FLAGS = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_NORESERVE

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[int, ...]]] = []
        self.props: list[tuple[int, int, int, int, int, int]] = []
        self.fail: dict[str, int] = {}
        self.reserved: dict[int, int] = {}  # address -> size
        self.physical: dict[int, tuple[int, int]] = {}  # handle -> (memfd, size)
        self.mapped: dict[int, int] = {}  # address -> handle
        self._handles = itertools.count(0x1000, 8)

    def _enter(self, name: str, *args: int) -> int:
        self.calls.append((name, args))
        return self.fail.get(name, 0)

    def _prop(self, pointer) -> None:
        p = pointer.contents
        self.props.append(
            (p.handleType, p.allocationType, p.memAttr, p.location.id, p.location.type, p.reserve)
        )

    def aclrtGetDevice(self, device):
        if code := self._enter("aclrtGetDevice"):
            return code
        device.contents.value = 0
        return 0

    def aclrtMemGetAllocationGranularity(self, prop, option, granularity):
        if code := self._enter("aclrtMemGetAllocationGranularity", option):
            return code
        self._prop(prop)
        granularity.contents.value = GRANULARITY
        return 0

    def aclrtReserveMemAddress(self, address, size, alignment, expect, flags):
        if code := self._enter("aclrtReserveMemAddress", size, alignment, _value(expect), flags):
            return code
        if size == 0 or size % GRANULARITY:
            return ACL_ERROR_RT_PARAM_INVALID
        base = _mmap(None, size, PROT_NONE, self._PROT_NONE_FLAGS)
        self.reserved[base] = size
        address.contents.value = base
        return 0

    def aclrtMallocPhysical(self, handle, size, prop, flags):
        if code := self._enter("aclrtMallocPhysical", size, flags):
            return code
        self._prop(prop)
        fd = os.memfd_create("emulated-hbm")
        os.ftruncate(fd, size)
        key = next(self._handles)
        self.physical[key] = (fd, size)
        handle.contents.value = key
        return 0

    def aclrtMapMem(self, address, size, offset, handle, flags):
        address, handle = _value(address), _value(handle)
        if code := self._enter("aclrtMapMem", address, size, offset, handle, flags):
            return code
        if (
            self.reserved.get(address) != size
            or address in self.mapped
            or handle not in self.physical
            or self.physical[handle][1] != size
        ):
            return ACL_ERROR_RT_PARAM_INVALID
        fd = self.physical[handle][0]
        _mmap(address, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED | MAP_FIXED, fd)
        self.mapped[address] = handle
        return 0

    def aclrtUnmapMem(self, address):
        address = _value(address)
        if code := self._enter("aclrtUnmapMem", address):
            return code
        if address not in self.mapped:
            return ACL_ERROR_RT_PARAM_INVALID
        _mmap(address, self.reserved[address], PROT_NONE, self._PROT_NONE_FLAGS | MAP_FIXED)
        del self.mapped[address]
        return 0

    def aclrtFreePhysical(self, handle):
        handle = _value(handle)
        if code := self._enter("aclrtFreePhysical", handle):
            return code
        if handle not in self.physical or handle in self.mapped.values():
            return ACL_ERROR_RT_PARAM_INVALID
        os.close(self.physical.pop(handle)[0])
        return 0

    def aclrtReleaseMemAddress(self, address):
        address = _value(address)
        if code := self._enter("aclrtReleaseMemAddress", address):
            return code
        if address not in self.reserved or address in self.mapped:
            return ACL_ERROR_RT_PARAM_INVALID
        _libc.munmap(address, self.reserved.pop(address))
        return 0

    def names(self, since: int = 0) -> list[str]:
        return [name for name, _ in self.calls[since:]]


class EmulatedTorchNpu(types.ModuleType):
    """torch_npu's pluggable-allocator and external-storage API; ``segment`` / ``free_segment`` stand for the
    caching allocator asking the active pool's allocator for a segment and returning it."""

    def __init__(self) -> None:
        super().__init__("torch_npu")
        self.active: list[types.SimpleNamespace] = []
        owner = self

        class _C:
            @staticmethod
            def _npu_customAllocator(malloc_address: int, free_address: int):
                return types.SimpleNamespace(
                    malloc=npm.MALLOC_FN(malloc_address), free=npm.FREE_FN(free_address)
                )

            @staticmethod
            def _construct_storage_from_data_pointer(address: int, device: torch.device, nbytes: int):
                assert device == torch.device("cpu", 0)  # the emulated device 0's memory is host memory
                return torch._C._construct_storage_from_data_pointer(address, torch.device("cpu"), nbytes)

            @staticmethod
            def _construct_NPU_Tensor_From_Storage_And_Metadata(metadata: dict, storage):
                tensor = torch.empty(0, dtype=metadata["dtype"])
                return tensor.set_(storage, metadata["storage_offset"], metadata["size"], metadata["stride"])

        @contextmanager
        def use_mem_pool(pool):
            owner.active.append(pool)
            try:
                yield
            finally:
                owner.active.pop()

        self._C = _C
        memory = types.SimpleNamespace(MemPool=lambda allocator: types.SimpleNamespace(allocator=allocator))
        memory.use_mem_pool = use_mem_pool
        self.npu = types.SimpleNamespace(memory=memory)

    def segment(self, nbytes: int) -> torch.Tensor:
        allocator = self.active[-1].allocator
        address = allocator.malloc(nbytes, 0, None)
        if not address:
            raise RuntimeError("NPU out of memory (the allocator returned NULL)")
        storage = torch._C._construct_storage_from_data_pointer(address, torch.device("cpu"), nbytes)
        return torch.empty(0, dtype=torch.uint8).set_(storage, 0, (nbytes,), (1,))

    def free_segment(self, allocator, tensor: torch.Tensor) -> None:
        allocator.free(tensor.data_ptr(), tensor.numel(), 0, None)


@pytest.fixture
def emulated():
    acl, torch_npu = EmulatedAscendCL(), EmulatedTorchNpu()
    pool = npm.NPUMemoryPool(npm.AclRuntime(acl), torch_npu, device_type="cpu")
    yield pool, acl, torch_npu
    for address in list(acl.mapped):
        acl.aclrtUnmapMem(address)
    for handle in list(acl.physical):
        acl.aclrtFreePhysical(handle)
    for address in list(acl.reserved):
        acl.aclrtReleaseMemAddress(address)


def _pattern(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def test_physical_mem_prop_has_cann_layout():
    """acl_rt.h: three 4-byte enums, aclrtMemLocation {uint32_t id; enum type}, then uint64_t reserve."""
    assert ctypes.sizeof(npm.AclPhysicalMemProp) == 32
    assert npm.AclPhysicalMemProp.location.offset == 12
    assert npm.AclPhysicalMemProp.reserve.offset == 24


def test_allocations_are_tagged_regions_mapped_in_granules(emulated):
    pool, acl, torch_npu = emulated
    with pool.use_memory_pool("weights"):
        weights = torch_npu.segment(100_000)
    with pool.use_memory_pool("kv_cache"):
        kv = torch_npu.segment(3 * GRANULARITY)

    assert acl.names() == [
        "aclrtMemGetAllocationGranularity",  # the device is the one torch_npu's malloc names
        "aclrtReserveMemAddress",
        "aclrtMallocPhysical",
        "aclrtMapMem",
        "aclrtReserveMemAddress",  # granularity cached per device
        "aclrtMallocPhysical",
        "aclrtMapMem",
    ]
    by_address = {r.address: r for r in pool.regions()}
    assert by_address[weights.data_ptr()].tag == "weights"
    assert by_address[kv.data_ptr()].tag == "kv_cache"
    assert by_address[weights.data_ptr()].handle.size == -(-100_000 // GRANULARITY) * GRANULARITY
    assert by_address[kv.data_ptr()].handle.size == 3 * GRANULARITY
    assert (
        pool.allocated_bytes("weights") == 100_000 and pool.get_current_usage() == 100_000 + 3 * GRANULARITY
    )
    # pinned HBM huge pages on the allocating device (handleType, allocationType, memAttr, id, type, reserve)
    assert set(acl.props) == {(0, 0, npm.ACL_HBM_MEM_HUGE, 0, npm.ACL_MEM_LOCATION_TYPE_DEVICE, 0)}
    weights.copy_(_pattern(100_000, 0))  # the memory is mapped and writable at the returned address
    assert torch.equal(pool.region_tensor(by_address[weights.data_ptr()]), _pattern(100_000, 0))


def test_sleep_releases_every_region_and_wake_maps_the_same_addresses(emulated):
    pool, acl, torch_npu = emulated
    with pool.use_memory_pool("weights"):
        weights = torch_npu.segment(100_000)
    with pool.use_memory_pool("kv_cache"):
        kv = torch_npu.segment(50_000)
    weights.copy_(_pattern(100_000, 1))
    kv.fill_(7)
    regions = {r.tag: r for r in pool.regions()}
    handles = {tag: r.handle.physical for tag, r in regions.items()}

    start = len(acl.calls)
    assert pool.sleep(offload_tags=("weights",)) == 150_000
    assert acl.calls[start:] == [
        ("aclrtUnmapMem", (regions["weights"].address,)),
        ("aclrtFreePhysical", (handles["weights"],)),
        ("aclrtUnmapMem", (regions["kv_cache"].address,)),
        ("aclrtFreePhysical", (handles["kv_cache"],)),
    ]
    assert acl.mapped == {} and acl.physical == {}  # all device memory given back, addresses still reserved
    assert set(acl.reserved) == {weights.data_ptr(), kv.data_ptr()}
    assert pool.get_current_usage() == 0 and pool.is_asleep("weights")

    start = len(acl.calls)
    assert pool.wake_up(tags=["weights"]) == 100_000
    assert acl.names(start) == ["aclrtMallocPhysical", "aclrtMapMem"]
    mapped_at, size = acl.calls[start + 1][1][:2]
    assert mapped_at == regions["weights"].address == weights.data_ptr()
    assert size == regions["weights"].handle.size
    assert torch.equal(weights, _pattern(100_000, 1))  # the old tensor reads the restored contents
    assert pool.is_asleep("kv_cache") and not pool.is_asleep("weights")

    assert pool.wake_up() == 50_000
    assert acl.calls[-1][0] == "aclrtMapMem" and acl.calls[-1][1][0] == kv.data_ptr()
    assert torch.count_nonzero(kv) == 0  # not offloaded: comes back zeroed
    assert torch.equal(weights, _pattern(100_000, 1))
    assert pool.get_current_usage() == 150_000


def test_discard_drops_contents(emulated):
    pool, acl, torch_npu = emulated
    with pool.use_memory_pool("weights"):
        weights = torch_npu.segment(GRANULARITY)
    weights.fill_(3)
    assert pool.discard(["weights"]) == GRANULARITY
    assert acl.names()[-2:] == ["aclrtUnmapMem", "aclrtFreePhysical"]
    pool.wake_up(["weights"])
    assert weights.data_ptr() == pool.regions()[0].address and torch.count_nonzero(weights) == 0


def test_torch_npu_free_unmaps_frees_and_releases(emulated):
    pool, acl, torch_npu = emulated
    with pool.use_memory_pool("kv_cache"):
        awake = torch_npu.segment(GRANULARITY)
        asleep = torch_npu.segment(GRANULARITY)
    allocator = pool._allocator  # the one allocator every tag's MemPool routes to
    address = awake.data_ptr()
    start = len(acl.calls)
    torch_npu.free_segment(allocator, awake)
    assert acl.names(start) == ["aclrtUnmapMem", "aclrtFreePhysical", "aclrtReleaseMemAddress"]
    assert acl.calls[-1][1] == (address,) and address not in acl.reserved
    assert [r.address for r in pool.regions()] == [asleep.data_ptr()]

    pool.sleep()
    start = len(acl.calls)
    torch_npu.free_segment(allocator, asleep)  # already unmapped: only the address goes
    assert acl.names(start) == ["aclrtReleaseMemAddress"]
    assert pool.regions() == [] and acl.reserved == {}


def test_adopted_tensors_keep_ties_sleep_in_place_and_free_with_their_storage(emulated):
    pool, acl, _ = emulated
    weight = torch.nn.Parameter(torch.randn(64, 32))
    tied = torch.nn.Parameter(weight.data)  # shares the storage (tied embeddings)
    bias = torch.nn.Parameter(torch.randn(32))
    expected_weight, expected_bias = weight.detach().clone(), bias.detach().clone()
    moved = pool.adopt("weights", [weight, tied, bias])
    assert moved == 64 * 32 * 4 + 32 * 4
    (region,) = pool.regions(["weights"])
    assert region.address <= weight.data_ptr() < region.address + region.nbytes
    assert tied.data_ptr() == weight.data_ptr()
    assert torch.equal(weight, expected_weight) and torch.equal(bias, expected_bias)

    pool.sleep(offload_tags=["weights"])
    pool.wake_up()
    assert region.address <= weight.data_ptr() < region.address + region.nbytes
    assert torch.equal(tied, expected_weight) and torch.equal(bias, expected_bias)

    start = len(acl.calls)
    del weight, tied, bias
    gc.collect()
    assert acl.names(start) == ["aclrtUnmapMem", "aclrtFreePhysical", "aclrtReleaseMemAddress"]
    assert pool.regions() == [] and acl.reserved == {}


def test_runtime_error_codes_raise_naming_the_acl_function(emulated):
    pool, acl, torch_npu = emulated
    acl.fail["aclrtMapMem"] = 507899
    with pytest.raises(npm.AclError, match=r"aclrtMapMem failed with ACL error code 507899") as info:
        with pool.use_memory_pool("weights"):
            torch_npu.segment(GRANULARITY)
    assert (info.value.function, info.value.code) == ("aclrtMapMem", 507899)
    assert acl.names()[-2:] == ["aclrtFreePhysical", "aclrtReleaseMemAddress"]  # nothing left behind
    assert acl.reserved == {} and acl.physical == {} and pool.regions() == []

    del acl.fail["aclrtMapMem"]
    with pool.use_memory_pool("kv_cache"):
        torch_npu.segment(GRANULARITY)
    acl.fail["aclrtUnmapMem"] = ACL_ERROR_RT_PARAM_INVALID
    with pytest.raises(npm.AclError, match=r"aclrtUnmapMem failed with ACL error code 107000"):
        pool.sleep()
    del acl.fail["aclrtUnmapMem"]
    pool.sleep()
    acl.fail["aclrtMallocPhysical"] = 207001
    with pytest.raises(npm.AclError, match=r"aclrtMallocPhysical failed with ACL error code 207001"):
        pool.wake_up()
    assert pool.is_asleep("kv_cache")


def test_invalid_tag_and_expandable_segments_are_refused(emulated, monkeypatch):
    pool, _, _ = emulated
    with pytest.raises(ValueError, match="allowed: weights, kv_cache, graph"):
        with pool.use_memory_pool("weight"):
            pass
    monkeypatch.setenv(npm.ALLOC_CONF_ENV, "expandable_segments:True")
    with pytest.raises(MemoryPoolError, match=r"PYTORCH_NPU_ALLOC_CONF.*expandable"):
        with pool.use_memory_pool("weights"):
            pass


def test_missing_torch_npu_or_libascendcl_is_named(monkeypatch):
    npm.npu_memory_pool.cache_clear()
    monkeypatch.setitem(sys.modules, "torch_npu", None)
    with pytest.raises(DeviceOpError, match="needs torch_npu"):
        A2A3DeviceAdaptor().memory_pool()

    def absent(name: str):
        raise OSError(f"{name}: cannot open shared object file: No such file or directory")

    monkeypatch.setitem(sys.modules, "torch_npu", EmulatedTorchNpu())
    monkeypatch.setattr(npm.ctypes, "CDLL", absent)
    with pytest.raises(DeviceOpError, match=r"needs the CANN runtime libascendcl\.so .*set_env\.sh"):
        A2A3DeviceAdaptor().memory_pool()
    npm.npu_memory_pool.cache_clear()


def test_npu_families_share_the_adaptor_pool():
    assert A5DeviceAdaptor.memory_pool is A2A3DeviceAdaptor.memory_pool
    assert npm.CaMemAllocator is npm.NPUMemoryPool
