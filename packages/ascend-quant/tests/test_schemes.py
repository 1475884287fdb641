"""Schemes end to end on the reference device: checkpoint tensors → process_weights → apply.

Each checkpoint is quantized here with the contract's formulas (independently of the package), and each
result is compared with a float64 fake-quant computation of the same checkpoint (dequantised weights,
the same activation quantisation): the integer path must match it to fp32 rounding.
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

from vllm_ascend.quant.errors import QuantLoadError
from vllm_ascend.quant.schemes import (
    AscendLinearScheme,
    AscendMoEScheme,
    TensorSpec,
    W4A8DynamicLinear,
    W4A8DynamicMoE,
    W4A16Linear,
    W8A8DynamicLinear,
    W8A8DynamicMoE,
    W8A8Linear,
    W8A16Linear,
    get_scheme_class,
)
from vllm_ascend.quant.schemes.w8a8 import deq_scale_fp32

OUT, IN = 48, 64
PREFIX = "model.layers.0.mlp.down_proj"

# -- independent checkpoint quantizers (contract §1) ------------------------------------------------


def sym_quant(w: torch.Tensor, qmax: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row symmetric: scale = max|row| / qmax, q = round(w / scale) (int8 carrier)."""
    scale = w.abs().amax(dim=-1, keepdim=True) / qmax
    q = torch.round(w / scale).clamp(-qmax - 1, qmax).to(torch.int8)
    return q, scale


def asym_quant(w: torch.Tensor, bits: int, group_size: int) -> tuple[torch.Tensor, ...]:
    """Per-row (group_size 0) or per-group asymmetric: returns (q int8, scale [out, G], offset [out, G])."""
    qmin, qmax = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    out, inp = w.shape
    g = group_size or inp
    wg = w.reshape(out, inp // g, g)
    lo, hi = wg.amin(-1).clamp(max=0), wg.amax(-1).clamp(min=0)
    scale = (hi - lo) / (qmax - qmin)
    offset = torch.round(qmin - lo / scale).clamp(qmin, qmax)
    q = (torch.round(wg / scale[..., None]) + offset[..., None]).clamp(qmin, qmax).to(torch.int8)
    return q.reshape(out, inp), scale, offset


def dyn_quant(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token symmetric int8 in fp32 (zero row → scale 0, q 0)."""
    x = x.float()
    s = x.abs().amax(dim=-1, keepdim=True) / 127
    q = torch.where(s > 0, torch.round(x / torch.where(s > 0, s, 1)), 0).clamp(-127, 127)
    return q, s


def layer_of(tensors: dict[str, torch.Tensor], **attrs: object) -> torch.nn.Module:
    """A layer-like module holding ``tensors`` as frozen params (what vLLM's loader leaves behind)."""
    layer = torch.nn.Module()
    for name, t in tensors.items():
        layer.register_parameter(name, torch.nn.Parameter(t.clone(), requires_grad=False))
    for name, value in attrs.items():
        setattr(layer, name, value)
    return layer


def dynamic_ckpt(w: torch.Tensor, qmax: int) -> dict[str, torch.Tensor]:
    q, s = sym_quant(w, qmax)
    return {"weight": q, "weight_scale": s, "weight_offset": torch.zeros_like(s)}


def weight_only_ckpt(w: torch.Tensor, bits: int, group_size: int) -> dict[str, torch.Tensor]:
    q, s, o = asym_quant(w, bits, group_size)
    return {"weight": q, "weight_scale": s, "weight_offset": o}


def static_ckpt(w: torch.Tensor, calib: torch.Tensor) -> dict[str, torch.Tensor]:
    """W8A8: asymmetric per-tensor activation calibration, symmetric int8 weight, folded deq_scale/quant_bias."""
    lo, hi = min(float(calib.min()), 0.0), max(float(calib.max()), 0.0)
    in_scale = torch.tensor([(hi - lo) / 255], dtype=torch.float32)
    in_offset = torch.round(-128 - lo / in_scale).clamp(-128, 127)
    q, ws = sym_quant(w, 127)
    return {
        "weight": q,
        "input_scale": in_scale,
        "input_offset": in_offset,
        "weight_scale": ws,
        "weight_offset": torch.zeros_like(ws),
        "deq_scale": (in_scale * ws.reshape(-1)).float(),
        "quant_bias": (-in_offset.long() * q.long().sum(dim=1)).to(torch.int32),
    }


def dequant(ckpt: dict[str, torch.Tensor]) -> torch.Tensor:
    """float64 ``(q - offset) * scale`` with per-group blocks along the input dim."""
    q, s, o = ckpt["weight"].double(), ckpt["weight_scale"].double(), ckpt["weight_offset"].double()
    g = q.shape[1] // s.shape[1]
    return (q - o.repeat_interleave(g, dim=1)) * s.repeat_interleave(g, dim=1)


def build(
    cls: type[AscendLinearScheme], ckpt: dict[str, torch.Tensor], group_size: int | None = None, **attrs
):
    scheme = cls(prefix=PREFIX, group_size=group_size, params_dtype=torch.float32)
    layer = layer_of(ckpt, **attrs)
    scheme.process_weights(layer)
    return scheme, layer


def param_bytes(layer: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in layer.parameters())


# -- linear schemes: numerics, layout, memory -------------------------------------------------------


@pytest.mark.parametrize(("cls", "qmax"), [(W8A8DynamicLinear, 127), (W4A8DynamicLinear, 7)])
def test_dynamic_linear_matches_fake_quant(adaptor, cls, qmax):
    torch.manual_seed(0)
    w, x, bias = torch.randn(OUT, IN), torch.randn(3, 5, IN), torch.randn(OUT)
    x[0, 1] = 0  # an all-zero token: scale 0, output = bias
    ckpt = dynamic_ckpt(w, qmax)
    scheme, layer = build(cls, ckpt)
    out = scheme.apply(layer, x, bias)
    assert out.shape == (3, 5, OUT) and out.dtype == torch.float32
    xq, xs = dyn_quant(x.reshape(-1, IN))
    expected = (xq.double() @ dequant(ckpt).t()) * xs.double() + bias.double()
    torch.testing.assert_close(out.reshape(-1, OUT).double(), expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out[0, 1], bias)
    assert dict(adaptor.call_counts) == {
        "cast_weight_format": 1,
        "dynamic_quant": 1,
        "quant_matmul": 1,
    }
    rel = (out.double() - (x.double() @ w.double().t() + bias.double())).norm() / out.double().norm()
    assert rel < (0.02 if qmax == 127 else 0.25), rel  # the quantization error of the scheme itself


def test_dynamic_linear_runtime_layout_and_memory(adaptor):
    torch.manual_seed(1)
    w = torch.randn(OUT, IN)
    _, l8 = build(W8A8DynamicLinear, dynamic_ckpt(w, 127))
    assert l8.weight.dtype == torch.int8 and l8.weight.shape == (IN, OUT)
    assert l8.weight_scale.dtype == torch.float32 and l8.weight_scale.shape == (OUT,)
    assert not hasattr(l8, "weight_offset")  # symmetric: checked, then dropped
    assert all(isinstance(p, torch.nn.Parameter) and not p.requires_grad for p in l8.parameters())
    assert l8.weight.numel() * l8.weight.element_size() == OUT * IN  # one byte per weight
    _, l4 = build(W4A8DynamicLinear, dynamic_ckpt(w, 7))
    assert l4.weight.dtype == torch.int32 and l4.weight.shape == (IN, OUT // 8)
    assert l4.weight.numel() * l4.weight.element_size() * 8 == w.numel() * w.element_size()  # 1/8 of fp32
    assert param_bytes(l4) == OUT * IN // 2 + OUT * 4


def test_dynamic_linear_keeps_bf16_activations(adaptor):
    torch.manual_seed(2)
    w, x = torch.randn(OUT, IN), torch.randn(4, IN, dtype=torch.bfloat16)
    ckpt = dynamic_ckpt(w, 127)
    scheme, layer = build(W8A8DynamicLinear, ckpt)
    out = scheme.apply(layer, x)
    assert out.dtype == torch.bfloat16
    xq, xs = dyn_quant(x)
    expected = (xq.double() @ dequant(ckpt).t()) * xs.double()
    torch.testing.assert_close(out.double(), expected, rtol=8e-3, atol=1e-2)  # bf16 output rounding


@pytest.mark.parametrize(
    ("cls", "bits", "group_size"),
    [(W8A16Linear, 8, None), (W8A16Linear, 8, 16), (W4A16Linear, 4, 0), (W4A16Linear, 4, 32)],
    ids=["w8a16-channel", "w8a16-group16", "w4a16-channel", "w4a16-group32"],
)
def test_weight_only_linear_matches_fake_quant(adaptor, cls, bits, group_size):
    torch.manual_seed(3)
    w, x, bias = torch.randn(OUT, IN), torch.randn(2, 7, IN), torch.randn(OUT)
    ckpt = weight_only_ckpt(w, bits, group_size or 0)
    assert bool((ckpt["weight_offset"] != 0).any())  # asymmetric: the zero points matter
    scheme, layer = build(cls, ckpt, group_size)
    out = scheme.apply(layer, x, bias)
    expected = x.reshape(-1, IN).double() @ dequant(ckpt).t() + bias.double()
    torch.testing.assert_close(out.reshape(-1, OUT).double(), expected, rtol=1e-5, atol=1e-4)
    assert dict(adaptor.call_counts) == {"cast_weight_format": 1, "weight_quant_matmul": 1}
    groups = IN // group_size if group_size else None
    assert layer.weight_scale.shape == ((groups, OUT) if groups else (OUT,))
    assert layer.antiquant_offset.shape == layer.weight_scale.shape
    if bits == 4:
        assert layer.weight.dtype == torch.int32 and layer.weight.shape == (IN, OUT // 8)
        assert layer.weight.numel() * 4 * 8 == w.numel() * 4
    else:
        assert layer.weight.dtype == torch.int8 and layer.weight.shape == (IN, OUT)
    rel = (out.double() - (x.double() @ w.double().t() + bias.double())).norm() / out.double().norm()
    assert rel < (0.02 if bits == 8 else 0.2), rel


def test_w8a8_static_matches_fake_quant_with_fused_shards(adaptor):
    torch.manual_seed(4)
    w, calib, bias = torch.randn(OUT, IN), torch.randn(32, IN) * 2 + 0.5, torch.randn(OUT)
    ckpt = static_ckpt(w, calib)
    assert float(ckpt["input_offset"]) != 0  # asymmetric activations: quant_bias carries the offset
    fused = dict(ckpt, input_scale=ckpt["input_scale"].repeat(3), input_offset=ckpt["input_offset"].repeat(3))
    scheme, layer = build(W8A8Linear, fused)
    x = torch.randn(6, IN) * 2 + 0.5
    x[0, 0] = 1e4  # clamps at 127
    out = scheme.apply(layer, x, bias)
    xq = (torch.round(x / ckpt["input_scale"]) + ckpt["input_offset"]).clamp(-128, 127)
    acc = xq.double() @ ckpt["weight"].double().t() + ckpt["quant_bias"].double()
    expected = acc * ckpt["deq_scale"].double() + bias.double()
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)
    # the folded form equals the dequantised weight applied to the dequantised activation
    x_deq = (xq.double() - ckpt["input_offset"].double()) * ckpt["input_scale"].double()
    torch.testing.assert_close(out.double(), x_deq @ dequant(ckpt).t() + bias.double(), rtol=1e-4, atol=1e-4)
    assert dict(adaptor.call_counts) == {"cast_weight_format": 1, "quantize": 1, "quant_matmul": 1}
    assert {n: (tuple(p.shape), p.dtype) for n, p in layer.named_parameters()} == {
        "weight": ((IN, OUT), torch.int8),
        "input_scale": ((1,), torch.float32),
        "input_offset": ((1,), torch.float32),
        "deq_scale": ((OUT,), torch.float32),
        "quant_bias": ((OUT,), torch.int32),
    }
    assert scheme.apply(layer, x).dtype == torch.float32
    out_bf16 = scheme.apply(layer, x.bfloat16())
    xq16 = (torch.round(x.bfloat16().float() / ckpt["input_scale"]) + ckpt["input_offset"]).clamp(-128, 127)
    acc16 = xq16.double() @ ckpt["weight"].double().t() + ckpt["quant_bias"].double()
    assert out_bf16.dtype == torch.bfloat16
    torch.testing.assert_close(out_bf16.double(), acc16 * ckpt["deq_scale"].double(), rtol=8e-3, atol=1e-2)


def test_w8a8_int64_deq_scale_is_float32_bits(adaptor):
    torch.manual_seed(5)
    ckpt = static_ckpt(torch.randn(OUT, IN), torch.randn(16, IN))
    bits = ckpt["deq_scale"].view(torch.int32).long() & 0xFFFFFFFF
    as_int64 = dict(ckpt, deq_scale=bits | (1 << 40))  # high bits are ignored
    _, layer = build(W8A8Linear, as_int64)
    assert layer.deq_scale.dtype == torch.float32
    assert torch.equal(layer.deq_scale, ckpt["deq_scale"])
    values = torch.tensor([-1.5, 2.0**-20, -0.0, 3.25e5], dtype=torch.float32)
    as_bits = values.view(torch.int32).long() & 0xFFFFFFFF  # sign bit set for the negatives
    assert torch.equal(deq_scale_fp32(as_bits).view(torch.int32), values.view(torch.int32))


# -- MoE schemes ------------------------------------------------------------------------------------

E, H, INTER, K = 4, 32, 24, 2


def moe_ckpt(qmax: int) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(checkpoint tensors, float weights) of E experts, w13 = [gate; up]."""
    floats = {"w13": torch.randn(E, 2 * INTER, H), "w2": torch.randn(E, H, INTER)}
    ckpt: dict[str, torch.Tensor] = {}
    for name, w in floats.items():
        q, s = sym_quant(w, qmax)
        ckpt |= {f"{name}_weight": q, f"{name}_weight_scale": s, f"{name}_weight_offset": torch.zeros_like(s)}
    return ckpt, floats


def moe_fake_quant(ckpt, x, topk_weights, topk_ids) -> torch.Tensor:
    """Per token, per chosen expert: int8 x → gate/up → silu*up (fp32) → int8 → down; weighted sum."""
    w13 = ckpt["w13_weight"].double() * ckpt["w13_weight_scale"].double()
    w2 = ckpt["w2_weight"].double() * ckpt["w2_weight_scale"].double()
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        xq, xs = dyn_quant(x[t : t + 1])
        for j in range(topk_ids.shape[1]):
            e = int(topk_ids[t, j])
            gu = ((xq.double() @ w13[e].t()) * xs.double()).float()
            h = F.silu(gu[:, :INTER]) * gu[:, INTER:]
            hq, hs = dyn_quant(h)
            out[t] += float(topk_weights[t, j]) * ((hq.double() @ w2[e].t()) * hs.double())[0]
    return out


@pytest.mark.parametrize(("cls", "qmax"), [(W8A8DynamicMoE, 127), (W4A8DynamicMoE, 7)])
def test_moe_matches_per_token_loop(adaptor, cls, qmax):
    torch.manual_seed(6)
    ckpt, _ = moe_ckpt(qmax)
    scheme = cls(prefix="model.layers.1.mlp.experts", group_size=None, params_dtype=torch.float32)
    layer = layer_of(ckpt)
    scheme.process_weights(layer)
    x = torch.randn(9, H)
    topk_ids = torch.stack([torch.randperm(E)[:K] for _ in range(9)]).to(torch.int32)
    topk_ids[:, 0] = torch.arange(9) % 3  # expert 3 gets fewer tokens, never more than allowed
    topk_ids[:, 1] = torch.where(topk_ids[:, 1] == topk_ids[:, 0], 3, topk_ids[:, 1])
    topk_weights = torch.softmax(torch.randn(9, K), dim=-1)
    out = scheme.apply(layer, x, topk_weights, topk_ids)
    assert out.shape == (9, H) and out.dtype == torch.float32
    expected = moe_fake_quant(ckpt, x, topk_weights, topk_ids)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)
    for op in ("moe_init_routing", "dynamic_quant", "grouped_matmul_swiglu_quant", "grouped_quant_matmul"):
        assert adaptor.call_counts[op] == 1, op
    assert adaptor.call_counts["moe_finalize_routing"] == 1
    out_bf16 = scheme.apply(layer, x.bfloat16(), topk_weights, topk_ids)
    assert out_bf16.dtype == torch.bfloat16


def test_moe_runtime_layout_memory_and_expert_tensors(adaptor):
    torch.manual_seed(7)
    ckpt, floats = moe_ckpt(7)
    scheme = W4A8DynamicMoE(prefix="m.experts", group_size=0, params_dtype=torch.bfloat16)
    layer = layer_of(ckpt)
    scheme.process_weights(layer)
    shapes = {n: (tuple(p.shape), p.dtype) for n, p in layer.named_parameters()}
    assert shapes == {
        "w13_weight": ((E, H, 2 * INTER // 8), torch.int32),
        "w13_weight_scale": ((E, 2 * INTER), torch.float32),
        "w2_weight": ((E, INTER, H // 8), torch.int32),
        "w2_weight_scale": ((E, H), torch.float32),
    }
    float_bytes = sum(w.numel() * 4 for w in floats.values())
    weight_bytes = sum(layer.get_parameter(n).numel() * 4 for n in ("w13_weight", "w2_weight"))
    assert weight_bytes * 8 == float_bytes
    tensors = scheme.expert_tensors(layer)
    assert [t.shape[0] for t in tensors] == [E] * 4
    assert tensors[0] is layer.w13_weight and tensors[3] is layer.w2_weight_scale
    s8 = W8A8DynamicMoE(prefix="m.experts", group_size=None, params_dtype=torch.float32)
    l8 = layer_of(moe_ckpt(127)[0])
    s8.process_weights(l8)
    assert l8.w13_weight.dtype == torch.int8 and l8.w13_weight.shape == (E, H, 2 * INTER)
    assert l8.w2_weight.shape == (E, INTER, H)


# -- specs and registry -----------------------------------------------------------------------------


def test_weight_specs_per_contract():
    def specs(scheme, *sizes):
        return {k: (v.shape, v.dtype, v.kind) for k, v in scheme.weight_specs(*sizes).items()}

    f32, i8 = torch.float32, torch.int8
    kw = {"prefix": PREFIX, "params_dtype": torch.bfloat16}
    dyn = {"weight": ((8, 16), i8, "weight"), "weight_scale": ((8, 1), f32, "channel")}
    dyn["weight_offset"] = ((8, 1), f32, "channel")
    assert specs(W8A8DynamicLinear(group_size=None, **kw), 8, 16) == dyn
    assert specs(W4A8DynamicLinear(group_size=0, **kw), 8, 16) == dyn
    assert specs(W8A16Linear(group_size=None, **kw), 8, 16) == dyn
    grouped = dict(dyn, weight_scale=((8, 4), f32, "group"), weight_offset=((8, 4), f32, "group"))
    assert specs(W4A16Linear(group_size=4, **kw), 8, 16) == grouped
    assert specs(W8A8Linear(group_size=None, **kw), 8, 16) == dict(
        dyn,
        input_scale=((1,), f32, "tensor"),
        input_offset=((1,), f32, "tensor"),
        deq_scale=((8,), f32, "channel"),
        quant_bias=((8,), torch.int32, "channel"),
    )
    assert specs(W8A8DynamicMoE(group_size=None, **kw), 2, 8, 4) == {
        "w13_weight": ((2, 8, 8), i8, "expert_weight"),
        "w2_weight": ((2, 8, 4), i8, "expert_weight"),
        "w13_weight_scale": ((2, 8, 1), f32, "expert_channel"),
        "w13_weight_offset": ((2, 8, 1), f32, "expert_channel"),
        "w2_weight_scale": ((2, 8, 1), f32, "expert_channel"),
        "w2_weight_offset": ((2, 8, 1), f32, "expert_channel"),
    }
    with pytest.raises(
        QuantLoadError, match=rf"layer '{PREFIX}' \(W8A16\): input_size must be a positive integer"
    ):
        W8A16Linear(group_size=None, **kw).weight_specs(8, 0)
    with pytest.raises(
        ValueError, match=r"TensorSpec\.kind='row' is invalid; allowed values: weight, channel"
    ):
        TensorSpec((1,), None, "row")


def test_registry():
    assert get_scheme_class("W8A8", "linear") is W8A8Linear
    assert get_scheme_class("W4A16", "linear") is W4A16Linear
    assert get_scheme_class("W4A8_DYNAMIC", "moe") is W4A8DynamicMoE
    assert issubclass(get_scheme_class("W8A8_DYNAMIC", "moe"), AscendMoEScheme)
    from vllm_ascend.quant.schemes import UnsupportedQuantType, register_scheme

    with pytest.raises(UnsupportedQuantType) as info:
        get_scheme_class("W4A16", "moe")
    assert isinstance(info.value, KeyError) and isinstance(info.value, ValueError)
    assert str(info.value) == (
        "quant type 'W4A16' has no moe scheme in vllm-ascend-quant; implemented moe types: W4A8_DYNAMIC, W8A8_DYNAMIC"
    )
    with pytest.raises(
        UnsupportedQuantType, match="implemented linear types: W4A16, W4A8_DYNAMIC, W8A16, W8A8,"
    ):
        get_scheme_class("W4A4_DYNAMIC", "linear")
    with pytest.raises(ValueError, match="layer_type='attention' is invalid; allowed values: linear, moe"):
        get_scheme_class("W8A8", "attention")
    with pytest.raises(ValueError, match=r"linear scheme 'W8A8' is already registered \(W8A8Linear\)"):
        register_scheme("W8A8", "linear")(W8A16Linear)
    with pytest.raises(TypeError, match="a moe scheme must subclass AscendMoEScheme, got W8A16Linear"):
        register_scheme("W9", "moe")(W8A16Linear)


# -- malformed checkpoints: every error names the layer, the tensor and the expectation --------------


def _dyn(qmax=127, **changes):
    torch.manual_seed(8)
    return dict(dynamic_ckpt(torch.randn(OUT, IN), qmax), **changes)


def _w16(bits=8, group_size=0, **changes):
    torch.manual_seed(9)
    return dict(weight_only_ckpt(torch.randn(OUT, IN), bits, group_size), **changes)


def _static(**changes):
    torch.manual_seed(10)
    return dict(static_ckpt(torch.randn(OUT, IN), torch.randn(8, IN)), **changes)


def _drop(ckpt, name):
    return {k: v for k, v in ckpt.items() if k != name}


P = re.escape(PREFIX)
BAD_LINEAR = [
    (
        W8A8DynamicLinear,
        _drop(_dyn(), "weight_scale"),
        None,
        rf"{P}\.weight_scale \(W8A8_DYNAMIC linear\): "
        r"expected a tensor loaded from the checkpoint, got none",
    ),
    (
        W8A8DynamicLinear,
        _dyn(weight=torch.randn(OUT, IN)),
        None,
        rf"{P}\.weight \(W8A8_DYNAMIC linear\): expected dtype torch\.int8, got torch\.float32 \(48, 64\)",
    ),
    (
        W8A8DynamicLinear,
        _dyn(weight=torch.zeros(OUT, IN, 2, dtype=torch.int8)),
        None,
        rf"{P}\.weight .*: expected a 2-D \[out, in\] tensor, got torch\.int8 \(48, 64, 2\)",
    ),
    (
        W8A8DynamicLinear,
        _dyn(weight_scale=torch.rand(OUT)),
        None,
        rf"{P}\.weight_scale .*: expected shape \(48, 1\) \(channel\), got torch\.float32 \(48,\)",
    ),
    (
        W8A8DynamicLinear,
        _dyn(weight_scale=torch.ones(OUT, 1, dtype=torch.int32)),
        None,
        r"weight_scale .*: expected dtype a floating-point dtype, got torch\.int32",
    ),
    (
        W8A8DynamicLinear,
        _dyn(weight_offset=torch.full((OUT, 1), 3.0)),
        None,
        r"weight_offset \(W8A8_DYNAMIC linear\): expected all zeros \(this scheme is symmetric\), got max \|offset\| = 3\.0",
    ),
    (
        W8A8DynamicLinear,
        _dyn(weight_scale=torch.full((OUT, 1), float("nan"))),
        None,
        r"weight_scale .*: expected finite values, got 48 NaN/inf value\(s\)",
    ),
    (
        W4A8DynamicLinear,
        _dyn(7, weight=torch.full((OUT, IN), -9, dtype=torch.int8)),
        None,
        rf"{P}\.weight \(W4A8_DYNAMIC linear\): expected quantized values in \[-8, 7\], got values in \[-9, -9\]",
    ),
    (
        W4A8DynamicLinear,
        {k: v[:44] for k, v in _dyn(7).items()},
        None,
        r"weight .*: expected an output dimension divisible by 8 to pack int4 into int32, got 44",
    ),
    (
        W8A16Linear,
        _w16(group_size=16),
        24,
        rf"{P}\.weight \(W8A16 linear\): expected input features divisible by group_size=24 \(per-group scales\), got 64",
    ),
    (
        W8A16Linear,
        _w16(group_size=16),
        None,
        r"weight_scale \(W8A16 linear\): expected shape \(48, 1\) \(channel\), got torch\.float32 \(48, 4\)",
    ),
    (
        W8A16Linear,
        _w16(weight_offset=torch.full((OUT, 1), 0.5)),
        None,
        r"weight_offset \(W8A16 linear\): expected integer values, got non-integer value 0\.5",
    ),
    (
        W4A16Linear,
        _w16(4, weight_offset=torch.full((OUT, 1), 8.0)),
        None,
        r"weight_offset \(W4A16 linear\): expected integer values in \[-8, 7\], got values in \[8, 8\]",
    ),
    (
        W4A16Linear,
        _w16(4, weight=torch.full((OUT, IN), 100, dtype=torch.int8)),
        None,
        r"weight \(W4A16 linear\): expected quantized values in \[-8, 7\], got values in \[100, 100\]",
    ),
    (
        W8A8Linear,
        _static(input_offset=torch.tensor([2.5])),
        None,
        r"input_offset \(W8A8 linear\): expected integer values, got non-integer value 2\.5",
    ),
    (
        W8A8Linear,
        _static(input_offset=torch.tensor([-129.0])),
        None,
        r"input_offset \(W8A8 linear\): expected integer values in \[-128, 127\], got values in \[-129, -129\]",
    ),
    (
        W8A8Linear,
        _static(input_scale=torch.tensor([0.0])),
        None,
        r"input_scale \(W8A8 linear\): expected a positive scale, got 0\.0",
    ),
    (
        W8A8Linear,
        _static(input_scale=torch.tensor([], dtype=torch.float32)),
        None,
        r"input_scale .*: expected one value per fused shard \(shape \[1\] or \[shards\]\), got torch\.float32 \(0,\)",
    ),
    (
        W8A8Linear,
        _static(quant_bias=torch.zeros(OUT)),
        None,
        r"quant_bias \(W8A8 linear\): expected dtype torch\.int32, got torch\.float32 \(48,\)",
    ),
    (
        W8A8Linear,
        _static(deq_scale=torch.full((OUT,), float("inf"))),
        None,
        r"deq_scale .*: expected finite values, got 48 NaN/inf value\(s\)",
    ),
    (
        W8A8Linear,
        _static(weight_offset=torch.ones(OUT, 1)),
        None,
        r"weight_offset \(W8A8 linear\): expected all zeros",
    ),
]


@pytest.mark.parametrize(("cls", "ckpt", "group_size", "message"), BAD_LINEAR, ids=range(len(BAD_LINEAR)))
def test_malformed_linear_checkpoints(adaptor, cls, ckpt, group_size, message):
    layer = layer_of(ckpt)
    before = {n: p.data_ptr() for n, p in layer.named_parameters()}
    with pytest.raises(QuantLoadError, match=message):
        cls(prefix=PREFIX, group_size=group_size, params_dtype=torch.float32).process_weights(layer)
    assert {n: p.data_ptr() for n, p in layer.named_parameters()} == before  # nothing replaced on failure


def test_fused_shards_must_share_the_activation_scale(adaptor):
    ckpt = _static(input_scale=torch.tensor([0.5, 0.25, 0.5]))
    with pytest.raises(
        QuantLoadError,
        match=r"qkv_proj\.input_scale \(W8A8 linear\): expected one value shared by every fused shard, "
        r"got different values \(q_proj=0\.5, k_proj=0\.25, v_proj=0\.5\)",
    ):
        W8A8Linear(prefix="m.qkv_proj", group_size=None, params_dtype=torch.float32).process_weights(
            layer_of(ckpt, shard_names=("q_proj", "k_proj", "v_proj"))
        )
    ckpt = _static(input_offset=torch.tensor([3.0, 4.0]))
    with pytest.raises(QuantLoadError, match=r"input_offset .*got different values \(0=3, 1=4\)"):
        W8A8Linear(prefix="m.gate_up_proj", group_size=None, params_dtype=torch.float32).process_weights(
            layer_of(ckpt)
        )


def test_bad_construction_arguments():
    with pytest.raises(
        QuantLoadError,
        match=r"layer 'm\.experts': W4A8_DYNAMIC with group_size=32 \(per-group int4 weights\) is not supported; "
        r"supported: per-channel W4A8_DYNAMIC \(group_size 0 or absent\)",
    ):
        W4A8DynamicMoE(prefix="m.experts", group_size=32, params_dtype=torch.float32)
    with pytest.raises(QuantLoadError, match=r"layer 'm\.o_proj': W4A8_DYNAMIC with group_size=128"):
        W4A8DynamicLinear(prefix="m.o_proj", group_size=128, params_dtype=torch.float32)
    with pytest.raises(
        QuantLoadError,
        match=r"layer 'm\.o_proj' \(W8A16\): group_size must be an integer >= 0 or absent, got -1",
    ):
        W8A16Linear(prefix="m.o_proj", group_size=-1, params_dtype=torch.float32)


BAD_MOE = [
    (
        {"w13_weight": torch.zeros(E, 2 * INTER, dtype=torch.int8)},
        r"w13_weight \(W8A8_DYNAMIC moe\): expected a 3-D \[experts, 2 \* intermediate, hidden\] tensor",
    ),
    (
        {"w2_weight": torch.zeros(E, INTER, H, dtype=torch.int8)},
        r"w2_weight .*: expected shape \(4, 32, 24\) \(expert_weight\), got torch\.int8 \(4, 24, 32\)",
    ),
    ({"w2_weight_offset": torch.ones(E, H, 1)}, r"m\.experts\.w2_weight_offset .*: expected all zeros"),
    (
        {"w13_weight_scale": torch.ones(E, 2 * INTER, 1, dtype=torch.float16) * float("inf")},
        r"w13_weight_scale .*: expected finite values",
    ),
]


@pytest.mark.parametrize(("changes", "message"), BAD_MOE, ids=range(len(BAD_MOE)))
def test_malformed_moe_checkpoints(adaptor, changes, message):
    torch.manual_seed(11)
    ckpt = dict(moe_ckpt(127)[0], **changes)
    with pytest.raises(QuantLoadError, match=message):
        W8A8DynamicMoE(prefix="m.experts", group_size=None, params_dtype=torch.float32).process_weights(
            layer_of(ckpt)
        )


def test_malformed_int4_moe_checkpoints(adaptor):
    torch.manual_seed(12)
    ckpt = moe_ckpt(7)[0]
    scheme = W4A8DynamicMoE(prefix="m.experts", group_size=None, params_dtype=torch.float32)
    with pytest.raises(
        QuantLoadError, match=r"m\.experts\.w13_weight \(W4A8_DYNAMIC moe\): expected quantized values"
    ):
        scheme.process_weights(layer_of(dict(ckpt, w13_weight=ckpt["w13_weight"] * 2)))
    with pytest.raises(QuantLoadError, match=r"w2_weight .*: expected an output dimension divisible by 8"):
        scheme.process_weights(
            layer_of(
                {
                    k: v[:, :20] if k.startswith("w2") else v[..., :20] if k == "w13_weight" else v
                    for k, v in ckpt.items()
                }
            )
        )
    with pytest.raises(QuantLoadError, match=r"m\.experts\.w2_weight_scale .*expected a tensor loaded"):
        scheme.process_weights(layer_of(_drop(ckpt, "w2_weight_scale")))


def test_weights_take_the_profiles_weight_format(adaptor, monkeypatch):
    import dataclasses

    from vllm_ascend.core.device.profile import REFERENCE_PROFILE
    from vllm_ascend.quant.schemes import base

    nz = dataclasses.replace(REFERENCE_PROFILE, quant_weight_format="NZ")
    monkeypatch.setattr(base, "get_current_hardware_profile", lambda: nz)
    seen: list[tuple[tuple[int, ...], torch.dtype, str]] = []
    original = adaptor.cast_weight_format

    def spy(weight, fmt):
        seen.append((tuple(weight.shape), weight.dtype, fmt))
        return original(weight, fmt)

    monkeypatch.setattr(adaptor, "cast_weight_format", spy)
    torch.manual_seed(13)
    build(W4A16Linear, weight_only_ckpt(torch.randn(OUT, IN), 4, 16), 16)
    W8A8DynamicMoE(prefix="m.experts", group_size=None, params_dtype=torch.float32).process_weights(
        layer_of(moe_ckpt(127)[0])
    )
    assert seen == [
        ((IN, OUT // 8), torch.int32, "NZ"),
        ((E, H, 2 * INTER), torch.int8, "NZ"),
        ((E, INTER, H), torch.int8, "NZ"),
    ]
