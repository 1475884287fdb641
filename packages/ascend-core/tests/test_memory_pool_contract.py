"""The tagged memory pool's bookkeeping (core's contract), on a family whose "physical memory" is a byte tensor
kept at a fixed address and whose release forgets the contents: what every family inherits."""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch

from vllm_ascend.core.device.adaptor.memory_pool import MEMORY_TAGS, Region, TaggedMemoryPool


class _BytesPool(TaggedMemoryPool):
    """Regions are byte tensors (addresses fixed); a release scribbles over them, as freed memory would."""

    def __init__(self) -> None:
        super().__init__()
        self.released: list[int] = []
        self.backed: list[int] = []

    def _allocate(self, nbytes: int):
        data = torch.zeros(nbytes, dtype=torch.uint8)
        return data.data_ptr(), data

    def _release(self, region: Region) -> None:
        region.handle.fill_(0xAB)
        self.released.append(region.address)

    def _reback(self, region: Region) -> None:
        self.backed.append(region.address)

    def region_tensor(self, region: Region) -> torch.Tensor:
        return region.handle

    def _owned_by_tensors(self, region: Region) -> None:
        pass

    @contextmanager
    def _allocation_scope(self, tag: str):
        yield


def _tensor(pool: _BytesPool, tag: str, value: float) -> torch.Tensor:
    region = pool.new_region(tag, 64)
    tensor = pool.region_tensor(region).view(torch.float32)
    tensor.fill_(value)
    return tensor


def test_sleep_keeps_offloaded_tags_and_wake_up_restores_them_in_place():
    pool = _BytesPool()
    weights, kv, graph = (
        _tensor(pool, "weights", 1.5),
        _tensor(pool, "kv_cache", 2.5),
        _tensor(pool, "graph", 3.5),
    )
    addresses = [t.data_ptr() for t in (weights, kv, graph)]
    assert pool.get_current_usage() == pool.allocated_bytes() == 192
    assert pool.sleep(offload_tags=("weights",)) == 192
    assert pool.get_current_usage() == 0 and pool.allocated_bytes() == 192 and pool.is_asleep()
    assert pool.offloaded_bytes() == 64
    assert pool.wake_up(["weights"]) == 64
    assert torch.all(weights == 1.5) and pool.is_asleep("kv_cache") and not pool.is_asleep("weights")
    assert pool.wake_up() == 128
    assert torch.all(kv == 0) and torch.all(graph == 0)  # not offloaded: back, zeroed
    assert [t.data_ptr() for t in (weights, kv, graph)] == addresses
    assert sorted(pool.backed) == sorted(pool.released) == sorted(addresses)
    assert pool.offloaded_bytes() == 0


def test_discard_and_sleeping_twice_release_each_region_once():
    pool = _BytesPool()
    weights, kv = _tensor(pool, "weights", 1.0), _tensor(pool, "kv_cache", 1.0)
    assert pool.discard(["kv_cache"]) == 64
    assert pool.sleep(offload_tags=("weights", "kv_cache")) == 64  # the KV cache was released already
    pool.wake_up()
    assert torch.all(weights == 1.0) and torch.all(kv == 0)
    assert len(pool.released) == 2


def test_adopt_moves_storages_in_keeping_views_ties_and_values():
    pool = _BytesPool()
    linear = torch.nn.Linear(8, 4)
    tied = torch.nn.Linear(8, 4)
    tied.weight = linear.weight
    view = linear.bias.data[1:3]  # another tensor of the bias's storage, made before
    values = {n: p.detach().clone() for n, p in linear.named_parameters()}
    moved = pool.adopt("weights", [*linear.parameters(), *tied.parameters(), view])
    assert moved == 128 + 64 + 64  # the shared weight once, both biases (16 B each, 64-aligned)
    assert all(pool.owns(p) for p in linear.parameters()) and tied.weight is linear.weight
    assert all(torch.equal(p, values[n]) for n, p in linear.named_parameters())
    assert view.untyped_storage().data_ptr() == linear.bias.untyped_storage().data_ptr()
    assert pool.adopt("weights", linear.parameters()) == 0  # already pool memory


def test_unknown_tags_are_refused_naming_the_allowed_ones():
    pool = _BytesPool()
    allowed = ", ".join(MEMORY_TAGS)
    with pytest.raises(ValueError, match=rf"memory pool tag \['optimizer'\] are invalid; allowed: {allowed}"):
        pool.new_region("optimizer", 8)
    with pytest.raises(ValueError, match=r"wake_up tags \['kv'\] are invalid"):
        pool.wake_up(["kv"])
    with pytest.raises(ValueError, match=r"offload tags \['grads'\] are invalid"):
        pool.sleep(offload_tags=("grads",))
    assert pool.graph_pool_handle() is None
