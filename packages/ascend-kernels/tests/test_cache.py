"""KV-block zeroing and slot mapping against their references."""

from __future__ import annotations

import pytest
import torch

import vllm_ascend.kernels as K
from vllm_ascend.kernels import kv_zero, slot_mapping


def _caches(gen):
    """Several layouts and dtypes, including a view with a storage offset and a strided outer dim."""
    with_offset = torch.randn(3, 2, 12, 4, 6, generator=gen)
    strided = torch.randn(3, 2, 12, 4, 6, generator=gen)
    return [
        (torch.randn(2, 12, 4, 2, 8, generator=gen).to(torch.bfloat16), 1),  # [K/V, blocks, ...]
        (torch.randn(12, 4, 2, 8, generator=gen), 0),  # [blocks, ...]
        (torch.randint(-100, 100, (12, 3, 5), generator=gen, dtype=torch.int8), 0),  # odd byte sizes
        (with_offset[1], 1),  # view with a storage offset
        (strided[:, 0], 1),  # strided outer dim
    ]


def test_zero_kv_blocks_matches_reference_in_one_launch(gen):
    pairs = _caches(gen)
    tensors = [t for t, _ in pairs]
    dims = [d for _, d in pairs]
    ids = torch.tensor([3, 0, 11, 3, 7])  # duplicate ids are fine
    got = tensors  # zeroed in place, views included
    want = [t.clone() for t in tensors]
    snapshot = [t.clone() for t in tensors]
    assert tensors[3].storage_offset() > 0 and not tensors[4].is_contiguous()
    K.zero_kv_blocks(got, ids, dims)
    kv_zero.zero_kv_blocks_torch(want, ids, dims)
    for g, w, before, d in zip(got, want, snapshot, dims, strict=True):
        assert torch.equal(g, w)
        untouched = [b for b in range(12) if b not in ids.tolist()]
        assert torch.equal(
            g.index_select(d, torch.tensor(untouched)), before.index_select(d, torch.tensor(untouched))
        )
        assert not g.index_select(d, ids).any()


def test_zero_kv_blocks_rejects_non_contiguous_blocks(gen):
    t = torch.randn(4, 6, 8, generator=gen).transpose(1, 2)
    with pytest.raises(ValueError, match="must be contiguous"):
        K.zero_kv_blocks([t], torch.tensor([1]), 0)
    with pytest.raises(ValueError, match="block_dim has 1 entries for 2"):
        K.zero_kv_blocks([t, t], torch.tensor([1]), [0])


@pytest.mark.parametrize(("world", "interleave"), [(1, 1), (2, 1), (4, 1), (2, 4), (3, 2)])
def test_slot_mapping(gen, world, interleave):
    block_size, reqs, max_blocks = 8, 5, 6
    table = torch.randint(0, 1000, (reqs, max_blocks), generator=gen, dtype=torch.int32)
    tokens = 50
    req = torch.randint(0, reqs, (tokens,), generator=gen)
    pos = torch.randint(0, block_size * world * max_blocks, (tokens,), generator=gen)
    for rank in range(world):
        got = K.compute_slot_mapping(table, req, pos, block_size, world, rank, interleave)
        want = slot_mapping.compute_slot_mapping_torch(table, req, pos, block_size, world, rank, interleave)
        assert got.dtype == torch.int64 and torch.equal(got, want)
    if world == 1:
        assert (want >= 0).all()
    else:  # every token lands on exactly one rank
        owners = torch.stack(
            [
                slot_mapping.compute_slot_mapping_torch(table, req, pos, block_size, world, r, interleave)
                >= 0
                for r in range(world)
            ]
        )
        assert (owners.sum(0) == 1).all()


def test_slot_mapping_plain_values():
    table = torch.tensor([[7, 2], [5, 9]], dtype=torch.int32)
    got = K.compute_slot_mapping(table, torch.tensor([0, 0, 1, 1]), torch.tensor([0, 5, 3, 4]), 4)
    assert got.tolist() == [28, 9, 23, 36]


def test_slot_mapping_rejects_bad_geometry():
    table = torch.zeros(1, 1, dtype=torch.int32)
    with pytest.raises(ValueError, match="dcp_rank=2"):
        K.compute_slot_mapping(table, torch.zeros(1), torch.zeros(1), 4, 2, 2)
    with pytest.raises(ValueError, match="multiple of interleave_size"):
        K.compute_slot_mapping(table, torch.zeros(1), torch.zeros(1), 4, 2, 0, 3)
