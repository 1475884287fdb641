"""V2 EAGLE/MTP (target-dependent AR) drafting overrides against vLLM's own kernels (Triton's interpreter)."""

from __future__ import annotations

import pytest
import torch

from vllm_ascend.kernels.v2 import spec_decode_target_dependent_ar as v2

from .vllm_oracle import clone_args, vllm_kernel

_MODULE = "vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator"


def _check(kernel: str, grid: tuple[int, ...], args: dict, reference) -> None:
    expected = clone_args(args)
    vllm_kernel(f"{_MODULE}.{kernel}")(grid, **expected)
    reference(grid, **args)
    for name, value in args.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, expected[name]), name


def _qsl(query_lens: torch.Tensor, size: int) -> torch.Tensor:
    qsl = torch.zeros(size, dtype=torch.int32)
    qsl[1 : query_lens.numel() + 1] = torch.cumsum(query_lens, 0)
    qsl[query_lens.numel() + 1 :] = qsl[query_lens.numel()]
    return qsl


@pytest.mark.parametrize(("num_reqs", "seed"), [(0, 0), (1, 1), (5, 2), (7, 3)])
def test_prepare_prefill_inputs_matches_vllm(num_reqs: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    max_reqs, lookahead = 8, 2
    query_lens = torch.randint(1, 12, (num_reqs,), generator=g)
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
        "next_prefill_tokens_ptr": torch.randint(
            0, 1000, (lookahead, max_reqs), generator=g, dtype=torch.int32
        ),
        "num_sampled_ptr": torch.randint(0, 3, (num_reqs,), generator=g, dtype=torch.int32),
        "num_rejected_ptr": num_rejected.to(torch.int32),
        "query_start_loc_ptr": _qsl(query_lens, max_reqs + 1),
        "seq_lens_ptr": torch.randint(1, 4000, (num_reqs,), generator=g, dtype=torch.int32),
        "max_num_reqs": max_reqs,
        "BLOCK_SIZE": 4,
    }
    _check("_prepare_prefill_inputs_kernel", (num_reqs,), args, v2.prepare_prefill_inputs_torch)


@pytest.mark.parametrize(("num_reqs", "advance"), [(0, True), (1, True), (5, False), (6, True)])
def test_prepare_decode_inputs_matches_vllm(num_reqs: int, advance: bool) -> None:
    g = torch.Generator().manual_seed(num_reqs)
    max_reqs, steps, max_model_len = 8, 3, 64
    draft_tokens = torch.randint(0, 1000, (max_reqs, steps), generator=g, dtype=torch.int64)
    target_seq_lens = torch.randint(3, max_model_len + 1, (num_reqs,), generator=g, dtype=torch.int32)
    args = {
        "draft_tokens_ptr": draft_tokens[:num_reqs],
        "draft_tokens_stride": steps,
        "target_seq_lens_ptr": target_seq_lens,
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
        args["positions_ptr"][0] = max_model_len - 1  # clamped
    _check("_prepare_decode_inputs_kernel", (num_reqs + 1,), args, v2.prepare_decode_inputs_torch)


@pytest.mark.parametrize(
    ("num_reqs", "step", "advance", "dtype"),
    [
        (1, 0, True, torch.float32),
        (5, 1, True, torch.bfloat16),
        (4, 2, True, torch.float32),
        (3, 0, False, torch.float16),
    ],
)
def test_update_draft_inputs_matches_vllm(
    num_reqs: int, step: int, advance: bool, dtype: torch.dtype
) -> None:
    g = torch.Generator().manual_seed(step * 10 + num_reqs)
    max_reqs, steps, hidden, max_model_len = 6, 3, 10, 32
    hidden_states = torch.randn((num_reqs, hidden + 2), generator=g).to(dtype)
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
        "hidden_states_ptr": hidden_states,
        "hidden_states_stride": hidden + 2,
        "hidden_size": hidden,
        "max_model_len": max_model_len,
        "num_speculative_steps": steps,
        "BLOCK_SIZE": 4,
        "ADVANCE_DRAFT_POSITIONS": advance,
    }
    args["positions_ptr"][0] = max_model_len - 1
    args["seq_lens_ptr"][0] = max_model_len
    _check("_update_draft_inputs_kernel", (num_reqs,), args, v2.update_draft_inputs_torch)
