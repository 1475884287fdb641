"""V2 logit bias: the Ascend Triton kernel (interpreter) against the torch reference."""

from __future__ import annotations

import pytest
import torch

from vllm_ascend.kernels._triton.v2 import sample_logit_bias as triton_impl
from vllm_ascend.kernels.v2 import sample_logit_bias as v2


def bias_args(g, num_tokens: int, vocab: int, dtype: torch.dtype, check_all_masked: bool) -> dict:
    """Requests: 0 plain, 1 allowed ids, 2 logit bias, 3 stop ids (min tokens), 4 all three, 5 stop ids
    covering the allowed ids (restorable), 6 stop ids past min_len."""
    max_reqs, width, stop_width = 7, 8, 4
    allowed = torch.stack([torch.randperm(vocab, generator=g)[:width] for _ in range(max_reqs)]).int()
    stop = torch.randint(0, vocab, (max_reqs, stop_width), generator=g, dtype=torch.int32)
    stop[5, :2] = allowed[5, :2]
    args = {
        "logits_ptr": (torch.randn(num_tokens, vocab, generator=g) * 2).to(dtype),
        "logits_stride": vocab,
        "vocab_size": vocab,
        "expanded_idx_mapping_ptr": torch.randint(0, max_reqs, (num_tokens,), generator=g, dtype=torch.int32),
        "num_allowed_token_ids_ptr": torch.tensor([0, 5, 0, 0, 3, 2, 0], dtype=torch.int32),
        "allowed_token_ids_ptr": allowed,
        "allowed_token_ids_stride": width,
        "num_logit_bias_ptr": torch.tensor([0, 0, 6, 0, 2, 0, 0], dtype=torch.int32),
        "bias_token_ids_ptr": torch.stack(
            [torch.randperm(vocab, generator=g)[:width] for _ in range(max_reqs)]
        ).int(),
        "bias_token_ids_stride": width,
        "bias_ptr": torch.randn(max_reqs, width, generator=g) * 5,
        "bias_stride": width,
        "pos_ptr": torch.randint(0, 10, (num_tokens,), generator=g, dtype=torch.int64),
        "min_lens_ptr": torch.tensor([0, 0, 0, 50, 50, 50, 3], dtype=torch.int32),
        "num_stop_token_ids_ptr": torch.tensor([0, 0, 0, 3, 2, 2, 4], dtype=torch.int32),
        "restore_when_all_masked_ptr": torch.tensor([0, 0, 0, 1, 0, 1, 1], dtype=torch.int32),
        "stop_token_ids_ptr": stop,
        "stop_token_ids_stride": stop_width,
        "BLOCK_SIZE": width,
        "LOGITS_BLOCK_SIZE": 8192,
        "CHECK_ALL_MASKED_ROWS": check_all_masked,
    }
    if num_tokens > 1:
        args["expanded_idx_mapping_ptr"][:7] = torch.arange(7)
        args["pos_ptr"][6] = 1
    return args


@pytest.mark.parametrize("check_all_masked", [False, True])
@pytest.mark.parametrize(
    ("num_tokens", "vocab", "dtype"),
    [(0, 40, torch.float32), (1, 40, torch.float32), (9, 70, torch.float32), (9, 70, torch.bfloat16)],
)
def test_bias(num_tokens: int, vocab: int, dtype: torch.dtype, check_all_masked: bool) -> None:
    g = torch.Generator().manual_seed(num_tokens * 3 + vocab)
    args = bias_args(g, num_tokens, vocab, dtype, check_all_masked)
    ref = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    v2.bias_torch((num_tokens,), **ref)
    triton_impl.bias((num_tokens,), **args)
    if dtype == torch.float32:
        assert torch.equal(args["logits_ptr"], ref["logits_ptr"])
    else:  # the interpreter truncates the float32 -> bfloat16 store, torch rounds: 1 ulp apart
        torch.testing.assert_close(args["logits_ptr"], ref["logits_ptr"], rtol=2**-7, atol=0)
    if num_tokens > 1:
        assert torch.isfinite(ref["logits_ptr"][5]).any() == check_all_masked
        assert torch.isfinite(ref["logits_ptr"][1]).sum() == 5
