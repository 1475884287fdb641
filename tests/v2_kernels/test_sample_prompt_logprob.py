"""V2 prompt-logprob token-id override against vLLM's own kernel (run in Triton's interpreter)."""

from __future__ import annotations

import pytest
import torch

from vllm_ascend.kernels.v2 import sample_prompt_logprob as v2

from ._interpreter_fixes import interpreter_fixes
from .vllm_oracle import clone_args, vllm_kernel


@pytest.fixture(autouse=True)
def _fixes(monkeypatch):
    interpreter_fixes(monkeypatch)


@pytest.mark.parametrize("num_reqs", [0, 1, 5])
def test_prompt_logprobs_token_ids_matches_vllm(num_reqs: int) -> None:
    g = torch.Generator().manual_seed(num_reqs)
    max_reqs, max_len = 6, 64
    query_lens = torch.randint(0, 9, (num_reqs,), generator=g)
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
    expected = clone_args(args)
    kernel = "vllm.v1.worker.gpu.sample.prompt_logprob._prompt_logprobs_token_ids_kernel"
    vllm_kernel(kernel)((num_reqs,), **expected)
    v2.prompt_logprobs_token_ids_torch((num_reqs,), **args)
    assert torch.equal(args["prompt_logprobs_token_ids_ptr"], expected["prompt_logprobs_token_ids_ptr"])
    assert (args["prompt_logprobs_token_ids_ptr"][: int(qsl[-1])] >= 0).all()
