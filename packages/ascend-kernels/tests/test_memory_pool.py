"""The tagged memory pool contract (core) on the reference device's pool (private host mappings).

Sleep must give the memory back for real (the resident set shrinks), keep every address (tensors read the
restored contents where they were), restore what was offloaded and zero the rest.
"""

from __future__ import annotations

import gc
import mmap

import pytest
import torch

from vllm_ascend.core.sdk import MEMORY_TAGS
from vllm_ascend.kernels.device.memory_pool import HostMemoryPool, host_memory_pool
from vllm_ascend.kernels.device.reference import ReferenceDeviceAdaptor

MIB = 1 << 20


def _resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * mmap.PAGESIZE


@pytest.fixture
def pool():
    return HostMemoryPool()


def test_allocations_in_scope_are_tagged_regions(pool):
    with pool.use_memory_pool("weights"):
        weight = torch.ones(256, 256)
        small = torch.zeros(4)  # under a page: torch's allocator keeps it
    with pool.use_memory_pool("kv_cache"):
        kv = torch.empty(2, 1024, dtype=torch.bfloat16)
    assert torch.equal(weight, torch.ones(256, 256))
    assert pool.owns(weight) and pool.owns(kv) and not pool.owns(small)
    assert [r.tag for r in pool.regions() if r.address == weight.data_ptr()] == ["weights"]
    assert pool.allocated_bytes("weights") == 256 * 256 * 4 and pool.allocated_bytes("kv_cache") == 4096
    outside = torch.empty(1024, 1024)
    assert not pool.owns(outside)


def test_sleep_releases_memory_and_wake_restores_in_place(pool):
    with pool.use_memory_pool("weights"):
        weight = torch.empty(MIB // 4)  # 1 MiB
    with pool.use_memory_pool("kv_cache"):
        kv = torch.empty(64 * MIB, dtype=torch.uint8)
    weight.copy_(torch.arange(MIB // 4, dtype=torch.float32))
    kv.fill_(9)
    weight_ptr, kv_ptr = weight.data_ptr(), kv.data_ptr()

    before = _resident_bytes()
    assert pool.sleep(offload_tags=("weights",)) == MIB + 64 * MIB
    after = _resident_bytes()
    assert before - after >= 60 * MIB, (before, after)  # the KV pages went back to the OS
    assert pool.get_current_usage() == 0 and pool.is_asleep()

    assert pool.wake_up(["weights"]) == MIB
    assert weight.data_ptr() == weight_ptr
    assert torch.equal(weight, torch.arange(MIB // 4, dtype=torch.float32))
    assert pool.is_asleep("kv_cache") and not pool.is_asleep("weights")
    assert pool.wake_up() == 64 * MIB
    assert kv.data_ptr() == kv_ptr and torch.count_nonzero(kv) == 0  # not offloaded: zeroed


def test_discard_drops_contents(pool):
    with pool.use_memory_pool("weights"):
        weight = torch.ones(4096)
    assert pool.discard(["weights"]) == 4096 * 4
    pool.wake_up()
    assert torch.count_nonzero(weight) == 0


def test_adopt_keeps_tied_parameters_tied_and_values_equal(pool):
    embed = torch.nn.Embedding(64, 32)
    head = torch.nn.Linear(32, 64, bias=False)
    head.weight = embed.weight  # tied
    norm = torch.nn.Parameter(torch.randn(32))
    halves = torch.randn(2, 128)
    first, second = halves[0], halves[1]  # two views of one storage
    expected = [t.detach().clone() for t in (embed.weight, norm, first, second)]

    moved = pool.adopt("weights", [embed.weight, head.weight, norm, first, second])
    assert moved == 64 * 32 * 4 + 32 * 4 + 2 * 128 * 4  # each storage once, 64-byte aligned
    assert head.weight is embed.weight and pool.owns(embed.weight) and pool.owns(norm)
    assert first.untyped_storage().data_ptr() == second.untyped_storage().data_ptr()
    assert second.data_ptr() - first.data_ptr() == 128 * 4
    for tensor, value in zip((embed.weight, norm, first, second), expected, strict=True):
        assert torch.equal(tensor, value)
    assert pool.adopt("weights", [embed.weight, norm]) == 0  # already pool memory

    pool.sleep(offload_tags=["weights"])
    pool.wake_up()
    assert torch.equal(head.weight, expected[0]) and torch.equal(second, expected[3])


def test_regions_are_forgotten_when_their_tensors_die(pool):
    with pool.use_memory_pool("kv_cache"):
        kv = torch.empty(8192)
    view = kv[100:200]
    del kv
    gc.collect()
    assert len(pool.regions()) == 1  # the view keeps the storage (and the mapping) alive
    del view
    gc.collect()
    assert pool.regions() == []
    adopted = [torch.randn(1024)]
    pool.adopt("weights", adopted)
    assert len(pool.regions(["weights"])) == 1
    del adopted
    gc.collect()
    assert pool.regions() == []


@pytest.mark.parametrize(
    "call",
    [
        lambda p: p.use_memory_pool("weight").__enter__(),
        lambda p: p.sleep(offload_tags=["kv"]),
        lambda p: p.wake_up(tags=["weights", "cache"]),
        lambda p: p.discard(["all"]),
        lambda p: p.adopt("params", [torch.randn(4096)]),
    ],
)
def test_invalid_tags_are_refused_naming_the_allowed_ones(pool, call):
    with pytest.raises(ValueError, match="allowed: " + ", ".join(MEMORY_TAGS)):
        call(pool)
    assert pool.regions() == []


def test_reference_adaptor_returns_the_process_pool():
    assert ReferenceDeviceAdaptor().memory_pool() is host_memory_pool()
    assert isinstance(host_memory_pool(), HostMemoryPool)
