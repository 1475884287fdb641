"""V2 grammar-bitmask override against vLLM's own kernel (Triton's interpreter)."""

from __future__ import annotations

import pytest
import torch

from vllm_ascend.kernels.v2 import structured_outputs

from .vllm_oracle import clone_args, vllm_kernel


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_apply_grammar_bitmask_matches_vllm(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    vocab, stride, block = 100, 4, 64  # 4 int32 words = 128 bits >= vocab
    cu = torch.tensor([0, 2, 3, 6], dtype=torch.int32)
    mapping = torch.tensor([0 * stride + 0, 0 * stride + 1, 1 * stride + 0, 2 * stride + 2, 1 * stride + 3])
    args = {
        "logits_ptr": torch.randn(6, vocab, generator=g).to(dtype),
        "logits_stride": vocab,
        "logits_indices_ptr": mapping.to(torch.int32),
        "cu_num_logits_ptr": cu,
        "bitmask_ptr": torch.randint(-(2**31), 2**31 - 1, (5, stride), generator=g, dtype=torch.int32),
        "bitmask_stride": stride,
        "vocab_size": vocab,
        "MASK_STRIDE": stride,
        "BLOCK_SIZE": block,
    }
    grid = (5, (vocab + block - 1) // block)
    expected = clone_args(args)
    vllm_kernel("vllm.v1.worker.gpu.structured_outputs._apply_grammar_bitmask_kernel")(grid, **expected)
    structured_outputs.apply_grammar_bitmask_torch(grid, **args)
    assert torch.equal(args["logits_ptr"], expected["logits_ptr"])
    assert torch.isinf(args["logits_ptr"]).sum() > 50  # masks applied
    # Rows 3 and 4 have no mask; mask 4 (position 3 of request 1, which has one logit) is skipped.
    assert not torch.isinf(args["logits_ptr"][3:5]).any()


def test_apply_grammar_bitmask_one_word_vocab_matches_vllm() -> None:
    # A vocabulary smaller than one int32 word, one request with three positions, all masked.
    g = torch.Generator().manual_seed(1)
    vocab = 20
    cu = torch.tensor([0, 3], dtype=torch.int32)
    args = {
        "logits_ptr": torch.randn(3, vocab, generator=g),
        "logits_stride": vocab,
        "logits_indices_ptr": torch.tensor([0, 1, 2], dtype=torch.int32),
        "cu_num_logits_ptr": cu,
        "bitmask_ptr": torch.randint(-(2**31), 2**31 - 1, (3, 1), generator=g, dtype=torch.int32),
        "bitmask_stride": 1,
        "vocab_size": vocab,
        "MASK_STRIDE": 4,
        "BLOCK_SIZE": 8192,
    }
    expected = clone_args(args)
    vllm_kernel("vllm.v1.worker.gpu.structured_outputs._apply_grammar_bitmask_kernel")((3, 1), **expected)
    structured_outputs.apply_grammar_bitmask_torch((3, 1), **args)
    assert torch.equal(args["logits_ptr"], expected["logits_ptr"])
    assert torch.isinf(args["logits_ptr"]).sum() > 10
