"""V2 min-p: the Ascend Triton kernel (interpreter) against the torch reference."""

from __future__ import annotations

import pytest
import torch

from vllm_ascend.kernels._triton.v2 import sample_min_p as triton_impl
from vllm_ascend.kernels.v2 import sample_min_p as v2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("num_tokens", "vocab"), [(0, 40), (1, 40), (6, 100), (9, 77)])
def test_min_p(num_tokens: int, vocab: int, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(num_tokens + vocab)
    logits = (torch.randn(num_tokens, vocab + 2, generator=g) * 3).to(dtype)
    if num_tokens > 1:
        logits[1, :vocab:3] = float("-inf")
        logits[0, 7] = float("nan")
    args = {
        "logits_ptr": logits,
        "logits_stride": vocab + 2,
        "expanded_idx_mapping_ptr": torch.randint(0, 4, (num_tokens,), generator=g, dtype=torch.int32),
        "min_p_ptr": torch.tensor([0.0, 0.05, 0.3, 0.9]),
        "vocab_size": vocab,
        "BLOCK_SIZE": 1024,
    }
    if num_tokens > 1:
        args["expanded_idx_mapping_ptr"][0] = 2
    ref = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    v2.min_p_torch((num_tokens,), **ref)
    triton_impl.min_p((num_tokens,), **args)
    assert torch.equal(args["logits_ptr"].isnan(), ref["logits_ptr"].isnan())
    assert torch.equal(args["logits_ptr"].nan_to_num(0.0), ref["logits_ptr"].nan_to_num(0.0))
    filtered = args["expanded_idx_mapping_ptr"] != 0
    if bool(filtered.any()):
        assert torch.isinf(ref["logits_ptr"][filtered][:, :vocab]).any()
