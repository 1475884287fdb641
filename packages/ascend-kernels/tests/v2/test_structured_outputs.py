"""V2 grammar bitmask: the Ascend Triton kernel (interpreter) against the torch reference."""

from __future__ import annotations

import pytest
import torch

from vllm_ascend.kernels._triton.v2 import structured_outputs as triton_impl
from vllm_ascend.kernels.v2 import structured_outputs as v2


@pytest.mark.parametrize(
    ("num_reqs", "vocab", "dtype"), [(1, 31, torch.float32), (3, 100, torch.float32), (4, 200, torch.float16)]
)
def test_apply_grammar_bitmask(num_reqs: int, vocab: int, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(vocab)
    mask_stride, words = 4, (vocab + 31) // 32
    num_logits = torch.randint(1, mask_stride + 1, (num_reqs,), generator=g)
    cu = torch.zeros(num_reqs + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(num_logits, 0)
    # Every request's scheduled positions (some past its logits: trimmed drafts) carry a mask.
    mapping = torch.tensor(
        [r * mask_stride + p for r in range(num_reqs) for p in range(mask_stride) if p < 3]
    )
    num_masks = mapping.numel()
    args = {
        "logits_stride": vocab,
        "logits_indices_ptr": mapping.to(torch.int32),
        "cu_num_logits_ptr": cu,
        "bitmask_ptr": torch.randint(-(2**31), 2**31 - 1, (num_masks, words), generator=g, dtype=torch.int32),
        "bitmask_stride": words,
        "vocab_size": vocab,
        "MASK_STRIDE": mask_stride,
        "BLOCK_SIZE": 8192,
    }
    logits = torch.randn(int(cu[-1]), vocab, generator=g).to(dtype)
    got, want = logits.clone(), logits.clone()
    grid = (num_masks, 1)
    triton_impl.apply_grammar_bitmask(grid, logits_ptr=got, **args)
    v2.apply_grammar_bitmask_torch(grid, logits_ptr=want, **args)
    assert torch.equal(got, want)
    masked = torch.isinf(want)
    assert masked.any()
    assert torch.equal(want[~masked], logits[~masked])
    # Bit b of word w clear <=> token 32 w + b of the mask's row is -inf.
    r, p = int(mapping[0]) // mask_stride, int(mapping[0]) % mask_stride
    bits = (args["bitmask_ptr"][0, :, None] >> torch.arange(32)) & 1
    assert torch.equal(masked[int(cu[r]) + p], (bits.flatten()[:vocab] == 0))


def test_apply_grammar_bitmask_no_masks() -> None:
    logits = torch.randn(2, 40)
    before = logits.clone()
    triton_impl.apply_grammar_bitmask(
        (0, 1),
        logits_ptr=logits,
        logits_stride=40,
        logits_indices_ptr=torch.zeros(0, dtype=torch.int32),
        cu_num_logits_ptr=torch.tensor([0, 2], dtype=torch.int32),
        bitmask_ptr=torch.zeros((0, 2), dtype=torch.int32),
        bitmask_stride=2,
        vocab_size=40,
        MASK_STRIDE=4,
        BLOCK_SIZE=8192,
    )
    assert torch.equal(logits, before)
