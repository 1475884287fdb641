"""V2 NaN counts: the Ascend Triton kernel (interpreter) against the torch reference."""

from __future__ import annotations

import pytest
import torch

from vllm_ascend.kernels._triton.v2 import metrics_logits as triton_impl
from vllm_ascend.kernels.v2 import metrics_logits as v2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("num_reqs", "vocab"), [(0, 40), (1, 40), (7, 100)])
def test_num_nans(num_reqs: int, vocab: int, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(num_reqs + vocab)
    logits = torch.randn(num_reqs, vocab + 3, generator=g)
    logits[torch.rand(num_reqs, vocab + 3, generator=g) < 0.2] = float("nan")
    logits[:, -3:] = float("nan")
    args = {
        "logits_ptr": logits.to(dtype),
        "logits_stride": vocab + 3,
        "num_nans_ptr": torch.full((num_reqs + 2,), -7, dtype=torch.int32),
        "vocab_size": vocab,
        "BLOCK_SIZE": 8192,
    }
    ref = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    v2.num_nans_torch((num_reqs,), **ref)
    triton_impl.num_nans((num_reqs,), **args)
    assert torch.equal(args["num_nans_ptr"], ref["num_nans_ptr"])
    assert torch.equal(ref["num_nans_ptr"][:num_reqs], logits[:, :vocab].isnan().sum(-1).int())
