"""Atlas 310P quantization: W8A8S / W8A8SC schemes, the compressed-weight codec, and W8A8 / W8A8_DYNAMIC on the
310P profile (float16 activations, NZ weights), each against a fake-quant float reference.

The 310P profile is the reference device emulating 310P as ``VLLM_ASCEND_REFERENCE_FAMILY=310p`` builds it (core's
310P baseline refined as the 310P overlay does: float16 only, ``SPARSE_WEIGHT``), so these tests need only core.
"""

from __future__ import annotations

import functools
import math
import re

import pytest
import torch

from vllm_ascend.core.device.family import AscendDeviceType
from vllm_ascend.core.device.profile import (
    A2_PROFILE,
    P310_BASE_PROFILE,
    REFERENCE_PROFILE,
    HardwareCapability,
    HardwareProfile,
    emulating_profile,
)
from vllm_ascend.quant.compress import (
    BLOCK_COLS,
    BLOCK_ROWS,
    CompressedFormatError,
    compress_weight,
    decompress_weight,
    index_size,
    split_shards,
)
from vllm_ascend.quant.errors import QuantLoadError
from vllm_ascend.quant.schemes import (
    W8A8DynamicLinear,
    W8A8DynamicMoE,
    W8A8Linear,
    W8A8SCLinear,
    W8A8SLinear,
    get_scheme_class,
)

PREFIX = "model.layers.0.self_attn.qkv_proj"
SHARDS = (136, 64, 40)  # q, k, v rows: shard q spans two 128-row blocks
OUT, IN = sum(SHARDS), 320  # two 256-column blocks
#: fp16 output vs a float64 reference: a few fp16 ulps of the result, relative to its scale.
FP16_RTOL = 4e-3

PROFILE_310P = emulating_profile(
    P310_BASE_PROFILE.with_changes(
        capabilities=frozenset({HardwareCapability.SPARSE_WEIGHT}), supported_dtypes=("float16",)
    )
)


def use_profile(monkeypatch: pytest.MonkeyPatch, profile: HardwareProfile):
    """Run on the reference device with ``profile`` (as VLLM_ASCEND_REFERENCE_FAMILY would select it)."""
    from vllm_ascend.core.device import config
    from vllm_ascend.core.device.detection import DeviceMode

    monkeypatch.setenv("VLLM_ASCEND_DEVICE", "reference")
    config.clear_device_caches()
    device = config.DeviceConfig(DeviceMode.REFERENCE, None, None, profile)
    monkeypatch.setattr(config, "get_device_config", functools.cache(lambda: device))
    ad = config.get_device_adaptor()
    ad.reset_counts()
    return ad


@pytest.fixture
def p310(monkeypatch):
    """The reference adaptor under the 310P profile; device caches reset around the test."""
    from vllm_ascend.core.device.config import clear_device_caches

    yield use_profile(monkeypatch, PROFILE_310P)
    clear_device_caches()


# -- independent checkpoint builders -----------------------------------------------------------------


def sparse_int8(rows: int, cols: int, density: float, seed: int) -> torch.Tensor:
    """Random int8 weights with about ``density`` of them non-zero (row maxima kept at ±127)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(-127, 128, (rows, cols), generator=g, dtype=torch.int16)
    keep = torch.rand(rows, cols, generator=g) < density
    q = torch.where(keep, q, 0)
    q[:, 0] = 127
    return q.to(torch.int8)


def static_sparse_ckpt(q: torch.Tensor, seed: int) -> dict[str, torch.Tensor]:
    """ModelSlim W8A8S tensors for int8 weights ``q``: random per-channel weight scale folded into deq_scale,
    an asymmetric per-tensor activation scale/offset folded into quant_bias."""
    g = torch.Generator().manual_seed(seed)
    weight_scale = torch.rand(q.shape[0], generator=g) * 0.01 + 0.001
    input_scale = torch.tensor([0.03])
    input_offset = torch.tensor([-7.0])
    return {
        "weight": q,
        "input_scale": input_scale,
        "input_offset": input_offset,
        "deq_scale": (input_scale * weight_scale).float(),
        "quant_bias": (-input_offset.long() * q.long().sum(dim=1)).to(torch.int32),
    }


def fake_quant_static(ckpt: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """Float64 fake-quant forward: dequantised weight ``q * deq_scale / input_scale`` times the quantised and
    dequantised activation (``quant_bias`` is the activation offset folded over the weight rows)."""
    s, o = float(ckpt["input_scale"]), float(ckpt["input_offset"])
    x_deq = ((torch.round(x.double() / s) + o).clamp(-128, 127) - o) * s
    w_deq = ckpt["weight"].double() * (ckpt["deq_scale"].double() / s).unsqueeze(1)
    return x_deq @ w_deq.t()


def layer_of(tensors: dict[str, torch.Tensor]) -> torch.nn.Module:
    layer = torch.nn.Module()
    for name, t in tensors.items():
        layer.register_parameter(name, torch.nn.Parameter(t.clone(), requires_grad=False))
    return layer


def build(cls, tensors: dict[str, torch.Tensor]):
    scheme = cls(prefix=PREFIX, group_size=None, params_dtype=torch.float16)
    layer = layer_of(tensors)
    scheme.process_weights(layer)
    return scheme, layer


def compressed_ckpt(ckpt: dict[str, torch.Tensor], direction: int = 0) -> dict[str, torch.Tensor]:
    """W8A8SC: each fused shard's weight compressed on its own, the shards' tensors concatenated."""
    parts = [compress_weight(w, direction) for w in ckpt["weight"].split(SHARDS)]
    out = {k: v for k, v in ckpt.items() if k != "weight"}
    out["weight"] = torch.cat([p.weight for p in parts])
    out["index"] = torch.cat([p.index for p in parts])
    out["info"] = torch.cat([p.info for p in parts])
    return out


def assert_close_fp16(got: torch.Tensor, expected: torch.Tensor) -> None:
    """fp16 result equals the float64 reference within a few fp16 ulps of the result's scale."""
    assert got.dtype == torch.float16
    scale = float(expected.abs().max())
    torch.testing.assert_close(got.double(), expected, rtol=FP16_RTOL, atol=FP16_RTOL * scale)


# -- the codec ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("direction", [0, 1])
@pytest.mark.parametrize(("rows", "cols", "density"), [(136, 320, 0.3), (40, 64, 1.0), (300, 520, 0.05)])
def test_codec_roundtrip_sizes_and_documented_index_length(direction, rows, cols, density):
    q = sparse_int8(rows, cols, density, seed=rows + cols)
    packed = compress_weight(q, direction)
    # documented: index = ceil(k1 / tilingK) * ceil(n1 / tilingN) * 8 with k1 = k / 32, n1 = n / 16, tiling 8
    assert (
        packed.index.numel()
        == math.ceil(cols / 32 / 8) * math.ceil(rows / 16 / 8) * 8
        == index_size(rows, cols)
    )
    assert packed.index.dtype == packed.weight.dtype == torch.int8 and packed.info.dtype == torch.int64
    assert packed.info.tolist() == [8, 8, rows, cols, direction]
    assert 0 < packed.weight.numel() <= rows * cols
    if density < 0.5:  # sparse blocks store a bitmap and the non-zeros only
        nnz = int((q != 0).sum())
        blocks = math.ceil(rows / BLOCK_ROWS) * math.ceil(cols / BLOCK_COLS)
        assert packed.weight.numel() <= nnz + math.ceil(rows * cols / 8) + blocks
    else:  # dense blocks are stored raw
        assert packed.weight.numel() == rows * cols
    assert torch.equal(decompress_weight(packed.weight, packed.index, packed.info), q)


def test_codec_directions_differ_in_block_order():
    q = sparse_int8(256, 512, 0.2, seed=3)  # a 2 x 2 block grid
    by_row, by_col = compress_weight(q, 0), compress_weight(q, 1)
    assert not torch.equal(by_row.weight, by_col.weight)
    entries = by_row.index.view(torch.uint8).numpy().view("<u4").reshape(-1, 2)
    flipped = by_col.index.view(torch.uint8).numpy().view("<u4").reshape(-1, 2)
    assert (entries[[0, 2, 1, 3]] == flipped).all()  # row-major vs column-major over the 2 x 2 grid
    for packed in (by_row, by_col):
        assert torch.equal(decompress_weight(packed.weight, packed.index, packed.info), q)


def _broken(packed, **changes):
    return [changes.get(n, getattr(packed, n)) for n in ("weight", "index", "info")]


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        (lambda p: {"info": torch.tensor([4, 8, 136, 320, 0])}, "info[0] (tiling_n)", "8 (the only tiling"),
        (lambda p: {"info": torch.tensor([8, 16, 136, 320, 0])}, "info[1] (tiling_k)", "8 (the only tiling"),
        (lambda p: {"info": torch.tensor([8, 8, 136, 320, 2])}, "info[4] (direction)", "one of 0, 1"),
        (lambda p: {"info": torch.tensor([8, 8, 0, 320, 0])}, "info[2] (rows)", "a positive size"),
        (lambda p: {"info": torch.tensor([8, 8, 136, 320])}, "info", "5 values (tiling_n, tiling_k"),
        (lambda p: {"info": p.info.int()}, "info", "1-D torch.int64"),
        (
            lambda p: {"index": p.index[:-8]},
            "index",
            "32 bytes (8 per 128x256 block of a [136, 320] weight), got 24",
        ),
        (lambda p: {"weight": p.weight[:-1]}, "weight", "(the sum of the index's block lengths)"),
        (lambda p: {"weight": p.weight.to(torch.int32)}, "weight", "1-D torch.int8"),
    ],
)
def test_codec_refuses_malformed_tensors_naming_the_field(change, field, message):
    packed = compress_weight(sparse_int8(136, 320, 0.3, seed=1))
    with pytest.raises(CompressedFormatError, match=re.escape(message)) as info:
        decompress_weight(*_broken(packed, **change(packed)))
    assert info.value.field == field


def test_codec_refuses_inconsistent_blocks():
    packed = compress_weight(sparse_int8(136, 320, 0.3, seed=1))
    index = packed.index.clone()
    index.view(torch.uint8)[4] += 1  # block 0's non-zero count no longer matches its bitmap
    with pytest.raises(
        CompressedFormatError, match=r"block 0 byte length: expected .* \(bitmap \+ non-zeros\)"
    ):
        decompress_weight(packed.weight, index, packed.info)
    weight = packed.weight.clone()
    weight[0] ^= 1  # flip one bitmap bit of block 0
    with pytest.raises(CompressedFormatError, match=r"weight block 0 bitmap: expected \d+ set bits"):
        decompress_weight(weight, packed.index, packed.info)
    dense = compress_weight(sparse_int8(40, 64, 1.0, seed=2))
    index = dense.index.clone()
    index.view(torch.uint8)[4] -= 1  # a raw block whose count disagrees with its values
    with pytest.raises(CompressedFormatError, match=r"index block 0: expected non-zero count"):
        decompress_weight(dense.weight, index, dense.info)
    with pytest.raises(CompressedFormatError, match=r"direction: expected one of 0, 1, got 3"):
        compress_weight(sparse_int8(4, 4, 1.0, seed=0), 3)
    with pytest.raises(CompressedFormatError, match=r"weight: expected a non-empty 2-D int8"):
        compress_weight(torch.zeros(4, 4))


def test_split_shards_follows_each_shards_info():
    ckpt = compressed_ckpt(static_sparse_ckpt(sparse_int8(OUT, IN, 0.3, seed=5), seed=5))
    shards = split_shards(ckpt["weight"], ckpt["index"], ckpt["info"])
    assert [int(s.info[2]) for s in shards] == list(SHARDS)
    assert sum(s.weight.numel() for s in shards) == ckpt["weight"].numel()
    with pytest.raises(
        CompressedFormatError, match=r"index: expected 64 bytes \(the shards' infos\), got 72"
    ):
        split_shards(ckpt["weight"], torch.cat([ckpt["index"], ckpt["index"][:8]]), ckpt["info"])
    with pytest.raises(
        CompressedFormatError, match=r"info: expected 1-D int64 with 5 values per fused shard"
    ):
        split_shards(ckpt["weight"], ckpt["index"], ckpt["info"][:-1])


# -- W8A8S / W8A8SC schemes -----------------------------------------------------------------------------


def test_sparse_schemes_are_registered(p310):
    assert get_scheme_class("W8A8S", "linear") is W8A8SLinear
    assert get_scheme_class("W8A8SC", "linear") is W8A8SCLinear
    scheme = W8A8SCLinear(prefix=PREFIX, group_size=None, params_dtype=torch.float16)
    assert scheme.TENSOR_PARALLEL_UNSUPPORTED and scheme.ROW_PARALLEL_UNSUPPORTED


def test_w8a8s_matches_fake_quant_in_fp16(p310):
    torch.manual_seed(0)
    ckpt = static_sparse_ckpt(sparse_int8(OUT, IN, 0.4, seed=0), seed=0)
    fused = dict(ckpt, input_scale=ckpt["input_scale"].repeat(3), input_offset=ckpt["input_offset"].repeat(3))
    scheme, layer = build(W8A8SLinear, fused)
    x = (torch.randn(2, 5, IN) * 2).half()
    out = scheme.apply(layer, x)
    assert out.shape == (2, 5, OUT)
    assert_close_fp16(out, fake_quant_static(ckpt, x.reshape(-1, IN)).reshape(2, 5, OUT))
    assert {n: (tuple(p.shape), p.dtype) for n, p in layer.named_parameters()} == {
        "weight": ((IN, OUT), torch.int8),
        "input_scale": ((1,), torch.float32),
        "input_offset": ((1,), torch.float32),
        "deq_scale": ((OUT,), torch.float32),
        "quant_bias": ((OUT,), torch.int32),
    }
    assert dict(p310.call_counts) == {"cast_weight_format": 1, "quantize": 1, "quant_matmul": 1}


@pytest.mark.parametrize("direction", [0, 1])
def test_w8a8sc_decompresses_to_w8a8s(p310, direction):
    ckpt = static_sparse_ckpt(sparse_int8(OUT, IN, 0.3, seed=1), seed=1)
    sc = compressed_ckpt(ckpt, direction)
    assert sc["weight"].numel() < OUT * IN / 2  # the compressed weight is smaller than the int8 one
    scheme_s, layer_s = build(W8A8SLinear, ckpt)
    scheme_sc, layer_sc = build(W8A8SCLinear, sc)
    assert torch.equal(layer_sc.weight, layer_s.weight)
    assert not hasattr(layer_sc, "index") and not hasattr(layer_sc, "info")
    x = (torch.randn(7, IN) * 2).half()
    out = scheme_sc.apply(layer_sc, x)
    assert torch.equal(out, scheme_s.apply(layer_s, x))
    assert_close_fp16(out, fake_quant_static(ckpt, x))


def test_w8a8sc_int64_deq_scale_and_float_bias(p310, monkeypatch):
    ckpt = static_sparse_ckpt(sparse_int8(OUT, IN, 0.3, seed=2), seed=2)
    sc = compressed_ckpt(ckpt)
    sc["deq_scale"] = ckpt["deq_scale"].view(torch.int32).long() & 0xFFFFFFFF  # ModelSlim's int64 form
    scheme, layer = build(W8A8SCLinear, sc)
    assert torch.equal(layer.deq_scale, ckpt["deq_scale"])
    dtypes: list[torch.dtype] = []
    original = p310.quant_matmul

    def spy(*args, **kwargs):
        dtypes.append(kwargs["output_dtype"])
        return original(*args, **kwargs)

    monkeypatch.setattr(p310, "quant_matmul", spy)
    x, bias = (torch.randn(3, IN) * 2).half(), torch.randn(OUT).half()
    out = scheme.apply(layer, x, bias)
    assert dtypes == [torch.float16]  # 310P computes in float16: its quant matmul writes float16
    assert_close_fp16(out, fake_quant_static(ckpt, x) + bias.double())


def _sc(**changes):
    ckpt = compressed_ckpt(static_sparse_ckpt(sparse_int8(OUT, IN, 0.3, seed=3), seed=3))
    return {k: v for k, v in {**ckpt, **changes}.items() if v is not None}


@pytest.mark.parametrize(
    ("cls", "tensors", "message"),
    [
        (W8A8SCLinear, lambda: _sc(info=None), r"qkv_proj\.info \(W8A8SC linear\): expected a tensor loaded"),
        (
            W8A8SCLinear,
            lambda: _sc(info=torch.tensor([8, 8, 136, 320, 0, 8, 8, 64, 320, 5, 8, 8, 40, 320, 0])),
            r"qkv_proj\.info \(shard 1\)\[4\] \(direction\) \(W8A8SC linear\): expected one of 0, 1, got 5",
        ),
        (
            W8A8SCLinear,
            lambda: _sc(info=torch.tensor([8, 8, 136, 320, 0, 8, 8, 64, 256, 0, 8, 8, 40, 320, 0])),
            r"qkv_proj\.info .*one input size \(info\[3\]\) shared by every fused shard, got \[256, 320\]",
        ),
        (
            W8A8SCLinear,
            lambda: _sc(info=torch.tensor([8, 8, 136, 320, 0, 8, 8, 64, 320, 0, 8, 8, 40, 320, 0.0])),
            r"qkv_proj\.info .*int64 with 5 values",
        ),
        (
            W8A8SCLinear,
            lambda: _sc(index=_sc()["index"][:-8]),
            r"qkv_proj\.index .*expected at least 64 bytes for the shards' infos, got 56",
        ),
        (
            W8A8SCLinear,
            lambda: _sc(weight=_sc()["weight"][:-3]),
            r"qkv_proj\.weight .*expected at least \d+ bytes",
        ),
        (
            W8A8SCLinear,
            lambda: _sc(deq_scale=torch.rand(OUT - 8), quant_bias=torch.zeros(OUT - 8, dtype=torch.int32)),
            r"qkv_proj\.info .*shard rows \(info\[2\]\) summing to the layer's 232 output features",
        ),
        (
            W8A8SCLinear,
            lambda: _sc(weight=_sc()["weight"].reshape(1, -1)),
            r"qkv_proj\.weight \(W8A8SC linear\): expected a non-empty 1-D tensor",
        ),
        (
            W8A8SLinear,
            lambda: dict(
                static_sparse_ckpt(sparse_int8(8, 16, 0.5, seed=0), seed=0), input_offset=torch.tensor([0.5])
            ),
            r"input_offset \(W8A8S linear\): expected integer values, got non-integer value 0\.5",
        ),
        (
            W8A8SLinear,
            lambda: dict(
                static_sparse_ckpt(sparse_int8(8, 16, 0.5, seed=0), seed=0), input_scale=torch.tensor([-1.0])
            ),
            r"input_scale \(W8A8S linear\): expected a positive scale",
        ),
        (
            W8A8SLinear,
            lambda: dict(
                static_sparse_ckpt(sparse_int8(8, 16, 0.5, seed=0), seed=0), deq_scale=torch.rand(7)
            ),
            r"deq_scale \(W8A8S linear\): expected shape \(8,\)",
        ),
        (
            W8A8SLinear,
            lambda: {
                k: v
                for k, v in static_sparse_ckpt(sparse_int8(8, 16, 0.5, seed=0), seed=0).items()
                if k != "quant_bias"
            },
            r"quant_bias \(W8A8S linear\): expected a tensor loaded from the checkpoint",
        ),
    ],
)
def test_malformed_sparse_checkpoints_name_the_field(p310, cls, tensors, message):
    scheme = cls(prefix=PREFIX, group_size=None, params_dtype=torch.float16)
    with pytest.raises(QuantLoadError, match=message):
        scheme.process_weights(layer_of(tensors()))


@pytest.mark.parametrize(
    ("profile", "family"),
    [(REFERENCE_PROFILE, "none \\(reference device\\)"), (emulating_profile(A2_PROFILE), "A2")],
)
@pytest.mark.parametrize("cls", [W8A8SLinear, W8A8SCLinear])
def test_sparse_schemes_need_the_sparse_weight_capability(monkeypatch, profile, family, cls):
    from vllm_ascend.core.device.config import clear_device_caches

    use_profile(monkeypatch, profile)
    try:
        with pytest.raises(
            QuantLoadError,
            match=rf"layer '{PREFIX}': {cls.quant_type} \(sparse int8 weights\) needs the hardware capability "
            rf"'sparse_weight', which {re.escape(profile.name)} \(family {family}\) "
            rf"lacks; {cls.quant_type} is served on the 310P family only",
        ):
            cls(prefix=PREFIX, group_size=None, params_dtype=torch.float16)
    finally:
        clear_device_caches()


# -- W8A8 / W8A8_DYNAMIC on the 310P profile ---------------------------------------------------------------


def test_w8a8_static_on_310p_fp16_with_bias_and_nz(p310, monkeypatch):
    seen: list[str] = []
    cast = p310.cast_weight_format
    monkeypatch.setattr(p310, "cast_weight_format", lambda w, fmt: seen.append(fmt) or cast(w, fmt))
    q = sparse_int8(48, 64, 1.0, seed=6)
    ckpt = static_sparse_ckpt(q, seed=6)
    deq_w = ckpt["deq_scale"] / ckpt["input_scale"]
    full = dict(ckpt, weight_scale=deq_w.reshape(-1, 1), weight_offset=torch.zeros(48, 1))
    scheme, layer = build(W8A8Linear, full)
    assert seen == ["NZ"]  # the profile's weight layout
    x, bias = (torch.randn(4, 64) * 2).half(), torch.randn(48).half()
    assert_close_fp16(scheme.apply(layer, x, bias), fake_quant_static(ckpt, x) + bias.double())


def test_w8a8_dynamic_linear_on_310p_fp16(p310):
    torch.manual_seed(7)
    w = torch.randn(48, 64)
    scale = w.abs().amax(dim=1, keepdim=True) / 127
    q = torch.round(w / scale).to(torch.int8)
    scheme, layer = build(
        W8A8DynamicLinear, {"weight": q, "weight_scale": scale, "weight_offset": torch.zeros(48, 1)}
    )
    x, bias = torch.randn(5, 64).half(), torch.randn(48).half()
    out = scheme.apply(layer, x, bias)
    xs = x.double().abs().amax(dim=1, keepdim=True) / 127
    x_deq = torch.round(x.double() / xs) * xs
    assert_close_fp16(out, x_deq @ (q.double() * scale.double()).t() + bias.double())


def test_w8a8_dynamic_moe_on_310p_fp16(p310):
    torch.manual_seed(8)
    e, h, inter = 4, 32, 24
    w13, w2 = torch.randn(e, 2 * inter, h), torch.randn(e, h, inter)

    def quant(w):
        s = w.abs().amax(dim=-1, keepdim=True) / 127
        return torch.round(w / s).to(torch.int8), s

    (q13, s13), (q2, s2) = quant(w13), quant(w2)
    scheme = W8A8DynamicMoE(prefix="m.experts", group_size=None, params_dtype=torch.float16)
    layer = layer_of(
        {
            "w13_weight": q13,
            "w13_weight_scale": s13,
            "w13_weight_offset": torch.zeros_like(s13),
            "w2_weight": q2,
            "w2_weight_scale": s2,
            "w2_weight_offset": torch.zeros_like(s2),
        }
    )
    scheme.process_weights(layer)
    x = torch.randn(6, h).half()
    topk_ids = torch.stack([torch.randperm(e)[:2] for _ in range(6)])
    topk_weights = torch.softmax(torch.randn(6, 2), dim=-1).half()
    out = scheme.apply(layer, x, topk_weights, topk_ids)

    def fq(v):  # per-token int8 fake quant in float64
        s = v.abs().amax(dim=-1, keepdim=True) / 127
        return torch.round(v / s) * s

    expected = torch.zeros(6, h, dtype=torch.float64)
    for t in range(6):
        for k in range(2):
            ex = int(topk_ids[t, k])
            gu = fq(x[t].double()) @ (q13[ex].double() * s13[ex].double()).t()
            act = torch.nn.functional.silu(gu[:inter]) * gu[inter:]
            expected[t] += float(topk_weights[t, k]) * (fq(act) @ (q2[ex].double() * s2[ex].double()).t())
    assert_close_fp16(out, expected)


def test_profile_under_test_is_the_310p_emulation(p310):
    from vllm_ascend.core.device.config import get_current_hardware_profile

    profile = get_current_hardware_profile()
    assert profile.device_type is AscendDeviceType._310P
    assert profile.supported_dtypes == ("float16",) and profile.quant_weight_format == "NZ"
    assert HardwareCapability.SPARSE_WEIGHT in profile.capabilities
