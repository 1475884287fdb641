"""310P attention: masks, the 310P device ops, the metadata builder and the impl's three paths.

Everything runs in float16 on the cpu and is checked against the runner's dense semantics (the reference
adaptor's ``fused_infer_attention``) and a float32 softmax attention written from the equation. The NPU
adaptor's ops run against a fake ``torch_npu`` implementing the two ops' documented semantics, which
checks layouts, masks and parameters they receive.
"""

from __future__ import annotations

import itertools
import math
import os
from types import SimpleNamespace

os.environ.setdefault("VLLM_ASCEND_DEVICE", "reference")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from vllm.v1.attention.backend import AttentionCGSupport, CommonAttentionMetadata

import vllm_ascend.ascend310p.attention.impl as impl_module
import vllm_ascend.ascend310p.overlay as overlay
import vllm_ascend.core.sdk as device_config
import vllm_ascend.runner.attention.impl as runner_impl
from vllm_ascend.ascend310p.attention.backend import AscendAttentionBackend310
from vllm_ascend.ascend310p.attention.impl import AscendAttentionBackendImpl310
from vllm_ascend.ascend310p.attention.mask import (
    MASK_VALUE,
    AttentionMaskBuilder310,
    expand_compressed_mask,
)
from vllm_ascend.ascend310p.attention.metadata import (
    AscendAttentionMetadata310,
    AscendAttentionMetadataBuilder310,
    AscendAttentionState310,
)
from vllm_ascend.ascend310p.overlay import Ascend310PDeviceAdaptor, Ascend310PReferenceAdaptor
from vllm_ascend.core.device.adaptor.base import DeviceOpError
from vllm_ascend.kernels.device.reference import ReferenceDeviceAdaptor
from vllm_ascend.runner.attention.support import AttentionConfigError

BS, HQ, HKV, D, NUM_BLOCKS = 16, 4, 2, 32, 24
SCALE = 1 / math.sqrt(D)
F16 = torch.float16
CPU = torch.device("cpu")


@pytest.fixture
def ref310(monkeypatch):
    """The reference device emulating 310P as the current adaptor."""
    adaptor = Ascend310PReferenceAdaptor()
    monkeypatch.setattr(device_config, "get_device_adaptor", lambda: adaptor)
    monkeypatch.setattr(impl_module, "get_device_adaptor", lambda: adaptor)
    return adaptor


# -- helpers ------------------------------------------------------------------------------------------
def dense_attention(q, k, v, ctx, scale=SCALE):
    """float32 ``softmax(scale q k^T + causal) v`` of one request: query ``j`` sees keys ``0..ctx+j``."""
    group = q.shape[1] // k.shape[1]
    k = k.float().repeat_interleave(group, dim=1)
    v = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * scale
    allowed = torch.arange(k.shape[0])[None, :] <= (ctx + torch.arange(q.shape[0]))[:, None]
    probs = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    return torch.einsum("hqk,khd->qhd", probs, v)


def paged_batch(seq_lens, gen, width=6):
    """Random fp16 K/V for each request, written into token-major caches at random distinct blocks."""
    key_cache = torch.randn(NUM_BLOCKS, BS, HKV, D, generator=gen).to(F16)
    value_cache = torch.randn(NUM_BLOCKS, BS, HKV, D, generator=gen).to(F16)
    perm = torch.randperm(NUM_BLOCKS, generator=gen).tolist()
    block_table = torch.full((len(seq_lens), width), -1, dtype=torch.int32)  # unused columns: padding
    keys, values = [], []
    for b, seq_len in enumerate(seq_lens):
        blocks = [perm.pop() for _ in range(-(-seq_len // BS))]
        block_table[b, : len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
        k = torch.randn(seq_len, HKV, D, generator=gen).to(F16)
        v = torch.randn(seq_len, HKV, D, generator=gen).to(F16)
        for p in range(seq_len):
            key_cache[blocks[p // BS], p % BS] = k[p]
            value_cache[blocks[p // BS], p % BS] = v[p]
        keys.append(k)
        values.append(v)
    return key_cache, value_cache, block_table, keys, values


def qsl_of(q_lens):
    return torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int64)


def assert_matches_dense_and_fused(
    out, q, key_cache, value_cache, block_table, q_lens, seq_lens, keys, values
):
    """``out`` equals the float32 equation per request and the reference's fused_infer_attention."""
    qsl = qsl_of(q_lens)
    expected = torch.cat(
        [
            dense_attention(q[qsl[b] : qsl[b + 1]], keys[b], values[b], seq_lens[b] - q_lens[b])
            for b in range(len(q_lens))
        ]
    )
    torch.testing.assert_close(out.float(), expected, atol=2e-3, rtol=2e-3)
    fused = ReferenceDeviceAdaptor().fused_infer_attention(
        q, key_cache, value_cache, block_table, qsl, torch.tensor(seq_lens), SCALE
    )
    torch.testing.assert_close(out.float(), fused.float(), atol=2e-3, rtol=2e-3)


# -- masks ---------------------------------------------------------------------------------------------
def test_causal_mask_is_zero_on_and_below_the_diagonal_and_cached():
    builder = AttentionMaskBuilder310()
    mask = builder.gen_causal_additive_mask(7, F16, CPU)
    assert mask.dtype == F16 and mask.shape == (7, 7)
    for i in range(7):
        for j in range(7):
            assert float(mask[i, j]) == (0.0 if j <= i else MASK_VALUE), (i, j)
    assert float(torch.tensor(MASK_VALUE, dtype=F16)) == MASK_VALUE  # exact in float16
    assert torch.isfinite(mask + torch.tensor(-50000.0, dtype=F16)).all()  # adding a score stays finite
    small = builder.gen_causal_additive_mask(3, F16, "cpu")
    assert small.data_ptr() == mask.data_ptr() and torch.equal(
        small, mask[:3, :3]
    )  # a view of the cached one
    big = builder.gen_causal_additive_mask(9, F16, CPU)
    assert big.shape == (9, 9) and torch.equal(big[:7, :7], mask)
    assert builder.gen_causal_additive_mask(9, torch.float32, CPU).dtype == torch.float32


def test_splitfuse_masks_normal_rows_and_compressed_tile_agree():
    gen = torch.Generator().manual_seed(1)
    builder = AttentionMaskBuilder310(compressed_tile_size=4)
    tile = builder.gen_compressed_splitfuse_mask(F16, CPU)
    assert tile.shape == (4, 4) and builder.gen_compressed_splitfuse_mask(F16, CPU) is tile
    for _ in range(5):
        seq_lens = torch.randint(1, 20, (4,), generator=gen)
        q_lens = torch.minimum(torch.randint(0, 12, (4,), generator=gen), seq_lens)
        normal = builder.gen_splitfuse_mask(q_lens, seq_lens, F16, CPU)
        assert normal.shape == (int(q_lens.sum()), int(seq_lens.max())) and normal.dtype == F16
        row = 0
        for q_len, seq_len in zip(q_lens.tolist(), seq_lens.tolist(), strict=True):
            ctx = seq_len - q_len
            for j in range(q_len):
                allowed = torch.arange(normal.shape[1]) <= ctx + j
                expected = torch.where(allowed, 0.0, MASK_VALUE).to(F16)
                assert torch.equal(normal[row + j], expected)
            # The compressed tile, offset per request (q_len up to 11 > the 4-row tile), gives the same rows.
            assert torch.equal(
                expand_compressed_mask(tile, q_len, seq_len), normal[row : row + q_len, :seq_len]
            )
            row += q_len
    with pytest.raises(ValueError, match=r"query_lens must lie within \[0, seq_lens\]"):
        builder.gen_splitfuse_mask(torch.tensor([3]), torch.tensor([2]), F16, CPU)


def test_compressed_mask_support_is_asked_of_the_adaptor(ref310, monkeypatch):
    assert AttentionMaskBuilder310.is_compressed_mask_supported() is False  # 310P: full masks only
    assert Ascend310PDeviceAdaptor.compressed_splitfuse_mask is False
    monkeypatch.setattr(ref310, "compressed_splitfuse_mask", True)
    assert AttentionMaskBuilder310.is_compressed_mask_supported() is True
    builder = AttentionMaskBuilder310(compressed_tile_size=8)
    assert builder.get_splitfuse_mask(torch.tensor([2]), torch.tensor([5]), F16, CPU).shape == (8, 8)


# -- the 310P device ops (reference adaptor) ----------------------------------------------------------
def test_prompt_attention_equals_the_equation_with_gqa_and_causal_mask():
    gen = torch.Generator().manual_seed(2)
    adaptor = Ascend310PReferenceAdaptor()
    q = torch.randn(9, HQ, D, generator=gen).to(F16)
    k = torch.randn(9, HKV, D, generator=gen).to(F16)
    v = torch.randn(9, HKV, D, generator=gen).to(F16)
    mask = AttentionMaskBuilder310().gen_causal_additive_mask(9, F16, CPU)
    out = adaptor.prompt_attention_310p(q, k, v, mask, SCALE)
    assert out.dtype == F16 and out.shape == (9, HQ, D)
    torch.testing.assert_close(out.float(), dense_attention(q, k, v, 0), atol=2e-3, rtol=2e-3)
    unmasked = adaptor.prompt_attention_310p(q, k, v, None, SCALE)
    torch.testing.assert_close(unmasked.float(), dense_attention(q, k, v, 9), atol=2e-3, rtol=2e-3)
    assert not torch.allclose(unmasked.float(), out.float(), atol=1e-2)  # the mask matters
    with pytest.raises(DeviceOpError, match=r"entries must be 0 \(attend\) or <= -10000"):
        adaptor.prompt_attention_310p(q, k, v, torch.full((9, 9), -1.0, dtype=F16), SCALE)


def test_paged_decode_equals_fused_infer_attention_and_the_equation():
    gen = torch.Generator().manual_seed(3)
    seq_lens = [1, 17, 40, 33]
    key_cache, value_cache, table, keys, values = paged_batch(seq_lens, gen)
    q = torch.randn(4, HQ, D, generator=gen).to(F16)
    adaptor = Ascend310PReferenceAdaptor()
    out = adaptor.paged_decode_attention(q, key_cache, value_cache, table, torch.tensor(seq_lens), SCALE)
    assert out.dtype == F16 and out.shape == (4, HQ, D)
    assert_matches_dense_and_fused(out, q, key_cache, value_cache, table, [1] * 4, seq_lens, keys, values)


@pytest.mark.parametrize("compressed", [False, True])
def test_splitfuse_equals_fused_infer_attention_on_a_mixed_batch(compressed):
    gen = torch.Generator().manual_seed(4)
    # A chunk continuing over context, a decode, an idle row, a prefill without context, a long chunk.
    seq_lens, q_lens = [37, 20, 9, 12, 70], [5, 1, 0, 12, 30]
    key_cache, value_cache, table, keys, values = paged_batch(seq_lens, gen)
    q = torch.randn(sum(q_lens), HQ, D, generator=gen).to(F16)
    builder = AttentionMaskBuilder310(compressed_tile_size=8)
    mask = builder.get_splitfuse_mask(
        torch.tensor(q_lens), torch.tensor(seq_lens), F16, CPU, compressed=compressed
    )
    adaptor = Ascend310PReferenceAdaptor()
    out = adaptor.splitfuse_attention_310p(
        q,
        key_cache,
        value_cache,
        table,
        qsl_of(q_lens),
        torch.tensor(seq_lens),
        mask,
        SCALE,
        compressed=compressed,
    )
    active = [b for b, n in enumerate(q_lens) if n]
    assert adaptor.call_counts["prompt_attention_310p"] == len(active)
    assert_matches_dense_and_fused(
        out,
        q,
        key_cache,
        value_cache,
        table[active],
        [q_lens[b] for b in active],
        [seq_lens[b] for b in active],
        [keys[b] for b in active],
        [values[b] for b in active],
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("cls", [Ascend310PReferenceAdaptor, Ascend310PDeviceAdaptor])
def test_other_dtypes_are_refused_naming_310p(dtype, cls):
    adaptor = cls()
    q, kv = torch.randn(2, HQ, D, dtype=dtype), torch.randn(2, HKV, D, dtype=dtype)
    cache = torch.zeros(2, BS, HKV, D, dtype=dtype)
    table = torch.zeros(2, 1, dtype=torch.int32)
    with pytest.raises(
        DeviceOpError, match=rf"Atlas 310P attention runs in float16 only, got query dtype {dtype}"
    ):
        adaptor.prompt_attention_310p(q, kv, kv, None, SCALE)
    with pytest.raises(DeviceOpError, match=r"Atlas 310P attention runs in float16 only"):
        adaptor.paged_decode_attention(q, cache, cache, table, torch.tensor([1, 1]), SCALE)
    with pytest.raises(DeviceOpError, match=r"Atlas 310P attention runs in float16 only"):
        adaptor.splitfuse_attention_310p(
            q, cache, cache, table, qsl_of([1, 1]), torch.tensor([1, 1]), torch.zeros(2, 1), SCALE
        )


# -- the NPU adaptor's ops, on a fake torch_npu following the ops' documented semantics ----------------
class FakeTorchNpu:
    """``npu_prompt_flash_attention`` (BSND, bool mask: True = not computed; 310P: no KV-head grouping) and
    ``npu_incre_flash_attention`` (BSH query; paged ``(blocks, block_size, H)`` or batched ``[B, S, H]``
    KV with ``actual_seq_lengths``), in float32 torch; every call is recorded."""

    def __init__(self):
        self.calls = []

    def npu_prompt_flash_attention(
        self, query, key, value, *, atten_mask=None, num_heads=1, scale_value=1.0, **kw
    ):
        self.calls.append(("pfa", kw, atten_mask))
        assert kw["input_layout"] == "BSND" and kw["sparse_mode"] == 0 and query.dtype == F16
        assert query.is_contiguous() and key.is_contiguous() and value.is_contiguous()
        assert key.shape[2] == num_heads == query.shape[2]  # 310P: num_key_value_heads only 0 (MHA)
        scores = torch.einsum("bqhd,bkhd->bhqk", query.float(), key.float()) * scale_value
        if atten_mask is not None:
            assert atten_mask.dtype == torch.bool
            scores = scores.masked_fill(atten_mask, float("-inf"))
        return torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), value.float()).to(F16)

    def npu_incre_flash_attention(
        self, query, key, value, *, actual_seq_lengths, num_heads, scale_value, **kw
    ):
        self.calls.append(("ifa", kw, None))
        assert kw["input_layout"] == "BSH" and query.shape[1] == 1 and key.is_contiguous()
        batch, head_size, kv_heads = query.shape[0], query.shape[2] // num_heads, kw["num_key_value_heads"]
        out = []
        for b, seq_len in enumerate(actual_seq_lengths):
            if kw.get("block_table") is not None:
                blocks = kw["block_table"][b, : -(-seq_len // kw["block_size"])].long()
                k, v = (
                    key[blocks].reshape(-1, kv_heads, head_size),
                    value[blocks].reshape(-1, kv_heads, head_size),
                )
            else:
                k, v = key[b].view(-1, kv_heads, head_size), value[b].view(-1, kv_heads, head_size)
            q = query[b].view(1, num_heads, head_size)
            out.append(dense_attention(q, k[:seq_len], v[:seq_len], seq_len, scale_value))
        return torch.stack(out).reshape(batch, 1, -1).to(F16)


@pytest.fixture
def fake_npu(monkeypatch):
    fake = FakeTorchNpu()
    monkeypatch.setattr(overlay, "torch_npu_module", lambda: fake)
    return fake


@pytest.mark.parametrize("contiguous", [True, False])
def test_npu_ops_agree_with_the_reference_ops(fake_npu, contiguous):
    gen = torch.Generator().manual_seed(5)
    seq_lens, q_lens = [23, 40, 8], [1, 1, 1]
    key_cache, value_cache, table, _, _ = paged_batch(seq_lens, gen)
    if not contiguous:  # K and V as views of one [.., D + Dv] layer tensor (the runner's split_kv_cache)
        layer = torch.cat([key_cache, value_cache], dim=-1)
        key_cache, value_cache = layer[..., :D], layer[..., D:]
    npu, ref = Ascend310PDeviceAdaptor(), Ascend310PReferenceAdaptor()
    q = torch.randn(3, HQ, D, generator=gen).to(F16)
    lens = torch.tensor(seq_lens)
    got = npu.paged_decode_attention(q, key_cache, value_cache, table, lens, SCALE)
    torch.testing.assert_close(
        got.float(),
        ref.paged_decode_attention(q, key_cache, value_cache, table, lens, SCALE).float(),
        atol=2e-3,
        rtol=2e-3,
    )
    kind, kw, _ = fake_npu.calls[-1]
    assert kind == "ifa" and kw["num_key_value_heads"] == HKV
    assert ("block_table" in kw) is contiguous  # paged only where the op can read the caches as they are
    # Splitfuse through prompt flash attention: bool mask = additive mask < 0, KV heads expanded.
    q_lens = [4, 1, 8]
    q = torch.randn(sum(q_lens), HQ, D, generator=gen).to(F16)
    mask = AttentionMaskBuilder310().gen_splitfuse_mask(torch.tensor(q_lens), lens, F16, CPU)
    args = (q, key_cache, value_cache, table, qsl_of(q_lens), lens, mask, SCALE)
    got = npu.splitfuse_attention_310p(*args)
    torch.testing.assert_close(got.float(), ref.splitfuse_attention_310p(*args).float(), atol=2e-3, rtol=2e-3)
    kind, _, bool_mask = fake_npu.calls[-1]
    assert kind == "pfa" and torch.equal(bool_mask[0, 0], mask[5:13, :8] < 0)
    assert npu.call_counts["prompt_attention_310p"] == 3 and npu.call_counts["splitfuse_attention_310p"] == 1


# -- metadata builder and impl ----------------------------------------------------------------------
def _builder(dtype=F16) -> AscendAttentionMetadataBuilder310:
    config = SimpleNamespace(speculative_config=None, model_config=SimpleNamespace(dtype=dtype))
    return AscendAttentionMetadataBuilder310(SimpleNamespace(block_size=BS), ["layer.0"], config, CPU)


def _common(q_lens, seq_lens, block_table, padded_tokens=None):
    qsl = qsl_of(q_lens).to(torch.int32)
    n = int(qsl[-1])
    seq = torch.tensor(seq_lens, dtype=torch.int32)
    return CommonAttentionMetadata(
        query_start_loc=qsl, query_start_loc_cpu=qsl, seq_lens=seq, num_reqs=len(q_lens),
        num_actual_tokens=padded_tokens or n, max_query_len=max(q_lens), max_seq_len=max(seq_lens),
        block_table_tensor=block_table, slot_mapping=torch.full((padded_tokens or n,), -1, dtype=torch.int64),
        seq_lens_cpu_upper_bound=seq,
    )  # fmt: skip


def test_metadata_states_query_lens_and_masks(ref310):
    table = torch.zeros(3, 6, dtype=torch.int32)
    builder = _builder()
    prefill = builder.build(0, _common([5, 3, 7], [5, 3, 7], table))
    assert isinstance(prefill, AscendAttentionMetadata310)
    assert prefill.attn_state is AscendAttentionState310.PREFILL_NO_CACHE
    assert torch.equal(prefill.attn_mask, builder.mask_builder.gen_causal_additive_mask(7, F16, CPU))
    assert prefill.get_query_lens_cpu().tolist() == [5, 3, 7] and prefill.num_actual_tokens == 15
    decode = builder.build(0, _common([1, 1, 1], [9, 30, 2], table, padded_tokens=4))
    assert decode.attn_state is AscendAttentionState310.DECODE_ONLY and decode.attn_mask is None
    mixed = builder.build(0, _common([4, 1, 2], [10, 30, 2], table))
    assert mixed.attn_state is AscendAttentionState310.CHUNKED_PREFILL and not mixed.mask_compressed
    expected = builder.mask_builder.gen_splitfuse_mask(
        torch.tensor([4, 1, 2]), torch.tensor([10, 30, 2]), F16, CPU
    )
    assert torch.equal(mixed.attn_mask, expected) and mixed.attn_mask.shape == (7, 30)
    mixed.set_query_lens_cpu(torch.tensor([4, 1, 2], dtype=torch.int32))
    assert mixed.get_query_lens_cpu().dtype == torch.int64
    with pytest.raises(ValueError, match=r"query_lens \[4, 2, 1\] do not match query_start_loc_cpu"):
        mixed.set_query_lens_cpu(torch.tensor([4, 2, 1]))
    with pytest.raises(RuntimeError, match=r"Atlas 310P runs eagerly"):
        mixed.update_for_replay(mixed)
    assert AscendAttentionMetadataBuilder310._cudagraph_support is AttentionCGSupport.NEVER


def _write_and_run(impl, q_lens, ctx_lens, gen):
    """Write each request's context then its new tokens through the impl's KV update; run the forward."""
    seq_lens = [c + n for c, n in zip(ctx_lens, q_lens, strict=True)]
    width = 6
    kv_cache = torch.zeros(NUM_BLOCKS, HKV, BS, 2 * D, dtype=F16)  # vLLM's per-layer [blocks, H, bs, D + Dv]
    perm = torch.randperm(NUM_BLOCKS, generator=gen).tolist()
    table = torch.full((len(q_lens), width), -1, dtype=torch.int32)
    keys, values, new_k, new_v, new_slots = [], [], [], [], []
    for b, seq_len in enumerate(seq_lens):
        blocks = [perm.pop() for _ in range(-(-seq_len // BS))]
        table[b, : len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
        k = torch.randn(seq_len, HKV, D, generator=gen).to(F16)
        v = torch.randn(seq_len, HKV, D, generator=gen).to(F16)
        slots = torch.tensor([blocks[p // BS] * BS + p % BS for p in range(seq_len)])
        impl.do_kv_cache_update(None, k[: ctx_lens[b]], v[: ctx_lens[b]], kv_cache, slots[: ctx_lens[b]])
        keys.append(k)
        values.append(v)
        new_k.append(k[ctx_lens[b] :])
        new_v.append(v[ctx_lens[b] :])
        new_slots.append(slots[ctx_lens[b] :])
    pad = 2  # padded tokens: slot -1, output rows untouched
    new_k = torch.cat([*new_k, torch.zeros(pad, HKV, D, dtype=F16)])
    new_v = torch.cat([*new_v, torch.zeros(pad, HKV, D, dtype=F16)])
    impl.do_kv_cache_update(None, new_k, new_v, kv_cache, torch.cat([*new_slots, torch.full((pad,), -1)]))
    n = sum(q_lens)
    md = _builder().build(0, _common(q_lens, seq_lens, table, n + pad))
    q = torch.randn(n + pad, HQ, D, generator=gen).to(F16)
    output = torch.full((n + pad, HQ, D), 7.0, dtype=F16)
    impl.forward(None, q, new_k, new_v, kv_cache, md, output)
    assert (output[n:] == 7.0).all()
    key_cache, value_cache = runner_impl.split_kv_cache(kv_cache, D)
    return md, output[:n], q[:n], key_cache, value_cache, table, seq_lens, keys, values


@pytest.mark.parametrize(
    ("q_lens", "ctx_lens", "state", "op"),
    [
        ([6, 17, 3], [0, 0, 0], AscendAttentionState310.PREFILL_NO_CACHE, "prompt_attention_310p"),
        ([1, 1, 1], [16, 0, 45], AscendAttentionState310.DECODE_ONLY, "paged_decode_attention"),
        ([5, 1, 20], [20, 33, 0], AscendAttentionState310.CHUNKED_PREFILL, "splitfuse_attention_310p"),
    ],
)
def test_impl_paths_equal_dense_attention(ref310, q_lens, ctx_lens, state, op):
    gen = torch.Generator().manual_seed(sum(q_lens))
    impl = AscendAttentionBackendImpl310(HQ, D, SCALE, HKV)
    md, out, q, key_cache, value_cache, table, seq_lens, keys, values = _write_and_run(
        impl, q_lens, ctx_lens, gen
    )
    assert md.attn_state is state and ref310.call_counts[op] >= 1
    # The other paths' entry ops did not run (the reference decode and splitfuse call prompt attention).
    entry_ops = {"paged_decode_attention", "splitfuse_attention_310p"}
    assert all(ref310.call_counts[o] == 0 for o in entry_ops - {op})
    assert_matches_dense_and_fused(out, q, key_cache, value_cache, table, q_lens, seq_lens, keys, values)


def test_impl_uses_the_compressed_tile_where_the_adaptor_takes_it(ref310, monkeypatch):
    monkeypatch.setattr(ref310, "compressed_splitfuse_mask", True)
    gen = torch.Generator().manual_seed(9)
    impl = AscendAttentionBackendImpl310(HQ, D, SCALE, HKV)
    md, out, q, key_cache, value_cache, table, seq_lens, keys, values = _write_and_run(
        impl, [7, 1], [30, 4], gen
    )
    assert md.mask_compressed and md.attn_mask.shape == (2048, 2048)
    assert_matches_dense_and_fused(out, q, key_cache, value_cache, table, [7, 1], seq_lens, keys, values)


def test_impl_refuses_other_dtypes_and_non_310p_adaptors(monkeypatch):
    config = SimpleNamespace(model_config=SimpleNamespace(dtype=torch.bfloat16))
    monkeypatch.setattr(impl_module, "get_current_vllm_config_or_none", lambda: config)
    monkeypatch.setattr(runner_impl, "get_current_vllm_config_or_none", lambda: config)
    with pytest.raises(
        AttentionConfigError, match=r"dtype=torch.bfloat16 is not supported by the Atlas 310P .*float16"
    ):
        AscendAttentionBackendImpl310(HQ, D, SCALE, HKV)
    monkeypatch.setattr(impl_module, "get_current_vllm_config_or_none", lambda: None)
    monkeypatch.setattr(runner_impl, "get_current_vllm_config_or_none", lambda: None)
    with pytest.raises(
        AttentionConfigError, match=r"kv_cache_dtype='bfloat16' .*Atlas 310P.*allowed: auto, float16"
    ):
        AscendAttentionBackendImpl310(HQ, D, SCALE, HKV, kv_cache_dtype="bfloat16")
    monkeypatch.setattr(impl_module, "get_device_adaptor", ReferenceDeviceAdaptor)
    impl = AscendAttentionBackendImpl310(HQ, D, SCALE, HKV)
    md = _builder().build(0, _common([1], [1], torch.zeros(1, 1, dtype=torch.int32)))
    with pytest.raises(AttentionConfigError, match=r"needs a 310P device adaptor; ReferenceDeviceAdaptor"):
        impl.forward(None, torch.zeros(1, HQ, D, dtype=F16), None, None, torch.zeros(1, HKV, BS, 2 * D), md,
                     torch.zeros(1, HQ, D, dtype=F16))  # fmt: skip
    out = torch.ones(2, HQ, D, dtype=F16)
    assert impl.forward(None, out, None, None, torch.zeros(1), None, out).abs().sum() == 0  # profile run


def test_encoder_only_layers_run_packed_attention_and_bidirectional_decoders_are_refused(ref310):
    """Encoder-only layers (vLLM's metadata: causal=False, no KV cache) attend to their whole sequence through
    the 310P adaptor's packed_attention; a non-causal decoder layer is refused by name."""
    from vllm.v1.attention.backend import AttentionType

    gen = torch.Generator().manual_seed(5)
    q_lens = [5, 3, 9]
    n = sum(q_lens)
    q = torch.randn(n, HQ, D, generator=gen).to(F16)
    k = torch.randn(n, HKV, D, generator=gen).to(F16)
    v = torch.randn(n, HKV, D, generator=gen).to(F16)
    common = _common(q_lens, q_lens, torch.zeros(3, 1, dtype=torch.int32))
    common.causal = False
    md = _builder().build(0, common)
    impl = AscendAttentionBackendImpl310(HQ, D, SCALE, HKV, attn_type=AttentionType.ENCODER_ONLY)
    out = impl.forward(None, q, k, v, torch.empty(0, dtype=F16), md, torch.zeros(n, HQ, D, dtype=F16))
    qsl = qsl_of(q_lens)
    # Bidirectional: every query sees its sequence's last key (ctx = length - 1 puts no key in the future).
    expected = torch.cat(
        [dense_attention(q[a:b], k[a:b], v[a:b], b - a - 1) for a, b in itertools.pairwise(qsl.tolist())]
    )
    torch.testing.assert_close(out.float(), expected, atol=2e-3, rtol=2e-3)
    assert ref310.call_counts["packed_attention"] == 1
    decoder = AscendAttentionBackendImpl310(HQ, D, SCALE, HKV)
    with pytest.raises(AttentionConfigError, match=r"non-causal decoder attention .*allowed: causal decoder"):
        decoder.forward(
            None, q, k, v, torch.zeros(NUM_BLOCKS, HKV, BS, 2 * D, dtype=F16), md, torch.zeros_like(q)
        )


def test_backend_serves_float16_with_the_310p_classes():
    assert AscendAttentionBackend310.supported_dtypes == [torch.float16]
    assert AscendAttentionBackend310.supported_kv_cache_dtypes == ["auto", "float16"]
    assert AscendAttentionBackend310.get_impl_cls() is AscendAttentionBackendImpl310
    assert AscendAttentionBackend310.get_builder_cls() is AscendAttentionMetadataBuilder310
    assert AscendAttentionBackend310.get_name() == "CUSTOM"
