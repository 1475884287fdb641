"""Block tables: row operations, the three views, commit, slot mapping (plain, DCP, kernel blocks)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vllm_ascend.runner.block_table import (
    BlockTable,
    MultiGroupBlockTable,
    aligned_width,
    kv_blocks_to_kernel_blocks,
    slot_mapping_kernel_override,
    token_request_indices,
)

CPU = torch.device("cpu")


def _table(block_size=4, max_reqs=4, max_blocks=8, max_tokens=32, **kw) -> BlockTable:
    return BlockTable(
        block_size, max_reqs, max_blocks, max_tokens, False, CPU, dcp_world_size=1, dcp_rank=0, **kw
    )


def test_row_operations_and_views():
    t = _table()
    t.add_row([5, 6], 0)
    t.append_row([7], 0)
    t.add_row([9], 1)
    assert t.get_numpy_array()[0, :3].tolist() == [5, 6, 7]
    assert t.num_blocks_per_row[:2].tolist() == [3, 1]
    t.swap_row(0, 1)
    assert t.get_numpy_array()[0, :3].tolist() == [9, 0, 0]
    assert t.get_numpy_array()[1, :3].tolist() == [5, 6, 7]
    t.move_row(1, 3)
    assert t.get_numpy_array()[3, :3].tolist() == [5, 6, 7]
    assert t.get_numpy_array()[1].sum() == 0 and t.num_blocks_per_row[1] == 0
    t.clear_row(3)
    assert t.get_numpy_array()[3].sum() == 0
    # The numpy view and the host tensor share memory; the device copy changes only on commit.
    t.add_row([2, 3], 2)
    assert t.get_cpu_tensor()[2, :2].tolist() == [2, 3]
    assert t.get_device_tensor(4)[2, :2].tolist() == [0, 0]
    t.commit_block_table(4)
    assert t.get_device_tensor(4)[2, :2].tolist() == [2, 3]
    assert t.get_device_tensor(2).shape == (2, 8)
    t.clear()
    assert t.get_device_tensor(4).abs().sum() == 0 and t.num_blocks_per_row.sum() == 0


def test_row_overflow_is_an_error():
    t = _table(max_blocks=2)
    with pytest.raises(ValueError, match="at most 2"):
        t.add_row([1, 2, 3], 0)


def test_slot_mapping_matches_brute_force_and_pads():
    t = _table(block_size=4)
    t.add_row([3, 8, 1], 0)
    t.add_row([5, 2], 1)
    t.commit_block_table(2)
    # Request 0: positions 5..9 (chunked prefill continuing); request 1: decode at position 6.
    positions = torch.tensor([5, 6, 7, 8, 9, 6])
    qsl = torch.tensor([0, 5, 6], dtype=torch.int32)
    t.compute_slot_mapping(2, qsl, positions)
    rows = {0: [3, 8, 1], 1: [5, 2]}
    expected = [rows[r][p // 4] * 4 + p % 4 for r, p in zip([0] * 5 + [1], positions.tolist(), strict=True)]
    got = t.slot_mapping.gpu
    assert got[:6].tolist() == expected
    assert (got[6:] == -1).all()


@pytest.mark.parametrize(("world", "interleave"), [(2, 1), (2, 2), (4, 4)])
def test_dcp_slot_mapping_spreads_tokens_over_ranks(world, interleave):
    block_size, n = 8, 50
    positions = torch.arange(n)
    qsl = torch.tensor([0, n], dtype=torch.int32)
    owners = {}
    for rank in range(world):
        t = _table(
            block_size=block_size, max_blocks=16, max_tokens=64, cp_kv_cache_interleave_size=interleave
        )
        t.dcp_world_size, t.dcp_rank = world, rank
        t.add_row(list(range(10, 20)), 0)
        t.commit_block_table(1)
        t.compute_slot_mapping(1, qsl, positions)
        slots = t.slot_mapping.gpu[:n].tolist()
        local = [s for s in slots if s >= 0]
        assert len(local) == len(set(local))  # no two tokens share a slot on a rank
        for p, s in enumerate(slots):
            if s >= 0:
                owners[p] = owners.get(p, 0) + 1
                # Owner of position p: its interleave chunk within the virtual block, round-robin.
                assert (p % (block_size * world)) // interleave % world == rank
                assert s // block_size == 10 + p // (block_size * world)
    assert owners == dict.fromkeys(range(n), 1)  # every token is stored by exactly one rank


def test_allocation_blocks_split_into_kernel_blocks():
    assert kv_blocks_to_kernel_blocks([3, 5], 2).tolist() == [6, 7, 10, 11]
    t = _table(block_size=32, kernel_block_size=16)
    assert t.block_size == 16 and t.max_num_blocks_per_req == 16
    t.add_row([3], 0)
    assert t.get_numpy_array()[0, :2].tolist() == [6, 7]
    with pytest.raises(ValueError, match="divisor of block_size=32"):
        _table(block_size=32, kernel_block_size=24)


def test_triton_kernel_override_writes_slots_and_padding():
    table = torch.zeros(3, 4, dtype=torch.int32)
    table[0, :2] = torch.tensor([7, 2])
    table[1, :1] = torch.tensor([4])
    out = torch.full((10,), 123, dtype=torch.int64)
    slot_mapping_kernel_override(
        num_tokens=4, max_num_tokens=8, query_start_loc_ptr=torch.tensor([0, 3, 4], dtype=torch.int32),
        positions_ptr=torch.tensor([2, 3, 4, 1]), block_table_ptr=table, block_table_stride=4,
        slot_mapping_ptr=out, KV_CACHE_BLOCK_SIZE=4, TOTAL_CP_WORLD_SIZE=1, TOTAL_CP_RANK=0,
        CP_KV_CACHE_INTERLEAVE_SIZE=1, PAD_ID=-1, BLOCK_SIZE=1024,
    )  # fmt: skip
    assert out.tolist() == [30, 31, 8, 17, -1, -1, -1, -1, 123, 123]


def test_helpers_and_multi_group_forwarding():
    assert token_request_indices(torch.tensor([0, 2, 2, 5]), 3, 5).tolist() == [0, 0, 2, 2, 2]
    assert aligned_width(3, 16) == 8  # 128 tokens / 16 per block
    assert aligned_width(3, 16, None) == 3
    multi = MultiGroupBlockTable(4, 32, False, CPU, block_sizes=[16, 32], max_num_blocks=[4, 2])
    multi.add_row(([1, 2], [9]), 1)
    assert multi[0].get_numpy_array()[1, :2].tolist() == [1, 2]
    assert multi[1].get_numpy_array()[1, :1].tolist() == [9]
    multi.swap_row(1, 0)
    assert multi[1].get_numpy_array()[0, 0] == 9
    with pytest.raises(
        ValueError, match="max_num_blocks has 1 entries; expected one per KV cache group \\(2\\)"
    ):
        MultiGroupBlockTable(4, 32, False, CPU, block_sizes=[16, 32], max_num_blocks=[4])
    assert np.array_equal(multi[0].get_numpy_array(), multi[0].get_cpu_tensor().numpy())
