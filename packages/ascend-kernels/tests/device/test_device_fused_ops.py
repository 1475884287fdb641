"""Fused device ops: each equals its unfused op sequence bitwise; fakes and opcheck as for the other ops."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from vllm_ascend.core.device.adaptor.base import FUSED_OPS, DeviceOpError
from vllm_ascend.kernels.device.graph_ops import FUSED_TORCH_OPS, device_ops
from vllm_ascend.kernels.device.npu import A2A3DeviceAdaptor
from vllm_ascend.kernels.device.reference import ReferenceDeviceAdaptor

FLOATS = [torch.float32, torch.float16, torch.bfloat16]


def _op(name: str):
    return getattr(torch.ops.vllm_ascend, name).default


def _assert_same(got, want) -> None:
    if isinstance(want, torch.Tensor):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(got, want)
        return
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        _assert_same(g, w)


def _norm_inputs(dtype):
    torch.manual_seed(0)
    x = (torch.randn(6, 64) * 3).to(dtype)[:, :32]  # non-contiguous, like a slice of a fused projection
    return x, torch.randn(6, 32).to(dtype), torch.randn(32).to(dtype)


def test_fused_ops_are_registered_and_counted(adaptor):
    assert FUSED_TORCH_OPS == FUSED_OPS
    for name in FUSED_OPS:
        assert getattr(getattr(ReferenceDeviceAdaptor, name), "__counted__", False), name
        assert getattr(getattr(A2A3DeviceAdaptor, name), "__counted__", False), name
    x, residual, weight = _norm_inputs(torch.float32)
    device_ops().add_rms_norm_quant(x, residual, weight, 1e-6, torch.tensor([0.02]), None)
    assert adaptor.call_counts["add_rms_norm_quant"] == 1


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("offset", [None, 3.0])
def test_norm_quant_ops_equal_the_unfused_sequence(adaptor, dtype, offset):
    ops, ref = device_ops(), ReferenceDeviceAdaptor()
    x, residual, weight = _norm_inputs(dtype)
    scale = torch.tensor([0.03])
    off = None if offset is None else torch.tensor([offset])
    normed, total = ref.add_rms_norm(x, residual, weight, 1e-6)
    _assert_same(
        ops.add_rms_norm_quant(x, residual, weight, 1e-6, scale, off),
        (ref.quantize(normed, scale, off), total),
    )
    _assert_same(
        ops.rms_norm_quant(x, weight, 1e-5, scale, off),
        ref.quantize(ref.rms_norm(x, weight, 1e-5), scale, off),
    )


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("smooth", [False, True])
def test_dynamic_quant_fusions_equal_the_unfused_sequence(adaptor, dtype, smooth):
    ops, ref = device_ops(), ReferenceDeviceAdaptor()
    x, residual, weight = _norm_inputs(dtype)
    smooth_scales = torch.rand(32) + 0.5 if smooth else None
    normed, total = ref.add_rms_norm(x, residual, weight, 1e-6)
    _assert_same(
        ops.add_rms_norm_dynamic_quant(x, residual, weight, 1e-6, smooth_scales),
        (*ref.dynamic_quant(normed, smooth_scales=smooth_scales), total),
    )
    _assert_same(
        ops.rms_norm_dynamic_quant(x, weight, 1e-6, smooth_scales),
        ref.dynamic_quant(ref.rms_norm(x, weight, 1e-6), smooth_scales=smooth_scales),
    )
    gate_up = torch.randn(4, 3, 64).to(dtype).transpose(0, 1)  # non-contiguous
    _assert_same(
        ops.swiglu_dynamic_quant(gate_up, smooth_scales),
        ref.dynamic_quant(ref.swiglu(gate_up), smooth_scales=smooth_scales),
    )
    scale, offset = torch.tensor([0.01]), torch.tensor([-2.0])
    _assert_same(ops.swiglu_quant(gate_up, scale, offset), ref.quantize(ref.swiglu(gate_up), scale, offset))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("is_neox", [True, False])
def test_qk_rmsnorm_rope_equals_norm_per_head_then_rope(adaptor, dtype, is_neox):
    ops, ref = device_ops(), ReferenceDeviceAdaptor()
    torch.manual_seed(1)
    head, t = 16, 5
    qkv = torch.randn(t, (4 + 2 + 2) * head).to(dtype)
    q, k = qkv[:, : 4 * head], qkv[:, 4 * head : 6 * head]  # non-contiguous split views
    q_weight, k_weight = torch.randn(head).to(dtype), torch.randn(head).to(dtype)
    positions, cache = torch.randint(0, 32, (t,)), torch.randn(32, 8).to(dtype)
    q_normed = ref.rms_norm(q.reshape(t, 4, head), q_weight, 1e-6).reshape(t, -1)
    k_normed = ref.rms_norm(k.reshape(t, 2, head), k_weight, 1e-6).reshape(t, -1)
    want = ref.rotary_embedding(positions, q_normed, k_normed, head, cache, is_neox)
    got = ops.qk_rmsnorm_rope(positions, q, k, q_weight, k_weight, 1e-6, head, cache, is_neox)
    _assert_same(got, want)


@pytest.mark.parametrize("dtype", FLOATS)
def test_muls_add_equals_eager_mul_then_add(adaptor, dtype):
    torch.manual_seed(2)
    x, y = torch.randn(5, 7).to(dtype), torch.randn(5, 7).to(dtype)
    _assert_same(device_ops().muls_add(x, 2.5, y), x * 2.5 + y)


def test_fused_ops_refuse_bad_inputs(adaptor):
    ops = device_ops()
    with pytest.raises(DeviceOpError, match=r"muls_add needs x and y of one shape and dtype"):
        ops.muls_add(torch.randn(2, 3), 1.0, torch.randn(2, 3, dtype=torch.float16))
    with pytest.raises(
        DeviceOpError, match=r"qk_rmsnorm_rope needs \[T, heads\*16\] inputs, got shape \(2, 20\)"
    ):
        ops.qk_rmsnorm_rope(
            torch.zeros(2, dtype=torch.long),
            torch.randn(2, 20),
            torch.randn(2, 16),
            torch.ones(16),
            torch.ones(16),
            1e-6,
            16,
            torch.randn(8, 8),
            True,
        )
    with pytest.raises(DeviceOpError, match="scale must be a one-element float tensor"):
        ops.rms_norm_quant(torch.randn(2, 8), torch.ones(8), 1e-6, torch.ones(8), None)
    with FakeTensorMode() as mode:
        a, b = mode.from_tensor(torch.randn(2, 8)), mode.from_tensor(torch.randn(3, 8))
        with pytest.raises(DeviceOpError, match=r"x \(2, 8\) and residual \(3, 8\) must have the same shape"):
            _op("add_rms_norm_dynamic_quant")(a, b, mode.from_tensor(torch.ones(8)), 1e-6, None)
        with pytest.raises(DeviceOpError, match="muls_add needs x and y of one dtype"):
            _op("muls_add")(a, 1.0, mode.from_tensor(torch.randn(2, 8, dtype=torch.float16)))


def _fused_cases():
    torch.manual_seed(3)
    wide = torch.randn(6, 64, dtype=torch.float16)
    x, residual, weight = (
        wide[:, :32],
        torch.randn(6, 32, dtype=torch.float16),
        torch.randn(32, dtype=torch.float16),
    )
    scale, offset, smooth = torch.tensor([0.02]), torch.tensor([1.0]), torch.rand(32) + 0.5
    gate_up = torch.randn(4, 3, 64, dtype=torch.bfloat16).transpose(0, 1)
    qkv = torch.randn(5, 128, dtype=torch.bfloat16)
    return [
        ("add_rms_norm_quant", (x, residual, weight, 1e-6, scale, offset)),
        ("add_rms_norm_quant", (x, residual, weight, 1e-6, scale, None)),
        ("add_rms_norm_dynamic_quant", (x, residual, weight, 1e-6, None)),
        ("add_rms_norm_dynamic_quant", (x, residual, weight, 1e-6, smooth)),
        ("rms_norm_quant", (x, weight, 1e-6, scale, offset)),
        ("rms_norm_dynamic_quant", (x, weight, 1e-6, None)),
        ("swiglu_quant", (gate_up, scale, None)),
        ("swiglu_dynamic_quant", (gate_up, None)),
        (
            "qk_rmsnorm_rope",
            (
                torch.randint(0, 16, (5,)),
                qkv[:, :64],
                qkv[:, 64:96],
                torch.randn(16, dtype=torch.bfloat16),
                torch.randn(16, dtype=torch.bfloat16),
                1e-6,
                16,
                torch.randn(16, 8, dtype=torch.bfloat16),
                True,
            ),
        ),
        ("muls_add", (torch.randn(4, 8), 0.5, torch.randn(4, 8))),
    ]


def _meta(out):
    if isinstance(out, torch.Tensor):
        return (tuple(out.shape), out.dtype, tuple(out.stride()))
    return [_meta(o) for o in out]


@pytest.mark.parametrize(("name", "args"), _fused_cases(), ids=lambda v: v if isinstance(v, str) else "")
def test_fused_fake_gives_the_real_output_metadata(adaptor, name, args):
    real = _op(name)(*args)
    with FakeTensorMode(allow_non_fake_inputs=False) as mode:
        fake = _op(name)(*[mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args])
    assert _meta(fake) == _meta(real)


@pytest.mark.parametrize(("name", "args"), _fused_cases(), ids=lambda v: v if isinstance(v, str) else "")
def test_fused_opcheck(adaptor, name, args):
    results = torch.library.opcheck(_op(name), args)
    assert results and set(results.values()) == {"SUCCESS"}, results
