"""V2 DCP sequence-length and grammar-bitmask overrides against vLLM's own kernels (Triton's interpreter)."""

from __future__ import annotations

import pytest
import torch

from vllm_ascend.kernels.v2 import cp_utils, structured_outputs

from .vllm_oracle import clone_args, vllm_kernel


@pytest.mark.parametrize(("dcp_size", "dcp_rank", "interleave"), [(2, 0, 1), (2, 1, 4), (4, 3, 2)])
def test_dcp_local_seq_lens_matches_vllm(dcp_size: int, dcp_rank: int, interleave: int) -> None:
    g = torch.Generator().manual_seed(dcp_size + dcp_rank)
    args = {
        "out_ptr": torch.full((10,), -1, dtype=torch.int32),
        "seq_lens_ptr": torch.randint(0, 100, (10,), generator=g, dtype=torch.int32),
        "dcp_size": dcp_size,
        "dcp_rank": dcp_rank,
        "cp_interleave": interleave,
        "num_reqs": 7,
        "max_num_reqs": 10,
        "BLOCK_SIZE": 4,
    }
    expected = clone_args(args)
    vllm_kernel("vllm.v1.worker.gpu.cp_utils._dcp_local_seq_lens_kernel")((3,), **expected)
    cp_utils.dcp_local_seq_lens_torch((3,), **args)
    assert torch.equal(args["out_ptr"], expected["out_ptr"])


def test_apply_grammar_bitmask_matches_vllm() -> None:
    g = torch.Generator().manual_seed(0)
    vocab, stride, block = 100, 4, 64  # 4 int32 words = 128 bits >= vocab
    cu = torch.tensor([0, 2, 3, 6], dtype=torch.int32)
    mapping = torch.tensor([0 * stride + 0, 0 * stride + 1, 1 * stride + 0, 2 * stride + 2, 1 * stride + 3])
    args = {
        "logits_ptr": torch.randn(6, vocab, generator=g),
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
