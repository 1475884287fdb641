"""V2 prompt-logprob token ids: the Ascend Triton kernel (interpreter) against the torch reference."""

from __future__ import annotations

import pytest
import torch

from vllm_ascend.kernels._triton.v2 import sample_prompt_logprob as triton_impl
from vllm_ascend.kernels.v2 import sample_prompt_logprob as v2


@pytest.mark.parametrize("num_reqs", [0, 1, 6])
def test_prompt_logprobs_token_ids(num_reqs: int) -> None:
    g = torch.Generator().manual_seed(num_reqs)
    max_reqs, max_len = 8, 64
    query_lens = torch.randint(0, 11, (num_reqs,), generator=g)
    qsl = torch.zeros(num_reqs + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(query_lens, 0)
    args = {
        "prompt_logprobs_token_ids_ptr": torch.full((int(qsl[-1]) + 3,), -1, dtype=torch.int64),
        "query_start_loc_ptr": qsl,
        "idx_mapping_ptr": torch.randperm(max_reqs, generator=g)[:num_reqs].to(torch.int32),
        "num_computed_tokens_ptr": torch.randint(0, 40, (max_reqs,), generator=g, dtype=torch.int32),
        "all_token_ids_ptr": torch.randint(0, 1000, (max_reqs, max_len), generator=g, dtype=torch.int32),
        "all_token_ids_stride": max_len,
        "BLOCK_SIZE": 4,
    }
    ref = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    v2.prompt_logprobs_token_ids_torch((num_reqs,), **ref)
    triton_impl.prompt_logprobs_token_ids((num_reqs,), **args)
    assert torch.equal(args["prompt_logprobs_token_ids_ptr"], ref["prompt_logprobs_token_ids_ptr"])
    if num_reqs:
        state = int(args["idx_mapping_ptr"][0])
        n = int(query_lens[0])
        first = int(args["num_computed_tokens_ptr"][state]) + 1
        assert torch.equal(
            ref["prompt_logprobs_token_ids_ptr"][:n],
            args["all_token_ids_ptr"][state, first : first + n].long(),
        )
