"""``triton_q_rms`` (interpreted) against its torch reference, and its tile-size variants."""

from __future__ import annotations

import pytest
import torch

import vllm_ascend.kernels as K
from vllm_ascend.kernels import rms_norm
from vllm_ascend.kernels._triton import rms_norm as rms_triton


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(3, 64), (37, 2, 96), (200, 40)])
def test_q_rms_matches_reference(gen, close_ulp, dtype, shape):
    """3, 74 and 200 rows over 4 interpreter programs: BLOCK_M 1, 16 and 16 with leftover rows;
    96 and 40 columns: padded to 128 and 64."""
    x = (torch.randn(shape, generator=gen) * 4).to(dtype)
    got = K.triton_q_rms(x, 1e-5)
    assert got.shape == x.shape and got.dtype == dtype
    close_ulp(got, rms_norm.triton_q_rms_torch(x, 1e-5))
    ms = got.float().square().mean(-1)
    assert torch.allclose(ms, torch.ones_like(ms), atol=0.03)


def test_q_rms_reads_strided_rows(gen, close_ulp):
    x = torch.randn(64, 10, generator=gen).t()  # [10, 64], last-dim stride 10
    got = K.triton_q_rms(x)
    assert x.stride(-1) == 10 and got.shape == (10, 64) and got.is_contiguous()
    close_ulp(got, rms_norm.triton_q_rms_torch(x))


def test_block_m_is_a_power_of_two_up_to_16():
    assert rms_triton.rms_block_m_values() == (1, 2, 4, 8, 16)
    got = {rows: rms_triton.rms_block_m(rows, 132) for rows in (1, 132, 264, 3 * 132, 16 * 132, 100_000)}
    assert got == {1: 1, 132: 1, 264: 2, 396: 2, 2112: 16, 100_000: 16}


def test_q_rms_rejects_bad_input():
    with pytest.raises(ValueError, match=r"must be a floating-point tensor, got torch\.int64"):
        K.triton_q_rms(torch.ones(2, 4, dtype=torch.int64))
    with pytest.raises(ValueError, match="eps must be >= 0, got -1"):
        K.triton_q_rms(torch.ones(2, 4), -1.0)
    with pytest.raises(ValueError, match=r"non-empty last dimension, got shape \(2, 0\)"):
        K.triton_q_rms(torch.ones(2, 0))
