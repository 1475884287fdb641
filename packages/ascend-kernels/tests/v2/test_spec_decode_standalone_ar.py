"""V2 standalone AR speculator inputs: the Ascend Triton kernel (interpreter) against the torch reference."""

from __future__ import annotations

import pytest
import torch

from vllm_ascend.kernels._triton.v2 import spec_decode_standalone_ar as triton_impl
from vllm_ascend.kernels.v2 import spec_decode_standalone_ar as v2


@pytest.mark.parametrize(
    ("num_reqs", "seed", "max_model_len", "sampled_dtype"),
    [(0, 0, 64, torch.int32), (1, 1, 64, torch.int64), (6, 2, 40, torch.int32), (13, 3, 4096, torch.int64)],
)
def test_prepare_prefill_inputs(
    num_reqs: int, seed: int, max_model_len: int, sampled_dtype: torch.dtype
) -> None:
    g = torch.Generator().manual_seed(seed)
    max_reqs = 16
    query_lens = torch.randint(1, 19, (num_reqs,), generator=g)
    num_rejected = torch.minimum(torch.randint(0, 5, (num_reqs,), generator=g), query_lens - 1)
    tokens = int(query_lens.sum())
    qsl = torch.zeros(max_reqs + 1, dtype=torch.int32)
    qsl[1 : num_reqs + 1] = torch.cumsum(query_lens, 0)
    args = {
        "target_input_ids_ptr": torch.randint(0, 1000, (tokens + 2,), generator=g, dtype=torch.int32),
        "target_positions_ptr": torch.randint(
            0, max_model_len, (tokens + 2,), generator=g, dtype=torch.int64
        ),
        "last_sampled_ptr": torch.randint(0, 50000, (max_reqs,), generator=g, dtype=sampled_dtype),
        "idx_mapping_ptr": torch.randperm(max_reqs, generator=g)[:num_reqs].to(torch.int64),
        "out_input_ids_ptr": torch.full((tokens + max_reqs + 2,), -1, dtype=torch.int32),
        "out_positions_ptr": torch.full((tokens + max_reqs + 2,), -2, dtype=torch.int64),
        "last_token_indices_ptr": torch.full((max_reqs,), -3, dtype=torch.int64),
        "out_query_start_loc_ptr": torch.full((max_reqs + 1,), -4, dtype=torch.int32),
        "out_seq_lens_ptr": torch.full((max_reqs,), -5, dtype=torch.int32),
        "query_start_loc_ptr": qsl,
        "seq_lens_ptr": torch.randint(1, max_model_len + 1, (num_reqs,), generator=g, dtype=torch.int32),
        "num_rejected_ptr": num_rejected.to(torch.int32),
        "max_num_reqs": max_reqs,
        "max_model_len": max_model_len,
        "BLOCK_SIZE": 8,
    }
    ref = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    v2.prepare_prefill_inputs_torch((num_reqs,), **ref)
    triton_impl.prepare_prefill_inputs((num_reqs,), **args)
    for name, value in args.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, ref[name]), name
    if num_reqs:
        assert int(ref["out_query_start_loc_ptr"][-1]) == tokens + num_reqs
        valid = int(query_lens[0] - num_rejected[0])
        state = int(ref["idx_mapping_ptr"][0])
        assert int(ref["out_input_ids_ptr"][valid]) == int(ref["last_sampled_ptr"][state])
