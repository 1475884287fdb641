"""``batch_memcpy`` (the block copies of mamba-style state): the Triton kernel (interpreter) and the torch
reference against copies written with tensor indexing: word and byte paths, a left shift inside one buffer,
empty copies; inconsistent shapes refused."""

from __future__ import annotations

import pytest
import torch

from vllm_ascend import kernels as K
from vllm_ascend.kernels import state_copy


def _addresses(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.uint64)


@pytest.mark.parametrize("impl", ["triton", "torch"])
def test_batch_memcpy_copies_each_range(gen, impl):
    copy = K.batch_memcpy if impl == "triton" else state_copy.batch_memcpy_torch
    blocks = torch.randint(0, 256, (6, 100), generator=gen, dtype=torch.uint8)
    expected = blocks.clone()
    base = blocks.data_ptr()
    # (src block, src offset, dst block, dst offset, bytes): aligned words, odd lengths and offsets, a whole
    # block, an empty copy, and a left shift by 3 bytes inside block 5 (destination inside the source).
    copies = [(0, 0, 1, 0, 64), (2, 3, 3, 1, 37), (4, 0, 0, 0, 100), (1, 8, 2, 96, 0), (5, 3, 5, 0, 90)]
    for sb, so, db, do, n in copies:
        expected[db, do : do + n] = expected[sb, so : so + n].clone()
    copy(
        _addresses([base + sb * 100 + so for sb, so, *_ in copies]),
        _addresses([base + db * 100 + do for *_, db, do, _n in copies]),
        torch.tensor([n for *_, n in copies], dtype=torch.int32),
    )
    assert torch.equal(blocks, expected)


def test_batch_memcpy_words_of_a_float_cache(gen):
    """Whole blocks of a float32 state cache move as 4-byte words: the destination blocks equal the
    sources, the rest is untouched."""
    cache = torch.randn(8, 3, 5, 7, generator=gen)
    before = cache.clone()
    src, dst = [1, 6, 2], [0, 3, 7]
    size = cache[0].numel() * cache.element_size()
    K.batch_memcpy(
        _addresses([cache[b].data_ptr() for b in src]),
        _addresses([cache[b].data_ptr() for b in dst]),
        torch.full((3,), size, dtype=torch.int64),
    )
    assert torch.equal(cache[dst], before[src])
    untouched = [b for b in range(8) if b not in dst]
    assert torch.equal(cache[untouched], before[untouched])


def test_batch_memcpy_refuses_inconsistent_shapes():
    with pytest.raises(
        ValueError, match=r"src_ptrs \(2,\), dst_ptrs \(3,\) and sizes \(2,\) must be one \[N\]"
    ):
        K.batch_memcpy(_addresses([0, 0]), _addresses([0, 0, 0]), torch.zeros(2, dtype=torch.int32))
    K.batch_memcpy(_addresses([]), _addresses([]), torch.zeros(0, dtype=torch.int32))  # nothing to copy
