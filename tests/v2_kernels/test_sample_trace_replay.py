"""V2 trace replay against vLLM's own kernel (run in Triton's interpreter)."""

from __future__ import annotations

import pytest
import torch

from vllm_ascend.kernels.v2 import sample_trace_replay as v2

from .vllm_oracle import clone_args, vllm_kernel


def trace_case(seed: int, num_reqs: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    max_reqs, max_len = 10, 16
    idx = torch.randperm(max_reqs, generator=g)[:num_reqs].to(torch.int32)
    idx[::4] = -1
    prompt_len = torch.randint(1, 6, (max_reqs,), generator=g, dtype=torch.int32)
    return {
        "sampled_ptr": torch.randint(0, 1000, (num_reqs,), generator=g),
        "idx_mapping_ptr": idx,
        "trace_token_ids_ptr": torch.randint(1000, 2000, (max_reqs, max_len), generator=g, dtype=torch.int32),
        "trace_token_ids_stride": max_len,
        "trace_len_ptr": torch.randint(-1, 8, (max_reqs,), generator=g, dtype=torch.int32),
        "total_len_ptr": prompt_len + torch.randint(-2, 10, (max_reqs,), generator=g, dtype=torch.int32),
        "prompt_len_ptr": prompt_len,
    }


@pytest.mark.parametrize("num_reqs", [0, 1, 9, 10])
def test_trace_replay_matches_vllm(num_reqs: int) -> None:
    replayed = 0
    for seed in range(3):
        args = trace_case(seed * 13 + num_reqs, num_reqs)
        before = args["sampled_ptr"].clone()
        expected = clone_args(args)
        vllm_kernel("vllm.v1.worker.gpu.sample.trace_replay._trace_replay_kernel")((num_reqs,), **expected)
        v2.trace_replay_torch((num_reqs,), **args)
        assert torch.equal(args["sampled_ptr"], expected["sampled_ptr"])
        replayed += int((args["sampled_ptr"] != before).sum())
    if num_reqs > 1:
        assert replayed > 0
