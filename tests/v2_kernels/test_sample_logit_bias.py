"""V2 logit-bias override against vLLM's own kernel (run in Triton's interpreter)."""

from __future__ import annotations

import pytest
import torch

from vllm_ascend.kernels.v2 import sample_logit_bias as v2

from ._interpreter_fixes import interpreter_fixes
from .vllm_oracle import clone_args, vllm_kernel


@pytest.fixture(autouse=True)
def _fixes(monkeypatch):
    interpreter_fixes(monkeypatch)


def bias_args(g, num_tokens: int, vocab: int, dtype: torch.dtype, check_all_masked: bool) -> dict:
    """Requests: 0 plain, 1 allowed ids, 2 logit bias, 3 stop ids (min tokens), 4 all three, 5 stop ids
    covering the allowed ids (restorable), 6 stop ids past min_len."""
    max_reqs, width, stop_width = 7, 8, 4
    logits = (torch.randn(num_tokens, vocab, generator=g) * 2).to(dtype)
    num_allowed = torch.tensor([0, 5, 0, 0, 3, 2, 0], dtype=torch.int32)
    num_bias = torch.tensor([0, 0, 6, 0, 2, 0, 0], dtype=torch.int32)
    num_stop = torch.tensor([0, 0, 0, 3, 2, 2, 4], dtype=torch.int32)
    allowed = torch.stack([torch.randperm(vocab, generator=g)[:width] for _ in range(max_reqs)]).int()
    stop = torch.randint(0, vocab, (max_reqs, stop_width), generator=g, dtype=torch.int32)
    stop[5, :2] = allowed[5, :2]  # request 5: every allowed id is a stop id
    min_lens = torch.tensor([0, 0, 0, 50, 50, 50, 3], dtype=torch.int32)
    return {
        "logits_ptr": logits,
        "logits_stride": vocab,
        "vocab_size": vocab,
        "expanded_idx_mapping_ptr": torch.randint(0, max_reqs, (num_tokens,), generator=g, dtype=torch.int32),
        "num_allowed_token_ids_ptr": num_allowed,
        "allowed_token_ids_ptr": allowed,
        "allowed_token_ids_stride": width,
        "num_logit_bias_ptr": num_bias,
        "bias_token_ids_ptr": torch.stack(
            [torch.randperm(vocab, generator=g)[:width] for _ in range(max_reqs)]
        ).int(),
        "bias_token_ids_stride": width,
        "bias_ptr": torch.randn(max_reqs, width, generator=g) * 5,
        "bias_stride": width,
        "pos_ptr": torch.randint(0, 10, (num_tokens,), generator=g, dtype=torch.int64),
        "min_lens_ptr": min_lens,
        "num_stop_token_ids_ptr": num_stop,
        "restore_when_all_masked_ptr": torch.tensor([0, 0, 0, 1, 0, 1, 1], dtype=torch.int32),
        "stop_token_ids_ptr": stop,
        "stop_token_ids_stride": stop_width,
        "BLOCK_SIZE": width,
        "LOGITS_BLOCK_SIZE": 32,
        "CHECK_ALL_MASKED_ROWS": check_all_masked,
    }


# Upstream Triton's interpreter handles bfloat16 by bit pattern in places (comparisons, masked
# ``other=-inf``), which breaks vLLM's all-masked row scan: bfloat16 runs without CHECK_ALL_MASKED_ROWS
# (the scan is the same code for every dtype in the reference).
@pytest.mark.parametrize(
    ("num_tokens", "vocab", "dtype", "check_all_masked"),
    [
        (0, 40, torch.float32, True),
        (1, 40, torch.float32, False),
        (1, 40, torch.float32, True),
        (9, 70, torch.float32, False),
        (9, 70, torch.float32, True),
        (9, 70, torch.bfloat16, False),
    ],
)
def test_bias_matches_vllm(num_tokens: int, vocab: int, dtype: torch.dtype, check_all_masked: bool) -> None:
    g = torch.Generator().manual_seed(num_tokens * 3 + vocab)
    args = bias_args(g, num_tokens, vocab, dtype, check_all_masked)
    if num_tokens > 1:
        args["expanded_idx_mapping_ptr"][:7] = torch.arange(7)  # every kind of request
        args["pos_ptr"][6] = 1  # request 6: pos + 1 < min_len
    expected = clone_args(args)
    vllm_kernel("vllm.v1.worker.gpu.sample.logit_bias._bias_kernel")((num_tokens,), **expected)
    v2.bias_torch((num_tokens,), **args)
    if dtype == torch.float32:
        assert torch.equal(args["logits_ptr"], expected["logits_ptr"])
    else:  # the interpreter truncates the float32 -> bfloat16 store, torch rounds: 1 ulp apart
        torch.testing.assert_close(args["logits_ptr"], expected["logits_ptr"], rtol=2**-7, atol=0)
    if num_tokens > 1:
        row5 = args["logits_ptr"][5]
        assert torch.isfinite(row5).any() == check_all_masked  # restored only when checked
