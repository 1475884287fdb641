"""The reference adaptor's quantized ops and int4 packing, each against an independent float64 computation."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from vllm_ascend.core.device.adaptor.base import DeviceOpError
from vllm_ascend.kernels.device.reference import (
    MAX_EXACT_INT32_K,
    ReferenceDeviceAdaptor,
    cached_int8_weight,
    pack_int4,
    unpack_int4,
)


@pytest.fixture
def ref() -> ReferenceDeviceAdaptor:
    torch.manual_seed(0)
    return ReferenceDeviceAdaptor()


def i8(*shape: int, low: int = -128, high: int = 128) -> torch.Tensor:
    return torch.randint(low, high, shape, dtype=torch.int8)


# -- int4 packing -----------------------------------------------------------------------------------
def test_pack_int4_round_trips_exactly_and_uses_little_endian_nibbles():
    q = i8(3, 5, 64, low=-8, high=8)
    q[0, 0, :8] = torch.tensor([-8, 7, -8, 7, -8, 7, -8, 7], dtype=torch.int8)  # extremes in every nibble
    packed = pack_int4(q)
    assert packed.dtype == torch.int32 and packed.shape == (3, 5, 8)
    assert torch.equal(unpack_int4(packed), q)
    word = pack_int4(torch.tensor([[1, 2, 3, 4, 5, 6, 7, -1]], dtype=torch.int8))
    assert int(word) & 0xFFFFFFFF == 0xF7654321  # element j in bits 4j..4j+3, two's complement
    assert int(pack_int4(torch.full((8,), -1, dtype=torch.int8))) == -1
    every_word = torch.tensor([-(2**31), -1, 0, 2**31 - 1, 0x12345678], dtype=torch.int32)
    assert torch.equal(pack_int4(unpack_int4(every_word)), every_word)
    assert pack_int4(i8(0, 16, low=-8, high=8)).shape == (0, 2)


def test_pack_int4_errors_name_the_rule():
    with pytest.raises(DeviceOpError, match=r"last dim divisible by 8, got shape \(2, 12\)"):
        pack_int4(i8(2, 12, low=-8, high=8))
    with pytest.raises(DeviceOpError, match=r"values in \[-8, 7\], got values in \[-9, 7\]"):
        pack_int4(torch.tensor([-9, 0, 0, 0, 0, 0, 0, 7], dtype=torch.int8))
    with pytest.raises(
        DeviceOpError, match=r"pack_int4 needs int8 values in \[-8, 7\], got dtype torch.int32"
    ):
        pack_int4(torch.zeros(8, dtype=torch.int32))
    with pytest.raises(DeviceOpError, match=r"unpack_int4 needs int32 packed int4 .* got dtype torch.int8"):
        unpack_int4(torch.zeros(8, dtype=torch.int8))


def test_int4_unpack_is_kept_per_weight_until_the_weight_changes_in_place(ref):
    """The reference ops reuse a packed weight's unpack; an in-place write to the weight is seen."""
    q = i8(16, 32, low=-8, high=8)
    packed = torch.nn.Parameter(pack_int4(q), requires_grad=False)
    first = cached_int8_weight(packed, "weight", "[K, N]")
    assert torch.equal(first, unpack_int4(packed.clone())) and torch.equal(first, q)
    assert cached_int8_weight(packed, "weight", "[K, N]") is first  # not unpacked again
    x, scale = torch.randn(3, 16), torch.rand(32) + 0.5
    assert torch.equal(ref.weight_quant_matmul(x, packed, scale), x @ (q.float() * scale))

    changed = q.clone()
    changed[5] = -changed[5].clamp(min=-7)
    packed[5].copy_(pack_int4(changed[5]))  # through a view, as EPLB's movers write expert rows
    assert torch.equal(cached_int8_weight(packed, "weight", "[K, N]"), changed)
    assert torch.equal(ref.weight_quant_matmul(x, packed, scale), x @ (changed.float() * scale))

    gone = weakref.ref(packed)
    del packed
    gc.collect()
    assert gone() is None  # the cache does not keep a weight alive


# -- quantize ---------------------------------------------------------------------------------------
def test_static_quantize_rounds_half_to_even_offsets_and_clamps(ref):
    x = torch.tensor([[0.25, 0.75, -0.25, 10.0, -10.0, 0.0]])
    scale, offset = torch.tensor([0.5]), torch.tensor([3.0])
    # x/scale = 0.5, 1.5, -0.5, 20, -20, 0 -> half to even 0, 2, -0, 20, -20, 0 -> +3
    assert ref.quantize(x, scale, offset).tolist() == [[3, 5, 3, 23, -17, 3]]
    assert ref.quantize(x * 100, scale, offset).tolist() == [[53, 127, -47, 127, -128, 3]]
    y = torch.randn(4, 7, 16, dtype=torch.bfloat16)
    q = ref.quantize(y, torch.tensor([0.02]), None)
    expected = torch.round(y.double() / torch.tensor(0.02, dtype=torch.float32).double()).clamp(-128, 127)
    assert q.dtype == torch.int8 and q.shape == y.shape
    assert (q.double() - expected).abs().max() <= 1  # fp32 vs fp64 division at exact .5 ties


def test_static_quantize_rejects_bad_scale_offset_and_input(ref):
    x = torch.randn(2, 4)
    with pytest.raises(
        DeviceOpError, match=r"scale must be a one-element float tensor \(per-tensor\).*\(2,\)"
    ):
        ref.quantize(x, torch.rand(2), None)
    with pytest.raises(DeviceOpError, match=r"offset must hold an integer in \[-128, 127\], got 0.5"):
        ref.quantize(x, torch.tensor([0.1]), torch.tensor([0.5]))
    with pytest.raises(DeviceOpError, match=r"offset must hold an integer in \[-128, 127\], got 200.0"):
        ref.quantize(x, torch.tensor([0.1]), torch.tensor([200.0]))
    with pytest.raises(DeviceOpError, match=r"x must be a float tensor, got dtype torch\.int8"):
        ref.quantize(x.to(torch.int8), torch.tensor([0.1]), None)


# -- quant_matmul -----------------------------------------------------------------------------------
def dequant(acc: torch.Tensor, *scales: torch.Tensor) -> torch.Tensor:
    out = acc.double()
    for s in scales:
        out = out * s.double()
    return out


def test_quant_matmul_int32_bias_before_scaling_float_bias_after(ref):
    x, w = i8(4, 32), i8(32, 8)
    ws, ts = torch.rand(8) / 50, torch.rand(4)
    acc = x.double() @ w.double()  # exact in float64 at these sizes
    ibias = torch.randint(-1000, 1000, (8,), dtype=torch.int32)
    fbias = torch.randn(8)
    got_i = ref.quant_matmul(x, w, ws, pertoken_scale=ts, bias=ibias, output_dtype=torch.float64)
    got_f = ref.quant_matmul(x, w, ws, pertoken_scale=ts, bias=fbias, output_dtype=torch.float64)
    torch.testing.assert_close(got_i, (acc + ibias.double()) * ws.double() * ts.double()[:, None])
    torch.testing.assert_close(got_f, acc * ws.double() * ts.double()[:, None] + fbias.double())
    # the two are different functions: an int32 bias is scaled, a float one is not
    same_values = ref.quant_matmul(
        x, w, ws, pertoken_scale=ts, bias=ibias.float(), output_dtype=torch.float64
    )
    assert not torch.allclose(same_values, got_i)
    no_token = ref.quant_matmul(x, w, ws, bias=ibias, output_dtype=torch.float32)
    torch.testing.assert_close(no_token, dequant(acc + ibias.double(), ws).float())


def test_quant_matmul_accumulates_exactly_in_int32(ref):
    k = 4096
    x, w = i8(3, k), i8(k, 5)
    x[0], w[:, 0] = 127, 127  # row 0 x column 0: 127*127*4096 = 66064384 > 2**24 (fp32 would round)
    got = ref.quant_matmul(x, w, torch.ones(5), output_dtype=torch.float64)
    assert torch.equal(got, (x.long() @ w.long()).double())
    assert int(got[0, 0]) == 127 * 127 * k


def test_quant_matmul_int4_packed_equals_unpacked_and_keeps_leading_dims(ref):
    x, w4 = i8(2, 3, 16), i8(16, 24, low=-8, high=8)
    ws, ts = torch.rand(24), torch.rand(6)
    packed = ref.quant_matmul(x, pack_int4(w4), ws, pertoken_scale=ts, output_dtype=torch.float32)
    unpacked = ref.quant_matmul(x, w4, ws, pertoken_scale=ts, output_dtype=torch.float32)
    assert packed.shape == (2, 3, 24) and torch.equal(packed, unpacked)
    want = dequant(x.reshape(6, 16).double() @ w4.double(), ws, ts[:, None]).float().reshape(2, 3, 24)
    torch.testing.assert_close(packed, want)
    empty = ref.quant_matmul(x[:0], pack_int4(w4), ws, output_dtype=torch.bfloat16)
    assert empty.shape == (0, 3, 24) and empty.dtype == torch.bfloat16


def test_quant_matmul_rejects_bad_arguments(ref):
    x, w = i8(4, 16), i8(16, 8)
    with pytest.raises(
        DeviceOpError,
        match=r"weight must be int8 \[K, N\] or int4 packed in int32 \[K, N/8\], got dtype torch.float32",
    ):
        ref.quant_matmul(x, w.float(), torch.rand(8))
    with pytest.raises(DeviceOpError, match="x must be int8"):
        ref.quant_matmul(x.float(), w, torch.rand(8))
    with pytest.raises(DeviceOpError, match=r"disagree: \(4, 16\) vs \(8, 8\)"):
        ref.quant_matmul(x, w[:8], torch.rand(8))
    with pytest.raises(DeviceOpError, match=r"weight_scale must be float \[8\] \(or one element\)"):
        ref.quant_matmul(x, w, torch.rand(7))
    with pytest.raises(DeviceOpError, match=r"pertoken_scale must be float \[M\] = \[4\]"):
        ref.quant_matmul(x, w, torch.rand(8), pertoken_scale=torch.rand(3))
    with pytest.raises(DeviceOpError, match=r"bias must be int32 or float \[8\], got torch.int64"):
        ref.quant_matmul(x, w, torch.rand(8), bias=torch.zeros(8, dtype=torch.int64))
    with pytest.raises(DeviceOpError, match="output_dtype must be a float dtype"):
        ref.quant_matmul(x, w, torch.rand(8), output_dtype=torch.int8)
    big = MAX_EXACT_INT32_K + 8
    with pytest.raises(DeviceOpError, match=f"K={big} is too large for an exact int32 accumulator"):
        ref.quant_matmul(i8(1, big), i8(big, 1), torch.rand(1))


# -- weight_quant_matmul ----------------------------------------------------------------------------
def test_weight_quant_matmul_int4_per_group_and_per_channel(ref):
    k, n, g = 64, 16, 32
    a, w4 = torch.randn(5, k), i8(k, n, low=-8, high=8)
    scale, offset = torch.rand(k // g, n), torch.randint(-8, 8, (k // g, n)).float()
    got = ref.weight_quant_matmul(a, pack_int4(w4), scale, antiquant_offset=offset, group_size=g)
    assert torch.equal(got, ref.weight_quant_matmul(a, w4, scale, antiquant_offset=offset, group_size=g))
    deq = (w4.double() + offset.double().repeat_interleave(g, 0)) * scale.double().repeat_interleave(g, 0)
    torch.testing.assert_close(got.double(), a.double() @ deq, atol=1e-4, rtol=1e-5)
    ch_scale, ch_offset, bias = torch.rand(n), torch.randn(n), torch.randn(n)
    got = ref.weight_quant_matmul(a, pack_int4(w4), ch_scale, antiquant_offset=ch_offset, bias=bias)
    want = a.double() @ ((w4.double() + ch_offset.double()) * ch_scale.double()) + bias.double()
    torch.testing.assert_close(got.double(), want, atol=1e-4, rtol=1e-5)
    assert ref.weight_quant_matmul(a[:0], pack_int4(w4), ch_scale).shape == (0, n)


def test_weight_quant_matmul_rejects_bad_arguments(ref):
    a, w = torch.randn(2, 64), i8(64, 8)
    with pytest.raises(DeviceOpError, match="x must be a float tensor"):
        ref.weight_quant_matmul(a.to(torch.int8), w, torch.rand(8))
    with pytest.raises(
        DeviceOpError, match=r"antiquant_offset must be \[2, 8\] for group_size=32, got \(8,\)"
    ):
        ref.weight_quant_matmul(a, w, torch.rand(2, 8), antiquant_offset=torch.rand(8), group_size=32)
    with pytest.raises(DeviceOpError, match="group_size must be >= 0"):
        ref.weight_quant_matmul(a, w, torch.rand(8), group_size=-1)
    with pytest.raises(DeviceOpError, match=r"bias must be \[8\]"):
        ref.weight_quant_matmul(a, w, torch.rand(8), bias=torch.rand(4))


# -- grouped ops ------------------------------------------------------------------------------------
def test_grouped_quant_matmul_equals_per_group_dequantised_matmul(ref):
    m, k, n = 9, 16, 8
    x, w = i8(m, k), i8(3, k, n)
    ws, xs = torch.rand(3, n) / 50, torch.rand(m)
    counts = torch.tensor([3, 0, 4])  # an empty group and 2 rows past the last group
    got = ref.grouped_quant_matmul(x, w, counts, ws, xs, output_dtype=torch.float32)
    want = torch.zeros(m, n, dtype=torch.float64)
    for g, (lo, hi) in ((0, (0, 3)), (2, (3, 7))):
        want[lo:hi] = (x[lo:hi].double() @ w[g].double()) * ws[g].double() * xs[lo:hi, None].double()
    torch.testing.assert_close(got, want.float())
    assert torch.all(got[7:] == 0) and got.dtype == torch.float32
    cumsum = ref.grouped_quant_matmul(
        x, w, counts.cumsum(0), ws, xs, group_list_type="cumsum", output_dtype=torch.float32
    )
    assert torch.equal(cumsum, got)
    bf16 = ref.grouped_quant_matmul(x, w, counts, ws, xs)
    assert bf16.dtype == torch.bfloat16 and torch.equal(bf16, want.to(torch.bfloat16))
    zero = ref.grouped_quant_matmul(x[:0], w, torch.zeros(3, dtype=torch.int64), ws, xs[:0])
    assert zero.shape == (0, n)


def test_grouped_quant_matmul_int4_packed_equals_unpacked(ref):
    x, w4 = i8(6, 16), i8(2, 16, 16, low=-8, high=8)
    ws, xs, counts = torch.rand(2, 16), torch.rand(6), torch.tensor([4, 2])
    packed = ref.grouped_quant_matmul(x, pack_int4(w4), counts, ws, xs, output_dtype=torch.float32)
    assert torch.equal(packed, ref.grouped_quant_matmul(x, w4, counts, ws, xs, output_dtype=torch.float32))


def test_grouped_quant_matmul_rejects_bad_arguments(ref):
    x, w, ws, xs, counts = i8(6, 16), i8(2, 16, 8), torch.rand(2, 8), torch.rand(6), torch.tensor([4, 2])
    with pytest.raises(
        DeviceOpError, match=r"weight_scale must be float \[G, N\] = \(2, 8\), got torch.float32 \(8,\)"
    ):
        ref.grouped_quant_matmul(x, w, counts, ws[0], xs)
    with pytest.raises(DeviceOpError, match=r"x_scale must be float \[M\] = \(6,\)"):
        ref.grouped_quant_matmul(x, w, counts, ws, xs[:5])
    with pytest.raises(DeviceOpError, match="group_list has 3 groups but weight has 2"):
        ref.grouped_quant_matmul(x, w, torch.tensor([1, 2, 3]), ws, xs)
    with pytest.raises(DeviceOpError, match="group_list covers 7 rows but x has only 6"):
        ref.grouped_quant_matmul(x, w, torch.tensor([4, 3]), ws, xs)
    with pytest.raises(DeviceOpError, match=r"weight must be \[G, K, N\] with K=16, got \(2, 8, 8\)"):
        ref.grouped_quant_matmul(x, w[:, :8], counts, ws, xs)
    with pytest.raises(DeviceOpError, match=r"x must be int8 \[M, K\]"):
        ref.grouped_quant_matmul(x.float(), w, counts, ws, xs)


def test_grouped_matmul_swiglu_quant_int4_packed_equals_unpacked(ref):
    x, w4 = i8(7, 16), i8(2, 16, 16, low=-8, high=8)
    ws, xs, ends = torch.rand(2, 16) / 10, torch.rand(7) / 10, torch.tensor([3, 6])
    q_packed, s_packed = ref.grouped_matmul_swiglu_quant(x, pack_int4(w4), ends, ws, xs)
    q, s = ref.grouped_matmul_swiglu_quant(x, w4, ends, ws, xs)
    assert torch.equal(q_packed, q) and torch.equal(s_packed, s) and q[6].eq(0).all() and s[6] == 0
    with pytest.raises(
        DeviceOpError, match=r"weight must be int8 \[G, K, 2N\] or int4 packed in int32 \[G, K, 2N/8\]"
    ):
        ref.grouped_matmul_swiglu_quant(x, w4.float(), ends, ws, xs)


def test_cast_weight_format_keeps_the_tensor(ref):
    w = i8(8, 8)
    assert ref.cast_weight_format(w, "NZ") is w and ref.cast_weight_format(w, "ND") is w
    with pytest.raises(DeviceOpError, match="fmt='nz' is invalid; allowed values: ND, NZ"):
        ref.cast_weight_format(w, "nz")
