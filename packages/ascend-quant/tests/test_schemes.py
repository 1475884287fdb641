"""W8A8_DYNAMIC linear scheme: exact integer path, accuracy against float, and input checks."""

from __future__ import annotations

import pytest
import torch

from vllm_ascend.quant.schemes import W8A8DynamicLinear, get_scheme, quantize_per_token


def test_quantize_per_token_round_trip_and_range():
    x = torch.tensor([[1.0, -2.0, 0.5], [0.0, 0.0, 0.0], [127.0, 63.5, -127.0]])
    q, scale = quantize_per_token(x)
    assert q.dtype == torch.int8 and scale.shape == (3, 1)
    assert q[0].tolist() == [64, -127, 32]
    assert q[1].tolist() == [0, 0, 0]
    assert q[2].tolist() == [127, 64, -127]
    assert torch.allclose(scale[:, 0], torch.tensor([2 / 127, torch.finfo(torch.float32).tiny / 127, 1.0]))


def test_apply_matches_integer_reference_exactly():
    torch.manual_seed(0)
    x = torch.randn(2, 5, 64)
    params = W8A8DynamicLinear.quantize_weight(torch.randn(48, 64))
    params["weight_offset"] = torch.randint(-3, 4, (48, 1)).float()
    bias = torch.randn(48)
    out = W8A8DynamicLinear.apply(x, **params, bias=bias)
    assert out.shape == (2, 5, 48) and out.dtype == torch.float32

    xq, xs = quantize_per_token(x.reshape(-1, 64))
    expected = torch.empty(10, 48, dtype=torch.float64)
    for i in range(10):
        for j in range(48):
            w = params["weight"][j].long() - int(params["weight_offset"][j])
            acc = int((xq[i].long() * w).sum())
            expected[i, j] = acc * float(xs[i]) * float(params["weight_scale"][j]) + float(bias[j])
    torch.testing.assert_close(out.reshape(10, 48).double(), expected, rtol=1e-6, atol=1e-5)


def test_apply_is_close_to_float_linear():
    torch.manual_seed(1)
    x = torch.randn(16, 256, dtype=torch.bfloat16)
    w = torch.randn(128, 256)
    out = W8A8DynamicLinear.apply(x, **W8A8DynamicLinear.quantize_weight(w))
    ref = x.float() @ w.t()
    assert out.dtype == torch.bfloat16
    rel = (out.float() - ref).norm() / ref.norm()
    assert rel < 0.02, rel


def test_weight_specs_and_checks():
    specs = W8A8DynamicLinear.weight_specs(8, 4)
    assert {k: (v.shape, v.dtype) for k, v in specs.items()} == {
        "weight": ((8, 4), torch.int8),
        "weight_scale": ((8, 1), torch.float32),
        "weight_offset": ((8, 1), torch.float32),
    }
    with pytest.raises(ValueError, match="output_size and input_size must be positive, got 0, 4"):
        W8A8DynamicLinear.weight_specs(0, 4)
    p = W8A8DynamicLinear.quantize_weight(torch.randn(8, 4))
    with pytest.raises(ValueError, match=r"weight must be a 2-D int8 tensor, got \(8, 4\) torch.float32"):
        W8A8DynamicLinear.apply(torch.randn(2, 4), p["weight"].float(), p["weight_scale"], p["weight_offset"])
    with pytest.raises(
        ValueError, match=r"weight_scale must hold one value per output channel \(8\), got shape \(7,\)"
    ):
        W8A8DynamicLinear.apply(torch.randn(2, 4), p["weight"], p["weight_scale"][:7, 0], p["weight_offset"])
    with pytest.raises(ValueError, match="weight_offset must hold integer values"):
        W8A8DynamicLinear.apply(torch.randn(2, 4), p["weight"], p["weight_scale"], p["weight_offset"] + 0.5)
    with pytest.raises(ValueError, match="input has 5 features, weight expects 4"):
        W8A8DynamicLinear.apply(torch.randn(2, 5), **p)
    with pytest.raises(TypeError, match=r"activations must be floating point, got torch\.int64"):
        W8A8DynamicLinear.apply(torch.ones(2, 4, dtype=torch.long), **p)
    with pytest.raises(ValueError, match=r"weight must be a 2-D floating-point tensor, got \(4,\)"):
        W8A8DynamicLinear.quantize_weight(torch.randn(4))


def test_get_scheme():
    assert get_scheme("linear:W8A8_DYNAMIC") is W8A8DynamicLinear
    with pytest.raises(
        KeyError,
        match="scheme 'moe:W4A8_DYNAMIC' has no implementation in vllm-ascend-quant; "
        "implemented: linear:W8A8_DYNAMIC",
    ):
        get_scheme("moe:W4A8_DYNAMIC")
