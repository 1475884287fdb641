"""V2 min-p override against vLLM's own kernel (run in Triton's interpreter)."""

from __future__ import annotations

import pytest
import torch

from vllm_ascend.kernels.v2 import sample_min_p as v2

from ._interpreter_fixes import interpreter_fixes
from .vllm_oracle import clone_args, vllm_kernel


@pytest.fixture(autouse=True)
def _fixes(monkeypatch):
    interpreter_fixes(monkeypatch)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("num_tokens", "vocab", "block"), [(0, 40, 16), (1, 40, 16), (6, 100, 32)])
def test_min_p_matches_vllm(num_tokens: int, vocab: int, block: int, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(num_tokens + vocab)
    logits = (torch.randn(num_tokens, vocab + 2, generator=g) * 3).to(dtype)
    if num_tokens > 1:
        logits[1, :vocab:3] = float("-inf")
    args = {
        "logits_ptr": logits,
        "logits_stride": vocab + 2,
        "expanded_idx_mapping_ptr": torch.randint(0, 4, (num_tokens,), generator=g, dtype=torch.int32),
        "min_p_ptr": torch.tensor([0.0, 0.05, 0.3, 0.9]),
        "vocab_size": vocab,
        "BLOCK_SIZE": block,
    }
    original = logits.clone()
    expected = clone_args(args)
    vllm_kernel("vllm.v1.worker.gpu.sample.min_p._min_p_kernel")((num_tokens,), **expected)
    v2.min_p_torch((num_tokens,), **args)
    assert torch.equal(args["logits_ptr"], expected["logits_ptr"])
    filtered = args["expanded_idx_mapping_ptr"] != 0
    if bool(filtered.any()):
        assert (args["logits_ptr"][filtered] != original[filtered]).any()
