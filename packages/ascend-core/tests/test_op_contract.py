"""The op contract core keeps: the MLA latent-cache layout and the counting of the attention op families (their
implementations live in ascend-kernels)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from vllm_ascend.core.device.adaptor.base import DeviceOpError
from vllm_ascend.core.device.adaptor.mla import MLA_OPS, MLADeviceOps, check_latent_cache, latent_cache_parts
from vllm_ascend.core.device.adaptor.sparse import SPARSE_OPS, SparseAttentionDeviceOps


def test_latent_cache_parts_are_two_contiguous_regions_of_one_allocation():
    cache = torch.arange(2 * 3 * 5, dtype=torch.float32).view(2, 3, 5)
    c_kv, k_pe = latent_cache_parts(cache, 4)
    assert c_kv.shape == (2, 3, 4) and k_pe.shape == (2, 3, 1)
    assert c_kv.is_contiguous() and k_pe.is_contiguous()
    assert c_kv.flatten().tolist() == list(range(24)) and k_pe.flatten().tolist() == list(range(24, 30))
    c_kv.zero_()
    assert cache.flatten()[:24].eq(0).all()
    with pytest.raises(DeviceOpError, match=r"kv_lora_rank=5 must be within \(0, 5\)"):
        check_latent_cache(cache, 5)
    with pytest.raises(DeviceOpError, match="one contiguous allocation"):
        latent_cache_parts(cache.transpose(0, 1), 4)


def test_attention_op_families_count_their_overrides():
    def init(self):
        self.call_counts, self._active_ops = Counter(), set()

    names = MLA_OPS + SPARSE_OPS
    body = {"__init__": init, **{name: (lambda self, *a, **k: 1) for name in names}}
    ops = type("Impl", (MLADeviceOps, SparseAttentionDeviceOps), body)()
    assert [getattr(ops, name)() for name in names] == [1] * len(names)
    assert dict(ops.call_counts) == dict.fromkeys(names, 1)
