"""V2 trace replay: the Ascend Triton kernel (interpreter) against the torch reference."""

from __future__ import annotations

import pytest
import torch

from vllm_ascend.kernels._triton.v2 import sample_trace_replay as triton_impl
from vllm_ascend.kernels.v2 import sample_trace_replay as v2


@pytest.mark.parametrize("num_reqs", [0, 1, 9, 30])
def test_trace_replay(num_reqs: int) -> None:
    replayed = 0
    for seed in range(3):
        g = torch.Generator().manual_seed(seed * 13 + num_reqs)
        max_reqs, max_len = 32, 16
        idx = torch.randperm(max_reqs, generator=g)[:num_reqs].to(torch.int32)
        idx[::4] = -1
        prompt_len = torch.randint(1, 6, (max_reqs,), generator=g, dtype=torch.int32)
        args = {
            "sampled_ptr": torch.randint(0, 1000, (num_reqs,), generator=g),
            "idx_mapping_ptr": idx,
            "trace_token_ids_ptr": torch.randint(
                1000, 2000, (max_reqs, max_len + 2), generator=g, dtype=torch.int32
            ),
            "trace_token_ids_stride": max_len + 2,
            "trace_len_ptr": torch.randint(-1, 8, (max_reqs,), generator=g, dtype=torch.int32),
            "total_len_ptr": prompt_len + torch.randint(-2, 10, (max_reqs,), generator=g, dtype=torch.int32),
            "prompt_len_ptr": prompt_len,
        }
        before = args["sampled_ptr"].clone()
        ref = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in args.items()}
        v2.trace_replay_torch((num_reqs,), **ref)
        triton_impl.trace_replay((num_reqs,), **args)
        assert torch.equal(args["sampled_ptr"], ref["sampled_ptr"])
        replayed += int((ref["sampled_ptr"] != before).sum())
    if num_reqs > 1:
        assert replayed > 0
