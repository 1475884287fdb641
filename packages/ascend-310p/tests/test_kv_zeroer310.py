"""AscendKVBlockZeroer310: zeroes exactly the given blocks of every layer, without the Triton path."""

from __future__ import annotations

import os
from types import SimpleNamespace

os.environ.setdefault("VLLM_ASCEND_DEVICE", "reference")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from vllm.v1.kv_cache_interface import FullAttentionSpec

import vllm_ascend.kernels as kernels
from vllm_ascend.ascend310p.kv_zeroer import AscendKVBlockZeroer310

NUM_BLOCKS = 6


def _zeroer(layers):
    spec = FullAttentionSpec(block_size=4, num_kv_heads=2, head_size=8, dtype=torch.float16)
    ctx = {f"l{i}": SimpleNamespace(kv_cache=kv) for i, kv in enumerate(layers)}
    group = SimpleNamespace(
        kv_cache_spec=spec, kv_cache_group_id=0, layer_names=list(ctx), kernel_block_stride=0
    )
    return AscendKVBlockZeroer310(torch.device("cpu"), [group], [4], ctx, num_blocks=NUM_BLOCKS)


def test_zeroes_exactly_the_given_blocks_and_nothing_else(monkeypatch):
    monkeypatch.setattr(kernels, "zero_kv_blocks", None)  # 310P: no kernel call at all
    gen = torch.Generator().manual_seed(0)
    pool = torch.rand(2 * NUM_BLOCKS * 4 * 2 * 16, generator=gen).add_(0.5).to(torch.float16)
    # Two layers of a token-major pool viewed [blocks, H, block_size, D + Dv] like vLLM does, and one layer
    # with two kernel blocks per allocation block (ratio 2), and an alias of layer 0 (deduplicated).
    layers = [pool.view(2, NUM_BLOCKS, 4, 2, 16)[i].permute(0, 2, 1, 3) for i in range(2)]
    split = torch.rand(2 * NUM_BLOCKS, 2, 2, 16, generator=gen).add_(0.5).to(torch.float16)
    zeroer = _zeroer([*layers, split, layers[0]])
    assert len(zeroer.caches) == 3 and [r for r, _, _ in zeroer.meta] == [1, 2]
    before = [t.clone() for t in (*layers, split)]
    zeroer.zero_block_ids([1, 4])
    for kv, old in zip(layers, before[:2], strict=True):
        assert (kv[[1, 4]] == 0).all()
        keep = [0, 2, 3, 5]
        assert torch.equal(kv[keep], old[keep])
    assert (split[[2, 3, 8, 9]] == 0).all()  # allocation block b is kernel blocks 2b, 2b + 1
    keep = [i for i in range(2 * NUM_BLOCKS) if i not in (2, 3, 8, 9)]
    assert torch.equal(split[keep], before[2][keep])
    zeroer.zero_block_ids([])  # nothing to do
    with pytest.raises(ValueError, match=r"block ids must lie in \[0, 6\)"):
        zeroer.zero_block_ids([6])
    with pytest.raises(ValueError, match=r"block ids must lie in \[0, 6\)"):
        zeroer.zero_block_ids([-1])


def test_non_viewable_caches_are_zeroed_in_place():
    base = torch.ones(NUM_BLOCKS, 4, 2, 32, dtype=torch.float16)
    strided = base[..., :16]  # every other half of the last dim: no flat view exists
    zeroer = _zeroer([strided])
    zeroer.zero_block_ids([0, 5])
    assert (strided[[0, 5]] == 0).all() and (strided[1:5] == 1).all()
    assert (base[..., 16:] == 1).all()  # the memory around the view is untouched
