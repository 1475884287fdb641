"""V2 batch-sharded sampling (shard plan, output / logprobs packing) against vLLM's own kernels (run in
Triton's interpreter)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vllm_ascend.kernels.v2 import sample_batch_shard as v2

from ._interpreter_fixes import interpreter_fixes
from .vllm_oracle import clone_args, vllm_kernel

_VLLM = "vllm.v1.worker.gpu.sample.batch_shard"


@pytest.fixture(autouse=True)
def _fixes(monkeypatch):
    interpreter_fixes(monkeypatch)


def _assert_same(args: dict, expected: dict) -> None:
    for name, value in args.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, expected[name]), name


def plan_case(seed: int, num_reqs: int, tp_size: int, tp_rank: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    idx = torch.randperm(16, generator=g)[:num_reqs].to(torch.int32)
    num_logits = torch.randint(1, 4, (num_reqs,), generator=g)
    cu = torch.zeros(num_reqs + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(num_logits, 0)
    query_lens = num_logits + torch.randint(0, 5, (num_reqs,), generator=g)
    qsl = torch.zeros(num_reqs + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(query_lens, 0)
    owner = idx.numpy() % tp_size
    per_rank = np.bincount(owner, weights=num_logits.numpy(), minlength=tp_size).astype(np.int64)
    num_local_reqs = int((owner == tp_rank).sum())
    num_local_logits = int(per_rank[tp_rank])
    total = int(cu[-1])
    return {
        "idx_mapping_ptr": idx,
        "cu_num_logits_ptr": cu,
        "query_start_loc_ptr": qsl,
        "seq_lens_ptr": torch.randint(1, 100, (num_reqs,), generator=g, dtype=torch.int32),
        "sorted_logits_indices_ptr": torch.full((total,), -1, dtype=torch.int64),
        "gathered_src_indices_ptr": torch.full((num_reqs,), -1, dtype=torch.int64),
        "local_idx_mapping_ptr": torch.full((num_local_reqs,), -1, dtype=torch.int32),
        "local_cu_num_logits_ptr": torch.full((num_local_reqs + 1,), -1, dtype=torch.int32),
        "local_logits_indices_ptr": torch.full((num_local_logits,), -1, dtype=torch.int64),
        "local_expanded_idx_mapping_ptr": torch.full((num_local_logits,), -1, dtype=torch.int32),
        "local_expanded_local_pos_ptr": torch.full((num_local_logits,), -1, dtype=torch.int32),
        "local_seq_lens_ptr": torch.full((num_local_reqs,), -1, dtype=torch.int32),
        "num_reqs": num_reqs,
        "local_logits_start": int(per_rank[:tp_rank].sum()),
        "max_num_reqs_per_rank": int(np.bincount(owner, minlength=tp_size).max()) if num_reqs else 1,
        "TP_SIZE": tp_size,
        "TP_RANK": tp_rank,
        "PADDED_NUM_REQS": 16,
        "PADDED_NUM_LOGITS_PER_REQ": 4,
    }


@pytest.mark.parametrize(
    ("num_reqs", "tp_size", "tp_rank"), [(1, 2, 0), (1, 2, 1), (7, 2, 1), (9, 3, 0), (9, 3, 2)]
)
def test_build_shard_plan_matches_vllm(num_reqs: int, tp_size: int, tp_rank: int) -> None:
    args = plan_case(num_reqs * 10 + tp_size + tp_rank, num_reqs, tp_size, tp_rank)
    expected = clone_args(args)
    vllm_kernel(f"{_VLLM}._build_shard_plan_kernel")((num_reqs,), **expected)
    v2.build_shard_plan_torch((num_reqs,), **args)
    _assert_same(args, expected)
    assert (args["sorted_logits_indices_ptr"] >= 0).all()


@pytest.mark.parametrize(
    ("num_reqs", "max_logits", "src_cols", "nans"),
    [(0, 2, 2, False), (1, 1, 1, True), (5, 3, 2, True), (4, 4, 4, False)],
)
def test_pack_sampler_output_matches_vllm(num_reqs: int, max_logits: int, src_cols: int, nans: bool) -> None:
    g = torch.Generator().manual_seed(num_reqs + 10 * max_logits)
    cols = max_logits + 3
    counts = torch.randint(1, max_logits + 1, (num_reqs,), generator=g)
    cu = torch.zeros(num_reqs + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(counts, 0)
    args = {
        "packed_ptr": torch.full((max(num_reqs, 1) + 1, cols), -7, dtype=torch.int64),
        "packed_stride": cols,
        "sampled_token_ids_ptr": torch.randint(0, 1000, (max(num_reqs, 1), src_cols + 1), generator=g),
        "sampled_token_ids_stride": src_cols + 1,
        "num_sampled_ptr": torch.randint(0, 4, (max(num_reqs, 1),), generator=g, dtype=torch.int32),
        "num_rejected_ptr": torch.randint(0, 4, (max(num_reqs, 1),), generator=g, dtype=torch.int32),
        "num_nans_ptr": torch.randint(0, 3, (int(cu[-1]) + 1,), generator=g, dtype=torch.int32)
        if nans
        else None,
        "local_cu_num_logits_ptr": cu if nans else None,
        "max_num_logits_per_req": max_logits,
        "num_src_cols": src_cols,
        "BLOCK_SIZE": 1 << (max_logits - 1).bit_length(),
    }
    expected = clone_args(args)
    vllm_kernel(f"{_VLLM}._pack_sampler_output_kernel")((num_reqs,), **expected)
    v2.pack_sampler_output_torch((num_reqs,), **args)
    _assert_same(args, expected)


@pytest.mark.parametrize(
    ("num_reqs", "max_logits", "nans"), [(0, 2, False), (1, 1, True), (6, 3, True), (5, 4, False)]
)
def test_unpack_gathered_output_matches_vllm(num_reqs: int, max_logits: int, nans: bool) -> None:
    g = torch.Generator().manual_seed(num_reqs + 7 * max_logits)
    cols = max_logits + 2 + nans + 1
    gathered = torch.randint(-(2**40), 2**40, (num_reqs + 4, cols), generator=g)
    args = {
        "gathered_ptr": gathered,
        "gathered_stride": cols,
        "gathered_src_indices_ptr": torch.randperm(num_reqs + 4, generator=g)[:num_reqs],
        "sampled_token_ids_ptr": torch.full((max(num_reqs, 1), max_logits), -7, dtype=torch.int64),
        "num_sampled_ptr": torch.full((max(num_reqs, 1),), -7, dtype=torch.int32),
        "num_rejected_ptr": torch.full((max(num_reqs, 1),), -7, dtype=torch.int32),
        "num_nans_ptr": torch.full((max(num_reqs, 1),), -7, dtype=torch.int32) if nans else None,
        "max_num_logits_per_req": max_logits,
        "BLOCK_SIZE": 1 << (max_logits - 1).bit_length(),
    }
    expected = clone_args(args)
    vllm_kernel(f"{_VLLM}._unpack_gathered_output_kernel")((num_reqs,), **expected)
    v2.unpack_gathered_output_torch((num_reqs,), **args)
    _assert_same(args, expected)


def logprobs_case(seed: int, num_reqs: int, max_logits: int, logprob_cols: int, src_cols: int) -> tuple:
    g = torch.Generator().manual_seed(seed)
    counts = torch.randint(1, max_logits + 1, (num_reqs,), generator=g)
    cu = torch.zeros(num_reqs + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(counts, 0)
    rows = int(cu[-1]) + 1
    send_rows = num_reqs * max_logits + 1
    pack = {
        "send_ids_ptr": torch.full((send_rows, logprob_cols + 1), -7, dtype=torch.int64),
        "send_ids_stride": logprob_cols + 1,
        "send_logprobs_ptr": torch.full((send_rows, logprob_cols), 7.0),
        "send_logprobs_stride": logprob_cols,
        "src_ids_ptr": torch.randint(0, 500, (rows, src_cols), generator=g, dtype=torch.int32),
        "src_ids_stride": src_cols,
        "src_logprobs_ptr": -torch.rand(rows, src_cols, generator=g),
        "src_logprobs_stride": src_cols,
        "selected_token_ranks_ptr": torch.randint(0, 50, (rows,), generator=g),
        "local_cu_num_logits_ptr": cu,
        "max_num_logits_per_req": max_logits,
        "num_logprob_cols": logprob_cols,
        "num_src_cols": src_cols,
        "BLOCK_SIZE": 1 << (logprob_cols - 1).bit_length(),
    }
    unpack = {
        "gathered_ids_ptr": torch.randint(0, 500, (send_rows + 3, logprob_cols + 1), generator=g),
        "gathered_ids_stride": logprob_cols + 1,
        "gathered_logprobs_ptr": -torch.rand(send_rows + 3, logprob_cols, generator=g),
        "gathered_logprobs_stride": logprob_cols,
        "gathered_src_indices_ptr": torch.randperm(num_reqs, generator=g),
        "cu_num_logits_ptr": cu,
        "logprob_token_ids_ptr": torch.full((rows, logprob_cols), -7, dtype=torch.int64),
        "logprobs_ptr": torch.full((rows, logprob_cols), 7.0),
        "selected_token_ranks_ptr": torch.full((rows,), -7, dtype=torch.int64),
        "max_num_logits_per_req": max_logits,
        "num_logprob_cols": logprob_cols,
        "BLOCK_SIZE": 1 << (logprob_cols - 1).bit_length(),
    }
    return pack, unpack


@pytest.mark.parametrize(
    ("num_reqs", "max_logits", "logprob_cols", "src_cols"),
    [(0, 1, 2, 2), (1, 2, 3, 3), (5, 3, 5, 3), (4, 2, 3, 6)],
)
def test_pack_and_unpack_logprobs_match_vllm(
    num_reqs: int, max_logits: int, logprob_cols: int, src_cols: int
) -> None:
    pack, unpack = logprobs_case(num_reqs + 13 * src_cols, num_reqs, max_logits, logprob_cols, src_cols)
    grid = (num_reqs, max_logits)
    for name, args in (("_pack_logprobs_kernel", pack), ("_unpack_logprobs_kernel", unpack)):
        expected = clone_args(args)
        vllm_kernel(f"{_VLLM}.{name}")(grid, **expected)
        getattr(v2, name.removeprefix("_").removesuffix("_kernel") + "_torch")(grid, **args)
        _assert_same(args, expected)
    if num_reqs:
        assert (pack["send_ids_ptr"][0, :logprob_cols] != -7).all()
        assert (unpack["logprobs_ptr"][0] != 7.0).all()
