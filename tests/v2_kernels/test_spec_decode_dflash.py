"""V2 DFlash drafter inputs against vLLM's own kernel (run in Triton's interpreter)."""

from __future__ import annotations

import pytest
import torch

from vllm_ascend.kernels.v2 import spec_decode_dflash as v2

from .vllm_oracle import clone_args, vllm_kernel

PAD = -1


def dflash_case(seed: int, num_reqs: int, *, anchor: bool, cp_size: int, cp_rank: int, block: int):
    g = torch.Generator().manual_seed(seed)
    max_reqs, steps, block_size, max_model_len = 6, 3, 4, 40
    query = steps if anchor else steps + 1
    max_tokens = max_reqs * query + 3
    query_lens = torch.randint(1, 6, (num_reqs,), generator=g)
    qsl = torch.zeros(num_reqs + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(query_lens, 0)
    starts = torch.randint(0, 30, (num_reqs,), generator=g)
    positions = torch.cat(
        [torch.arange(int(s), int(s) + int(n)) for s, n in zip(starts, query_lens, strict=True)]
    )
    rejected = (torch.rand(num_reqs, generator=g) * query_lens).long().to(torch.int32)
    block_table = torch.randint(1, 50, (num_reqs, 8), generator=g, dtype=torch.int32)
    block_table[block_table % 5 == 0] = 0  # null blocks
    idx = torch.randperm(max_reqs, generator=g)[:num_reqs].to(torch.int32)
    num_target = int(qsl[-1])
    args = {
        "out_input_ids_ptr": torch.full((max_tokens,), -9, dtype=torch.int32),
        "out_query_positions_ptr": torch.full((max_tokens,), -9, dtype=torch.int64),
        "out_query_start_loc_ptr": torch.full((max_reqs + 1,), -9, dtype=torch.int32),
        "out_seq_lens_ptr": torch.full((max_reqs,), -9, dtype=torch.int32),
        "out_query_slot_mapping_ptr": torch.full((max_tokens,), -9, dtype=torch.int64),
        "out_context_positions_ptr": torch.full((num_target + 2,), -9, dtype=torch.int64),
        "out_context_slot_mapping_ptr": torch.full((num_target + 2,), -9, dtype=torch.int64),
        "out_sample_indices_ptr": torch.full((max_reqs * steps,), -9, dtype=torch.int32),
        "out_sample_pos_ptr": torch.full((max_reqs * steps,), -9, dtype=torch.int64),
        "out_sample_idx_mapping_ptr": torch.full((max_reqs * steps,), -9, dtype=torch.int32),
        "out_temperature_ptr": torch.full((max_reqs,), -9.0),
        "out_seeds_ptr": torch.full((max_reqs,), -9, dtype=torch.int64),
        "target_positions_ptr": positions,
        "target_query_start_loc_ptr": qsl,
        "idx_mapping_ptr": idx,
        "last_sampled_ptr": torch.randint(0, 1000, (max_reqs,), generator=g),
        "next_prefill_tokens_ptr": torch.randint(1000, 2000, (max_reqs,), generator=g, dtype=torch.int32),
        "num_sampled_ptr": torch.randint(0, 3, (num_reqs,), generator=g, dtype=torch.int32),
        "num_rejected_ptr": rejected,
        "temperature_ptr": torch.rand(max_reqs, generator=g),
        "seeds_ptr": torch.randint(0, 2**40, (max_reqs,), generator=g),
        "block_table_ptr": block_table,
        "block_table_stride": 8,
        "parallel_drafting_token_id": 77,
        "block_size": block_size,
        "num_query_per_req": query,
        "num_speculative_steps": steps,
        "max_num_reqs": max_reqs,
        "max_num_tokens": max_tokens,
        "max_model_len": max_model_len,
        "cp_rank": cp_rank,
        "SAMPLE_FROM_ANCHOR": anchor,
        "PAD_SLOT_ID": PAD,
        "CP_SIZE": cp_size,
        "CP_INTERLEAVE": 2 if cp_size > 1 else 1,
        "BLOCK_SIZE": block,
    }
    per_req = int(query_lens.max()) + query
    return (num_reqs, -(-per_req // block)), args


@pytest.mark.parametrize(
    ("num_reqs", "anchor", "cp_size", "cp_rank", "block"),
    [(1, False, 1, 0, 16), (5, False, 1, 0, 4), (6, True, 1, 0, 8), (4, False, 2, 1, 4), (5, True, 2, 0, 16)],
)
def test_prepare_dflash_inputs_matches_vllm(
    num_reqs: int, anchor: bool, cp_size: int, cp_rank: int, block: int
) -> None:
    grid, args = dflash_case(
        num_reqs * 3 + block + cp_rank, num_reqs, anchor=anchor, cp_size=cp_size, cp_rank=cp_rank, block=block
    )
    expected = clone_args(args)
    vllm_kernel("vllm.v1.worker.gpu.spec_decode.dflash.speculator._prepare_dflash_inputs_kernel")(
        grid, **expected
    )
    v2.prepare_dflash_inputs_torch(grid, **args)
    for name, value in args.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, expected[name]), name
    assert (args["out_query_slot_mapping_ptr"] != -9).all()
