"""V2 batch-sharded sampling: the Ascend Triton kernels (interpreter) against the torch references."""

from __future__ import annotations

import pytest
import torch

from vllm_ascend.kernels._triton.v2 import sample_batch_shard as triton_impl
from vllm_ascend.kernels.v2 import sample_batch_shard as v2


def _clone(args: dict) -> dict:
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in args.items()}


def _assert_same(args: dict, ref: dict) -> None:
    for name, value in args.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, ref[name]), name


def _plan_case(seed: int, num_reqs: int, tp_size: int, tp_rank: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    idx = torch.randperm(32, generator=g)[:num_reqs].to(torch.int32)
    num_logits = torch.randint(1, 7, (num_reqs,), generator=g)
    cu = torch.zeros(num_reqs + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(num_logits, 0)
    qsl = torch.zeros(num_reqs + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(num_logits + torch.randint(0, 5, (num_reqs,), generator=g), 0)
    owner = idx.long() % tp_size
    per_rank = torch.zeros(tp_size, dtype=torch.int64).index_add_(0, owner, num_logits)
    reqs_per_rank = torch.bincount(owner, minlength=tp_size)
    num_local_reqs = int(reqs_per_rank[tp_rank])
    num_local_logits = int(per_rank[tp_rank])
    return {
        "idx_mapping_ptr": idx,
        "cu_num_logits_ptr": cu,
        "query_start_loc_ptr": qsl,
        "seq_lens_ptr": torch.randint(1, 100, (num_reqs,), generator=g, dtype=torch.int32),
        "sorted_logits_indices_ptr": torch.full((int(cu[-1]),), -1, dtype=torch.int64),
        "gathered_src_indices_ptr": torch.full((num_reqs,), -1, dtype=torch.int64),
        "local_idx_mapping_ptr": torch.full((num_local_reqs,), -1, dtype=torch.int32),
        "local_cu_num_logits_ptr": torch.full((num_local_reqs + 1,), -1, dtype=torch.int32),
        "local_logits_indices_ptr": torch.full((num_local_logits,), -1, dtype=torch.int64),
        "local_expanded_idx_mapping_ptr": torch.full((num_local_logits,), -1, dtype=torch.int32),
        "local_expanded_local_pos_ptr": torch.full((num_local_logits,), -1, dtype=torch.int32),
        "local_seq_lens_ptr": torch.full((num_local_reqs,), -1, dtype=torch.int32),
        "num_reqs": num_reqs,
        "local_logits_start": int(per_rank[:tp_rank].sum()),
        "max_num_reqs_per_rank": int(reqs_per_rank.max()),
        "TP_SIZE": tp_size,
        "TP_RANK": tp_rank,
        "PADDED_NUM_REQS": 32,
        "PADDED_NUM_LOGITS_PER_REQ": 8,
    }


@pytest.mark.parametrize(
    ("num_reqs", "tp_size", "tp_rank"), [(1, 2, 0), (1, 2, 1), (9, 2, 1), (13, 4, 3), (13, 3, 0)]
)
def test_build_shard_plan(num_reqs: int, tp_size: int, tp_rank: int) -> None:
    args = _plan_case(num_reqs * 10 + tp_size + tp_rank, num_reqs, tp_size, tp_rank)
    ref = _clone(args)
    v2.build_shard_plan_torch((num_reqs,), **ref)
    triton_impl.build_shard_plan((num_reqs,), **args)
    _assert_same(args, ref)
    assert torch.equal(
        ref["sorted_logits_indices_ptr"].sort().values, ref["sorted_logits_indices_ptr"].unique()
    )
    assert (ref["local_expanded_local_pos_ptr"] >= 0).all()


@pytest.mark.parametrize(
    ("num_reqs", "max_logits", "src_cols", "nans"),
    [(0, 2, 2, False), (1, 1, 1, True), (7, 5, 3, True), (6, 4, 6, False)],
)
def test_pack_sampler_output(num_reqs: int, max_logits: int, src_cols: int, nans: bool) -> None:
    g = torch.Generator().manual_seed(num_reqs + 10 * max_logits)
    cols = max_logits + 3
    counts = torch.randint(1, max_logits + 1, (num_reqs,), generator=g)
    cu = torch.zeros(num_reqs + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(counts, 0)
    n = max(num_reqs, 1)
    args = {
        "packed_ptr": torch.full((n + 1, cols), -7, dtype=torch.int64),
        "packed_stride": cols,
        "sampled_token_ids_ptr": torch.randint(0, 1000, (n, src_cols + 1), generator=g),
        "sampled_token_ids_stride": src_cols + 1,
        "num_sampled_ptr": torch.randint(0, 4, (n,), generator=g, dtype=torch.int32),
        "num_rejected_ptr": torch.randint(0, 4, (n,), generator=g, dtype=torch.int32),
        "num_nans_ptr": torch.randint(0, 3, (int(cu[-1]) + 1,), generator=g, dtype=torch.int32)
        if nans
        else None,
        "local_cu_num_logits_ptr": cu if nans else None,
        "max_num_logits_per_req": max_logits,
        "num_src_cols": src_cols,
        "BLOCK_SIZE": 1 << (max_logits - 1).bit_length(),
    }
    ref = _clone(args)
    v2.pack_sampler_output_torch((num_reqs,), **ref)
    triton_impl.pack_sampler_output((num_reqs,), **args)
    _assert_same(args, ref)
    if num_reqs:
        assert (ref["packed_ptr"][:num_reqs, : max_logits + 2] != -7).all()


@pytest.mark.parametrize(
    ("num_reqs", "max_logits", "nans"), [(0, 2, False), (1, 1, True), (7, 5, True), (6, 4, False)]
)
def test_unpack_gathered_output(num_reqs: int, max_logits: int, nans: bool) -> None:
    g = torch.Generator().manual_seed(num_reqs + 7 * max_logits)
    cols = max_logits + 4
    n = max(num_reqs, 1)
    args = {
        "gathered_ptr": torch.randint(-(2**40), 2**40, (num_reqs + 4, cols), generator=g),
        "gathered_stride": cols,
        "gathered_src_indices_ptr": torch.randperm(num_reqs + 4, generator=g)[:num_reqs],
        "sampled_token_ids_ptr": torch.full((n, max_logits), -7, dtype=torch.int64),
        "num_sampled_ptr": torch.full((n,), -7, dtype=torch.int32),
        "num_rejected_ptr": torch.full((n,), -7, dtype=torch.int32),
        "num_nans_ptr": torch.full((n,), -7, dtype=torch.int32) if nans else None,
        "max_num_logits_per_req": max_logits,
        "BLOCK_SIZE": 1 << (max_logits - 1).bit_length(),
    }
    ref = _clone(args)
    v2.unpack_gathered_output_torch((num_reqs,), **ref)
    triton_impl.unpack_gathered_output((num_reqs,), **args)
    _assert_same(args, ref)
    if num_reqs:
        assert (ref["sampled_token_ids_ptr"] != -7).all()


@pytest.mark.parametrize(
    ("num_reqs", "max_logits", "logprob_cols", "src_cols"),
    [(0, 1, 2, 2), (1, 2, 3, 3), (6, 3, 6, 3), (5, 2, 3, 7)],
)
def test_pack_and_unpack_logprobs(num_reqs: int, max_logits: int, logprob_cols: int, src_cols: int) -> None:
    g = torch.Generator().manual_seed(num_reqs + 13 * src_cols)
    counts = torch.randint(1, max_logits + 1, (num_reqs,), generator=g)
    cu = torch.zeros(num_reqs + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(counts, 0)
    rows = int(cu[-1]) + 1
    send_rows = num_reqs * max_logits + 1
    block = 1 << (logprob_cols - 1).bit_length()
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
        "BLOCK_SIZE": block,
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
        "BLOCK_SIZE": block,
    }
    grid = (num_reqs, max_logits)
    for name, args in (("pack_logprobs", pack), ("unpack_logprobs", unpack)):
        ref = _clone(args)
        getattr(v2, f"{name}_torch")(grid, **ref)
        getattr(triton_impl, name)(grid, **args)
        _assert_same(args, ref)
    if num_reqs:
        assert (pack["send_ids_ptr"][0] != -7).all()
        assert (unpack["logprobs_ptr"][:-1] != 7.0).all()
