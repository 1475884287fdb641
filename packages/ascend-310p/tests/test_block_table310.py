"""310P block tables: the numpy slot mapping equals the kernels' torch reference; the input batch builds them."""

from __future__ import annotations

import os

os.environ.setdefault("VLLM_ASCEND_DEVICE", "reference")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch

import vllm_ascend.kernels as kernels
from vllm_ascend.ascend310p.block_table import (
    BlockTable310,
    MultiGroupBlockTable310,
    _compute_slot_mapping_numpy,
)
from vllm_ascend.ascend310p.input_batch import NPUInputBatch310
from vllm_ascend.kernels.slot_mapping import compute_slot_mapping_torch
from vllm_ascend.runner.block_table import BlockTable, token_request_indices

CPU = torch.device("cpu")


@pytest.mark.parametrize(("world", "rank", "interleave"), [(1, 0, 1), (2, 1, 1), (2, 0, 2), (4, 3, 4)])
def test_numpy_slot_mapping_equals_the_torch_reference(world, rank, interleave):
    rng = np.random.default_rng(world * 10 + rank)
    for block_size in (4, 16):
        table = rng.integers(0, 500, size=(5, 9)).astype(np.int32)
        table[rng.random(table.shape) < 0.3] = -1  # padding entries
        num_tokens = 40
        req = rng.integers(0, 5, size=num_tokens)
        pos = rng.integers(0, 9 * block_size * world, size=num_tokens)
        got = _compute_slot_mapping_numpy(table, req, pos, block_size, world, rank, interleave)
        expected = compute_slot_mapping_torch(
            torch.from_numpy(table),
            torch.from_numpy(req),
            torch.from_numpy(pos),
            block_size,
            world,
            rank,
            interleave,
        )
        assert got.dtype == np.int64 and got.tolist() == expected.tolist()
    with pytest.raises(ValueError, match=r"invalid slot-mapping geometry: block_size=0"):
        _compute_slot_mapping_numpy(table, req, pos, 0)


def _tables(cls, block_size=4):
    return cls(block_size, 4, 8, 32, False, CPU, dcp_world_size=1, dcp_rank=0)


def test_block_table_slots_equal_the_runners_and_pad(monkeypatch):
    rng = np.random.default_rng(7)
    ours, runners = _tables(BlockTable310), _tables(BlockTable)
    for row in range(3):
        ids = rng.choice(100, size=5, replace=False).tolist()
        ours.add_row(ids, row)
        runners.add_row(ids, row)
    ours.commit_block_table(3)
    runners.commit_block_table(3)
    q_lens = [6, 1, 9]
    qsl = torch.tensor([0, *np.cumsum(q_lens)], dtype=torch.int32)
    positions = torch.cat([torch.arange(s, s + n) for s, n in zip([3, 17, 0], q_lens, strict=True)])
    # No device kernel runs on 310P: the host computes the slots.
    monkeypatch.setattr(kernels, "compute_slot_mapping", None)
    ours.compute_slot_mapping(3, qsl, positions)
    monkeypatch.undo()
    runners.compute_slot_mapping(3, qsl, positions)
    assert torch.equal(ours.slot_mapping.gpu, runners.slot_mapping.gpu)
    assert (ours.slot_mapping.gpu[16:] == -1).all() and (ours.slot_mapping.gpu[:16] >= 0).all()
    req = token_request_indices(qsl, 3, 16)
    table = ours.get_cpu_tensor()
    brute = [int(table[r, p // 4]) * 4 + p % 4 for r, p in zip(req.tolist(), positions.tolist(), strict=True)]
    assert ours.slot_mapping.gpu[:16].tolist() == brute
    # Host inputs (numpy) give the same slots; a stale tail from a longer step is padded again.
    ours.slot_mapping.gpu.fill_(123)
    ours.compute_slot_mapping(3, qsl.numpy(), positions.numpy())
    assert torch.equal(ours.slot_mapping.gpu, runners.slot_mapping.gpu)
    with pytest.raises(ValueError, match="query_start_loc covers 16 tokens but positions has 15"):
        ours.compute_slot_mapping(3, qsl, positions[:15])


def test_input_batch_builds_310p_block_tables():
    batch = NPUInputBatch310(
        max_num_reqs=4,
        max_model_len=64,
        max_num_batched_tokens=32,
        device=CPU,
        vocab_size=100,
        block_sizes=[16, 32],
        max_num_blocks_per_req=[4, 2],
    )
    assert isinstance(batch.block_table, MultiGroupBlockTable310)
    assert [type(t) for t in batch.block_table.block_tables] == [BlockTable310, BlockTable310]
    import vllm_ascend.runner.block_table as runner_block_table
    import vllm_ascend.runner.input_batch as runner_input_batch

    # The names were bound only while the batch was built.
    assert runner_block_table.BlockTable is BlockTable
    assert runner_input_batch.MultiGroupBlockTable is runner_block_table.MultiGroupBlockTable
