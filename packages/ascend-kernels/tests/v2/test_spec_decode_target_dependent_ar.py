"""V2 EAGLE/MTP drafting inputs: the Ascend Triton kernels (interpreter) against the torch references."""

from __future__ import annotations

import pytest
import torch

from vllm_ascend.kernels._triton.v2 import spec_decode_target_dependent_ar as triton_impl
from vllm_ascend.kernels.v2 import spec_decode_target_dependent_ar as v2


def _compare(name: str, grid: tuple[int, ...], args: dict) -> dict:
    ref = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    getattr(v2, f"{name}_torch")(grid, **ref)
    getattr(triton_impl, name)(grid, **args)
    for key, value in args.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, ref[key]), key
    return ref


def _qsl(query_lens: torch.Tensor, size: int) -> torch.Tensor:
    qsl = torch.zeros(size, dtype=torch.int32)
    qsl[1 : query_lens.numel() + 1] = torch.cumsum(query_lens, 0)
    qsl[query_lens.numel() + 1 :] = qsl[query_lens.numel()]
    return qsl


@pytest.mark.parametrize(("num_reqs", "seed"), [(0, 0), (1, 1), (6, 2), (13, 3)])
def test_prepare_prefill_inputs(num_reqs: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    max_reqs = 16
    query_lens = torch.randint(1, 20, (num_reqs,), generator=g)
    num_rejected = torch.minimum(torch.randint(0, 4, (num_reqs,), generator=g), query_lens - 1)
    tokens = int(query_lens.sum()) + 3
    args = {
        "last_token_indices_ptr": torch.full((max_reqs,), -9, dtype=torch.int64),
        "draft_current_step_ptr": torch.tensor(5, dtype=torch.int64),
        "draft_input_ids_ptr": torch.full((tokens,), -1, dtype=torch.int32),
        "draft_positions_ptr": torch.full((tokens,), -2, dtype=torch.int64),
        "draft_query_start_loc_ptr": torch.full((max_reqs + 1,), -3, dtype=torch.int32),
        "draft_seq_lens_ptr": torch.full((max_reqs,), -4, dtype=torch.int32),
        "target_input_ids_ptr": torch.randint(0, 1000, (tokens,), generator=g, dtype=torch.int32),
        "target_positions_ptr": torch.randint(0, 4000, (tokens,), generator=g, dtype=torch.int64),
        "idx_mapping_ptr": torch.randperm(max_reqs, generator=g)[:num_reqs].to(torch.int32),
        "last_sampled_ptr": torch.randint(0, 50000, (max_reqs, 1), generator=g, dtype=torch.int64),
        "next_prefill_tokens_ptr": torch.randint(0, 1000, (2, max_reqs), generator=g, dtype=torch.int32),
        "num_sampled_ptr": torch.randint(0, 3, (num_reqs,), generator=g, dtype=torch.int32),
        "num_rejected_ptr": num_rejected.to(torch.int32),
        "query_start_loc_ptr": _qsl(query_lens, max_reqs + 1),
        "seq_lens_ptr": torch.randint(1, 4000, (num_reqs,), generator=g, dtype=torch.int32),
        "max_num_reqs": max_reqs,
        "BLOCK_SIZE": 8,
    }
    ref = _compare("prepare_prefill_inputs", (num_reqs,), args)
    if num_reqs:
        assert int(ref["draft_current_step_ptr"]) == 0
        assert (ref["draft_seq_lens_ptr"][num_reqs:] == 0).all()
        first_valid = int(query_lens[0] - num_rejected[0])
        assert int(ref["last_token_indices_ptr"][0]) == first_valid - 1


@pytest.mark.parametrize(("num_reqs", "advance"), [(0, True), (1, True), (9, False), (21, True)])
def test_prepare_decode_inputs(num_reqs: int, advance: bool) -> None:
    g = torch.Generator().manual_seed(num_reqs)
    max_reqs, steps, max_model_len = 24, 3, 64
    draft_tokens = torch.randint(0, 1000, (max_reqs, steps), generator=g, dtype=torch.int64)
    args = {
        "draft_tokens_ptr": draft_tokens[:num_reqs],
        "draft_tokens_stride": steps,
        "target_seq_lens_ptr": torch.randint(
            3, max_model_len + 1, (num_reqs,), generator=g, dtype=torch.int32
        ),
        "num_rejected_ptr": torch.randint(0, 3, (num_reqs,), generator=g, dtype=torch.int32),
        "input_ids_ptr": torch.full((max_reqs + 2,), -1, dtype=torch.int32),
        "positions_ptr": torch.randint(0, max_model_len, (max_reqs + 2,), generator=g, dtype=torch.int64),
        "sample_src_positions_ptr": torch.randint(0, 100, (max_reqs,), generator=g, dtype=torch.int64),
        "query_start_loc_ptr": torch.full((max_reqs + 1,), -3, dtype=torch.int32),
        "seq_lens_ptr": torch.full((max_reqs,), -4, dtype=torch.int32),
        "max_model_len": max_model_len,
        "max_num_reqs": max_reqs,
        "BLOCK_SIZE": 4,
        "ADVANCE_DRAFT_POSITIONS": advance,
    }
    if num_reqs:
        args["positions_ptr"][0] = max_model_len - 1
    ref = _compare("prepare_decode_inputs", (num_reqs + 1,), args)
    assert ref["query_start_loc_ptr"].tolist() == [min(j, num_reqs) for j in range(max_reqs + 1)]


@pytest.mark.parametrize(
    ("num_reqs", "step", "advance", "dtype"),
    [
        (0, 0, True, torch.float32),
        (1, 0, True, torch.float32),
        (7, 1, True, torch.bfloat16),
        (4, 2, True, torch.float32),
        (3, 0, False, torch.float16),
    ],
)
def test_update_draft_inputs(num_reqs: int, step: int, advance: bool, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(step * 10 + num_reqs)
    max_reqs, steps, hidden, max_model_len = 8, 3, 19, 32
    args = {
        "output_draft_tokens_ptr": torch.full((max_reqs, steps), -1, dtype=torch.int64),
        "output_draft_tokens_stride": steps,
        "next_input_hidden_states_ptr": torch.zeros((max_reqs, hidden + 3), dtype=dtype),
        "next_input_hidden_states_stride": hidden + 3,
        "input_ids_ptr": torch.full((max_reqs,), -1, dtype=torch.int32),
        "positions_ptr": torch.randint(0, max_model_len, (max_reqs,), generator=g, dtype=torch.int64),
        "sample_src_positions_ptr": torch.randint(0, 100, (max_reqs,), generator=g, dtype=torch.int64),
        "seq_lens_ptr": torch.randint(1, max_model_len + 1, (max_reqs,), generator=g, dtype=torch.int32),
        "draft_tokens_ptr": torch.randint(0, 1000, (num_reqs,), generator=g, dtype=torch.int64),
        "current_draft_step_ptr": torch.tensor(step, dtype=torch.int64),
        "hidden_states_ptr": torch.randn((num_reqs, hidden + 2), generator=g).to(dtype),
        "hidden_states_stride": hidden + 2,
        "hidden_size": hidden,
        "max_model_len": max_model_len,
        "num_speculative_steps": steps,
        "BLOCK_SIZE": 8,
        "ADVANCE_DRAFT_POSITIONS": advance,
    }
    args["positions_ptr"][0] = max_model_len - 1
    args["seq_lens_ptr"][0] = max_model_len
    ref = _compare("update_draft_inputs", (num_reqs,), args)
    if num_reqs and step < steps - 1:
        assert torch.equal(
            ref["next_input_hidden_states_ptr"][:num_reqs, :hidden], args["hidden_states_ptr"][:, :hidden]
        )
