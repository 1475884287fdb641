"""ND ↔ FRACTAL_NZ conversion and 16-alignment helpers."""

from __future__ import annotations

import pytest
import torch

from vllm_ascend.core.alignment import align_down, align_up, aligned_16, is_aligned, pad_to_alignment
from vllm_ascend.core.layout import nd_to_nz, nz_block_shape, nz_shape, nz_to_nd, use_nz_weight


@pytest.mark.parametrize("shape", [(1, 1), (17, 35), (16, 16), (31, 1), (3, 33, 47), (2, 2, 5, 70), (64, 9)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.int8])
def test_nd_nz_nd_is_identity(shape, dtype):
    g = torch.Generator().manual_seed(sum(shape))
    x = torch.randint(-100, 100, shape, generator=g).to(dtype)
    nz = nd_to_nz(x)
    assert tuple(nz.shape) == nz_shape(shape, dtype)
    back = nz_to_nd(nz, shape[-2], shape[-1])
    assert back.dtype == dtype and torch.equal(back, x)


def test_block_shapes_follow_the_32_byte_vector():
    assert nz_block_shape(torch.float16) == (16, 16)
    assert nz_block_shape(torch.bfloat16) == (16, 16)
    assert nz_block_shape(torch.int8) == (16, 32)
    assert nz_block_shape(torch.float32) == (16, 8)
    assert nz_shape((5, 17, 35), torch.float16) == (5, 3, 2, 16, 16)
    assert nz_shape((17, 35), torch.int8) == (2, 2, 16, 32)


def test_element_positions_match_the_fractal_definition():
    m, n = 37, 50
    x = torch.arange(m * n, dtype=torch.float32).reshape(m, n)
    nz = nd_to_nz(x)  # fp32: m0=16, n0=8
    for i, j in [(0, 0), (15, 7), (16, 8), (36, 49), (20, 33)]:
        assert nz[j // 8, i // 16, i % 16, j % 8] == x[i, j]
    # padding is zero and outside the logical matrix
    assert nz[49 // 8, 36 // 16, 36 % 16 + 1, 49 % 8 + 1] == 0
    assert nz.is_contiguous()


def test_padding_is_zero_everywhere():
    x = torch.ones(17, 35, dtype=torch.float16)
    nz = nd_to_nz(x)
    assert nz.sum().item() == 17 * 35


def test_errors():
    with pytest.raises(ValueError, match=r"FRACTAL_NZ needs at least 2 dims \[..., M, N\], got shape \(5,\)"):
        nd_to_nz(torch.zeros(5))
    with pytest.raises(ValueError, match=r"FRACTAL_NZ does not support dtype torch\.float64"):
        nd_to_nz(torch.zeros(4, 4, dtype=torch.float64))
    nz = nd_to_nz(torch.zeros(17, 35, dtype=torch.float16))
    with pytest.raises(ValueError) as info:
        nz_to_nd(nz, 40, 35)
    assert str(info.value) == (
        "rows=40, cols=35 do not match the FRACTAL_NZ tensor (3, 2, 16, 16): it holds 17..32 rows and 33..48 cols"
    )
    with pytest.raises(ValueError, match=r"expected a FRACTAL_NZ tensor \[..., N1, M1, 16, 16\]"):
        nz_to_nd(torch.zeros(3, 2, 16, 8, dtype=torch.float16), 17, 35)


@pytest.mark.parametrize(
    ("mode", "quantized", "expected"),
    [("0", True, False), ("1", True, True), ("1", False, False), ("2", False, True)],
)
def test_nz_weight_policy_from_environment(monkeypatch, mode, quantized, expected):
    monkeypatch.setenv("VLLM_ASCEND_ENABLE_NZ", mode)
    assert use_nz_weight(quantized) is expected


def test_alignment_helpers():
    assert [align_up(n) for n in (0, 1, 15, 16, 17, 33)] == [0, 16, 16, 16, 32, 48]
    assert [align_down(n) for n in (0, 15, 16, 31, 32)] == [0, 0, 16, 16, 32]
    assert is_aligned(48) and not is_aligned(47)
    assert align_up(10, 4) == 12
    with pytest.raises(ValueError, match="alignment must be a positive integer, got 0"):
        align_up(3, 0)
    with pytest.raises(ValueError, match="size must be a non-negative integer, got -1"):
        align_up(-1)


def test_aligned_16_and_pad_to_alignment():
    x = torch.arange(20.0).reshape(5, 4)
    a = aligned_16(x)
    assert a.shape == (16, 4) and torch.equal(a[:5], x) and a[5:].abs().sum() == 0
    b = pad_to_alignment(x, (0, 1), 8)
    assert b.shape == (8, 8) and torch.equal(b[:5, :4], x)
    assert pad_to_alignment(torch.ones(17, 3), (0, -1)).shape == (32, 16)
    same = torch.zeros(16, 32)
    assert pad_to_alignment(same, (0, 1)) is same
    with pytest.raises(ValueError, match="dim 2 is out of range for a 2-d tensor"):
        pad_to_alignment(x, (2,))
