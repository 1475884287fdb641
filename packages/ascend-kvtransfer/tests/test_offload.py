"""The Ascend offloading spec's worker: device blocks to host chunks and back through the adaptor, chunks of
several blocks entered mid-chunk, several cache groups and tensors; config refused by field."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from vllm.v1.kv_offload.base import (
    CanonicalKVCacheRef,
    CanonicalKVCaches,
    CanonicalKVCacheTensor,
    GPULoadStoreSpec,
)
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec

from vllm_ascend.core.sdk import ConfigError, get_device_adaptor
from vllm_ascend.kvtransfer.offload import NPUOffloadingWorker, check_offloading_extra_config

PAGE = 64


@pytest.fixture(autouse=True)
def reference_device(monkeypatch: pytest.MonkeyPatch):
    """The worker copies through the active device's adaptor: the reference device's here."""
    monkeypatch.setenv("VLLM_ASCEND_DEVICE", "reference")


def _caches(num_blocks: int) -> tuple[CanonicalKVCaches, list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    tensors = [
        torch.randint(-128, 128, (num_blocks, PAGE), dtype=torch.int8, generator=gen) for _ in range(3)
    ]
    # group 0: layers in tensors 0 and 1 (tensor 1 aliased by two layers); group 1: tensor 2
    refs = [
        [CanonicalKVCacheRef(0, PAGE), CanonicalKVCacheRef(1, PAGE), CanonicalKVCacheRef(1, PAGE)],
        [CanonicalKVCacheRef(2, PAGE)],
    ]
    return CanonicalKVCaches([CanonicalKVCacheTensor(t, PAGE) for t in tensors], refs), tensors


def test_store_then_load_round_trips_through_chunks():
    caches, device = _caches(num_blocks=32)
    original = [t.clone() for t in device]
    worker = NPUOffloadingWorker(caches, blocks_per_chunk=2, num_chunks=8)
    adaptor = get_device_adaptor()
    before = adaptor.call_counts["swap_blocks"]
    # group 0: logical blocks 3..6 (starts mid-chunk: skip 1) -> device 10,11,12,13 -> chunks 4,5,6
    # group 1: logical blocks 0..1 -> device 20,21 -> chunk 1
    store_src = GPULoadStoreSpec([10, 11, 12, 13, 20, 21], group_sizes=[4, 2], block_indices=[3, 0])
    assert worker.submit_store(7, store_src, CPULoadStoreSpec([4, 5, 6, 1]))
    done = worker.get_finished()
    assert [(r.job_id, r.success, r.transfer_size) for r in done] == [(7, True, (4 * 2 + 2) * PAGE)]
    # group 0 uses tensors 0 and 1 once each (the aliased layer is not copied twice), group 1 tensor 2
    assert adaptor.call_counts["swap_blocks"] - before == 3
    host0 = worker.host_tensors[0]
    assert torch.equal(host0[4 * 2 + 1], original[0][10])  # chunk 4, second block
    assert torch.equal(host0[6 * 2 + 0], original[0][13])
    assert torch.equal(worker.host_tensors[2][1 * 2 + 1], original[2][21])
    for t in device:
        t.zero_()
    load_dst = GPULoadStoreSpec([0, 1, 2, 3, 5, 6], group_sizes=[4, 2], block_indices=[3, 0])
    assert worker.submit_load(8, CPULoadStoreSpec([4, 5, 6, 1]), load_dst)
    worker.wait({8})
    assert [r.job_id for r in worker.get_finished()] == [8]
    for index in (0, 1):
        assert torch.equal(device[index][[0, 1, 2, 3]], original[index][[10, 11, 12, 13]])
    assert torch.equal(device[2][[5, 6]], original[2][[20, 21]])
    assert not device[0][4:].any() and not device[2][:5].any()
    worker.shutdown()


def test_spec_that_does_not_cover_its_blocks_is_refused():
    caches, _ = _caches(num_blocks=8)
    worker = NPUOffloadingWorker(caches, blocks_per_chunk=1, num_chunks=4)
    spec = GPULoadStoreSpec([0, 1, 2], group_sizes=[3, 0], block_indices=[0, 0])
    with pytest.raises(ValueError, match="3 device blocks / 2 host chunks"):
        worker.submit_store(1, spec, CPULoadStoreSpec([0, 1]))
    assert np.array_equal(spec.block_ids, [0, 1, 2])


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({}, "cpu_bytes_to_use must be a positive number"),
        ({"cpu_bytes_to_use": -1}, "cpu_bytes_to_use must be a positive number"),
        (
            {"cpu_bytes_to_use": 1 << 20, "eviction_policy": "fifo"},
            "eviction_policy = 'fifo' is not supported; supported: lru, arc",
        ),
        ({"cpu_bytes_to_use": 1 << 20, "canonical_layout": True}, "canonical_layout is not supported"),
    ],
)
def test_offloading_config_is_refused_by_field(extra, message):
    with pytest.raises(ConfigError, match=message):
        check_offloading_extra_config(extra, "kv_transfer_config.kv_connector_extra_config")
    check_offloading_extra_config({"cpu_bytes_to_use": 1 << 20, "eviction_policy": "arc"})
