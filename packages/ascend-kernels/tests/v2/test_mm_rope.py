"""V2 M-RoPE positions: the Ascend Triton kernel (interpreter) against the torch reference."""

from __future__ import annotations

import pytest
import torch

from vllm_ascend.kernels._triton.v2 import mm_rope as triton_impl
from vllm_ascend.kernels.v2 import mm_rope as v2


def _case(seed: int, num_reqs: int, num_dims: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    max_reqs, max_model_len, max_tokens = 8, 48, 80
    query_lens = torch.randint(1, 10, (num_reqs,), generator=g)
    qsl = torch.full((num_reqs + 1,), 2, dtype=torch.int32)
    qsl[1:] += torch.cumsum(query_lens, 0).to(torch.int32)
    prefill_lens = torch.randint(5, 30, (max_reqs,), generator=g, dtype=torch.int32)
    computed = torch.where(
        torch.arange(max_reqs) % 2 == 0,
        torch.randint(0, 5, (max_reqs,), generator=g),
        prefill_lens.long() + torch.randint(0, 8, (max_reqs,), generator=g),
    ).to(torch.int32)
    return {
        "positions_ptr": torch.full((num_dims, max_tokens + 1), -5, dtype=torch.int64),
        "positions_stride": max_tokens + 1,
        "prefill_positions_ptr": torch.randint(
            0, 1000, (max_reqs * num_dims, max_model_len), generator=g, dtype=torch.int32
        ),
        "prefill_positions_stride0": num_dims * max_model_len,
        "prefill_positions_stride1": max_model_len,
        "prefill_delta_ptr": torch.randint(-20, 20, (max_reqs,), generator=g, dtype=torch.int32),
        "idx_mapping_ptr": torch.randperm(max_reqs, generator=g)[:num_reqs].to(torch.int32),
        "query_start_loc_ptr": qsl,
        "prefill_lens_ptr": prefill_lens,
        "num_computed_tokens_ptr": computed,
        "BLOCK_SIZE": 1024,
        "NUM_DIMS": num_dims,
    }


@pytest.mark.parametrize(("num_reqs", "num_dims"), [(0, 3), (1, 3), (6, 3), (8, 4)])
def test_prepare_rope_positions(num_reqs: int, num_dims: int) -> None:
    args = _case(num_reqs * 5 + num_dims, num_reqs, num_dims)
    ref = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    v2.prepare_rope_positions_torch((num_reqs,), **ref)
    triton_impl.prepare_rope_positions((num_reqs,), **args)
    assert torch.equal(args["positions_ptr"], ref["positions_ptr"])
    if num_reqs:
        written = int(args["query_start_loc_ptr"][-1])
        assert (ref["positions_ptr"][:, 2:written] != -5).all()
