"""The reference adaptor's ops, each checked against an independent formulation."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from vllm_ascend.core.device.adaptor.base import OPS, DeviceOpError
from vllm_ascend.kernels.device import host_attention
from vllm_ascend.kernels.device.reference import ReferenceDeviceAdaptor


@pytest.fixture
def ref() -> ReferenceDeviceAdaptor:
    torch.manual_seed(0)
    return ReferenceDeviceAdaptor()


# -- paged KV cache helpers ---------------------------------------------------------------------
def flat_cache_views(num_blocks, block_size, hkv, d, dv, dtype=torch.float32):
    """K and V caches as non-contiguous views of one buffer [blocks, block_size, hkv, d + dv] (like vLLM)."""
    buf = torch.full((num_blocks, block_size, hkv, d + dv), float("nan"), dtype=dtype)
    return buf[..., :d], buf[..., d:]


def build_paged(ref, seqs, block_size, num_blocks, hkv, d, dv, dtype=torch.float32):
    """Random K/V per request written through reshape_and_cache into shuffled blocks; padded block table."""
    key_cache, value_cache = flat_cache_views(num_blocks, block_size, hkv, d, dv, dtype)
    perm = torch.randperm(num_blocks).tolist()
    max_blocks = max(-(-s // block_size) for s in seqs) + 2
    block_table = torch.full((len(seqs), max_blocks), 10**6, dtype=torch.int32)  # padding: must never be read
    dense_k, dense_v = [], []
    for b, seq_len in enumerate(seqs):
        nblk = -(-seq_len // block_size)
        blocks = [perm.pop() for _ in range(nblk)]
        block_table[b, :nblk] = torch.tensor(blocks, dtype=torch.int32)
        k = torch.randn(seq_len, hkv, d).to(dtype)
        v = torch.randn(seq_len, hkv, dv).to(dtype)
        slots = torch.tensor([blocks[i // block_size] * block_size + i % block_size for i in range(seq_len)])
        ref.reshape_and_cache(k, v, key_cache, value_cache, slots)
        dense_k.append(k)
        dense_v.append(v)
    return key_cache, value_cache, block_table, dense_k, dense_v


def dense_attention(q, k, v, scale, causal=True):
    """SDPA on one request: q [q_len, Hq, D], k/v [S, Hkv, D]; query j sees keys <= S - q_len + j."""
    q_len, hq, _ = q.shape
    s, hkv, _ = k.shape
    k = k.repeat_interleave(hq // hkv, dim=1)
    v = v.repeat_interleave(hq // hkv, dim=1)
    mask = None
    if causal:
        mask = torch.ones(q_len, s, dtype=torch.bool).tril(diagonal=s - q_len)
    out = F.scaled_dot_product_attention(
        q.double().transpose(0, 1),
        k.double().transpose(0, 1),
        v.double().transpose(0, 1),
        attn_mask=mask,
        scale=scale,
    )
    return out.transpose(0, 1)


@pytest.mark.parametrize(
    ("seqs", "q_lens", "hq", "hkv"),
    [
        ([7, 16, 33], [7, 16, 33], 4, 4),  # prefill
        ([9, 40, 17], [1, 1, 1], 4, 4),  # decode
        ([20, 35], [5, 12], 4, 4),  # chunked prefill with context
        ([21, 1, 30], [21, 1, 4], 8, 2),  # GQA, mixed prefill/decode/chunk
    ],
    ids=["prefill", "decode", "chunked", "gqa-mixed"],
)
def test_paged_attention_equals_dense_causal_attention(ref, seqs, q_lens, hq, hkv):
    d, dv, block_size = 16, 8, 8
    key_cache, value_cache, block_table, dk, dv_ = build_paged(ref, seqs, block_size, 32, hkv, d, dv)
    qsl = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()])
    query = torch.randn(int(qsl[-1]), hq, d)
    scale = 1 / math.sqrt(d)
    out = ref.fused_infer_attention(
        query, key_cache, value_cache, block_table, qsl, torch.tensor(seqs), scale
    )
    assert out.shape == (query.shape[0], hq, dv)
    for b in range(len(seqs)):
        expected = dense_attention(query[qsl[b] : qsl[b + 1]], dk[b], dv_[b], scale)
        torch.testing.assert_close(out[qsl[b] : qsl[b + 1]].double(), expected, atol=1e-5, rtol=1e-5)


def test_non_causal_attention_sees_all_keys(ref):
    key_cache, value_cache, block_table, dk, dv = build_paged(ref, [12], 4, 8, 2, 8, 8)
    query = torch.randn(5, 2, 8)
    out = ref.fused_infer_attention(
        query,
        key_cache,
        value_cache,
        block_table,
        torch.tensor([0, 5]),
        torch.tensor([12]),
        0.3,
        causal=False,
    )
    torch.testing.assert_close(
        out.double(), dense_attention(query, dk[0], dv[0], 0.3, causal=False), atol=1e-5, rtol=1e-5
    )


def test_attention_writes_into_output_and_keeps_padding_rows(ref):
    key_cache, value_cache, block_table, dk, dv = build_paged(ref, [6], 4, 4, 1, 8, 8)
    query = torch.randn(8, 2, 8)  # 2 padded rows past query_start_loc[-1]
    output = torch.full((10, 2, 8), 7.0)
    res = ref.fused_infer_attention(
        query,
        key_cache,
        value_cache,
        block_table,
        torch.tensor([0, 6]),
        torch.tensor([6]),
        0.5,
        output=output,
    )
    assert res.shape == (8, 2, 8) and res.data_ptr() == output.data_ptr()
    torch.testing.assert_close(
        output[:6].double(), dense_attention(query[:6], dk[0], dv[0], 0.5), atol=1e-5, rtol=1e-5
    )
    assert torch.all(output[6:] == 7.0)


def test_attention_fp32_accumulation_bf16_output(ref):
    key_cache, value_cache, block_table, dk, dv = build_paged(ref, [10], 4, 4, 2, 8, 8, dtype=torch.bfloat16)
    query = torch.randn(10, 4, 8).bfloat16()
    out = ref.fused_infer_attention(
        query, key_cache, value_cache, block_table, torch.tensor([0, 10]), torch.tensor([10]), 0.35
    )
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), dense_attention(query, dk[0], dv[0], 0.35), atol=1e-2, rtol=1e-2)


def test_attention_rejects_bad_inputs(ref):
    kc, vc, bt, _, _ = build_paged(ref, [8], 4, 4, 2, 8, 8)
    with pytest.raises(DeviceOpError, match=r"query heads \(3\) must be a multiple of KV heads \(2\)"):
        ref.fused_infer_attention(
            torch.randn(8, 3, 8), kc, vc, bt, torch.tensor([0, 8]), torch.tensor([8]), 1.0
        )
    with pytest.raises(DeviceOpError, match=r"query length 8 must be within \[0, seq_len=4\]"):
        ref.fused_infer_attention(
            torch.randn(8, 2, 8), kc, vc, bt, torch.tensor([0, 8]), torch.tensor([4]), 1.0
        )
    with pytest.raises(DeviceOpError, match="needs 5 blocks of 4 but block_table has 4 columns"):
        ref.fused_infer_attention(
            torch.randn(1, 2, 8), kc, vc, bt, torch.tensor([0, 1]), torch.tensor([17]), 1.0
        )


def test_a_plan_is_checked_once_and_refused_for_other_tensors(ref):
    kc, vc, bt, _, _ = build_paged(ref, [8], 4, 4, 2, 8, 8)
    starts, lens = torch.tensor([0, 8]), torch.tensor([8])
    plan = ref.plan_attention(bt, starts, lens, 4)
    assert (plan.starts, plan.lens, plan.q_lens, plan.decodes, plan.prefills, plan.num_tokens) == (
        (0, 8),
        (8,),
        (8,),
        (),
        (0,),
        8,
    )
    query = torch.randn(8, 4, 8)
    torch.testing.assert_close(
        ref.fused_infer_attention(query, kc, vc, bt, starts, lens, 0.5, plan=plan),
        ref.fused_infer_attention(query, kc, vc, bt, starts, lens, 0.5),
        rtol=0,
        atol=0,
    )
    with pytest.raises(
        DeviceOpError, match="plan was made for another block_table / query_start_loc / seq_lens"
    ):
        ref.fused_infer_attention(query, kc, vc, bt, starts.clone(), lens, 0.5, plan=plan)
    with pytest.raises(
        DeviceOpError, match="plan was made for block_size=4, causal=True; got block_size=4, causal=False"
    ):
        ref.fused_infer_attention(query, kc, vc, bt, starts, lens, 0.5, causal=False, plan=plan)
    # The checks a plan makes are the op's own, with the same messages.
    with pytest.raises(DeviceOpError, match=r"query length 8 must be within \[0, seq_len=4\]"):
        ref.plan_attention(bt, starts, torch.tensor([4]), 4)
    with pytest.raises(DeviceOpError, match="needs 5 blocks of 4 but block_table has 4 columns"):
        ref.plan_attention(bt, torch.tensor([0, 1]), torch.tensor([17]), 4)
    with pytest.raises(
        DeviceOpError, match=r"seq_lens\[0\]=17 needs 5 blocks of 4 but block_table has 4 columns"
    ):
        ref.kv_load(kc, vc, bt, torch.tensor([17]))
    with pytest.raises(
        DeviceOpError, match="query_start_loc has 3 entries, expected len\\(seq_lens\\) \\+ 1 = 2"
    ):
        ref.plan_attention(bt, torch.tensor([0, 1, 2]), lens, 4)
    with pytest.raises(DeviceOpError, match="2 requests but block_table has 1 rows"):
        ref.plan_attention(bt, torch.tensor([0, 1, 2]), torch.tensor([3, 3]), 4)
    with pytest.raises(DeviceOpError, match="block_size must be >= 1, got 0"):
        ref.plan_attention(bt, starts, lens, 0)


def _random_mixed_batch(gen, num_reqs):
    """Random (seq_len, q_len) pairs mixing decode (q=1), prefill (q=S), chunked (0<q<S) and idle (q=0)."""
    seqs, q_lens = [], []
    for _ in range(num_reqs):
        kind = int(torch.randint(0, 4, (), generator=gen))
        seq_len = int(torch.randint(1, 70, (), generator=gen))
        if kind == 0:
            q_len = 1
        elif kind == 1:
            q_len = seq_len
        elif kind == 2:
            q_len = int(torch.randint(1, seq_len + 1, (), generator=gen))
        else:
            q_len = 0 if seq_len > 1 else 1
        seqs.append(seq_len)
        q_lens.append(q_len)
    return seqs, q_lens


def _per_request(ref, query, key_cache, value_cache, block_table, qsl, seqs, scale, causal):
    """The batch as separate one-request calls, stitched back together."""
    parts = []
    for b in range(len(seqs)):
        q = query[qsl[b] : qsl[b + 1]]
        parts.append(
            ref.fused_infer_attention(
                q,
                key_cache,
                value_cache,
                block_table[b : b + 1],
                torch.tensor([0, q.shape[0]]),
                torch.tensor([seqs[b]]),
                scale,
                causal=causal,
            )
        )
    return torch.cat(parts)


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize(("hq", "hkv"), [(4, 4), (8, 2), (6, 1)], ids=["mha", "gqa", "mqa"])
def test_batched_attention_equals_per_request_and_dense(ref, seed, hq, hkv):
    gen = torch.Generator().manual_seed(seed)
    seqs, q_lens = _random_mixed_batch(gen, int(torch.randint(2, 9, (), generator=gen)))
    if seed % 2:  # also a group of similar prefills (batched together) and several decodes
        seqs, q_lens = [*seqs, 30, 28, 9, 31], [*q_lens, 30, 28, 1, 1]
    d, dv, block_size = 16, 8, 4
    num_blocks = sum(-(-s // block_size) for s in seqs) + 4
    key_cache, value_cache, block_table, dk, dv_ = build_paged(ref, seqs, block_size, num_blocks, hkv, d, dv)
    qsl = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()])
    query = torch.randn(int(qsl[-1]) + 3, hq, d)  # 3 padded rows past query_start_loc[-1]
    scale = 1 / math.sqrt(d)
    for causal in (True, False):
        output = torch.full((query.shape[0] + 2, hq, dv), 7.0)
        ref.reset_counts()
        out = ref.fused_infer_attention(
            query,
            key_cache,
            value_cache,
            block_table,
            qsl,
            torch.tensor(seqs),
            scale,
            causal=causal,
            output=output,
        )
        assert ref.call_counts == {"fused_infer_attention": 1}
        assert out.data_ptr() == output.data_ptr() and out.shape == (query.shape[0], hq, dv)
        assert torch.all(output[int(qsl[-1]) :] == 7.0)
        used = int(qsl[-1])
        per_req = _per_request(ref, query, key_cache, value_cache, block_table, qsl, seqs, scale, causal)
        torch.testing.assert_close(out[:used], per_req, atol=1e-5, rtol=1e-5)
        for b in range(len(seqs)):
            if q_lens[b]:
                expected = dense_attention(query[qsl[b] : qsl[b + 1]], dk[b], dv_[b], scale, causal)
                torch.testing.assert_close(out[qsl[b] : qsl[b + 1]].double(), expected, atol=1e-5, rtol=1e-5)


def test_batched_attention_bf16_non_contiguous_query_grouped_prefills(ref):
    # two decodes, then three similar prefill/chunked requests (attended as one padded group)
    seqs, q_lens = [13, 40, 30, 28, 31], [1, 1, 30, 28, 25]
    key_cache, value_cache, block_table, dk, dv = build_paged(ref, seqs, 8, 24, 2, 8, 8, dtype=torch.bfloat16)
    qsl = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()])
    query = torch.randn(int(qsl[-1]), 4, 16).bfloat16()[..., ::2]  # non-contiguous query
    out = ref.fused_infer_attention(query, key_cache, value_cache, block_table, qsl, torch.tensor(seqs), 0.3)
    assert out.dtype == torch.bfloat16
    for b in range(len(seqs)):
        expected = dense_attention(query[qsl[b] : qsl[b + 1]], dk[b], dv[b], 0.3)
        torch.testing.assert_close(out[qsl[b] : qsl[b + 1]].double(), expected, atol=1e-2, rtol=1e-2)


def test_batch_invariant_mode_attention_is_bitwise_batch_independent(ref, monkeypatch):
    monkeypatch.setenv("VLLM_ASCEND_BATCH_INVARIANT", "1")
    seqs, q_lens = [9, 40, 17, 33, 5], [1, 1, 17, 6, 1]
    key_cache, value_cache, block_table, _, _ = build_paged(ref, seqs, 8, 24, 2, 16, 16)
    qsl = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()])
    query = torch.randn(int(qsl[-1]), 4, 16)
    out = ref.fused_infer_attention(query, key_cache, value_cache, block_table, qsl, torch.tensor(seqs), 0.25)
    per_req = _per_request(ref, query, key_cache, value_cache, block_table, qsl, seqs, 0.25, True)
    assert torch.equal(out, per_req)


# -- reshape_and_cache / kv_load -----------------------------------------------------------------
def test_cache_rows_gathers_token_slots_from_contiguous_and_strided_caches():
    """One row gather where blocks and their tokens are one run of memory; block/offset indexing otherwise
    (a cache that is a strided view, e.g. K of an interleaved [blocks, 2, block_size, H, D] buffer)."""
    from vllm_ascend.kernels.device.reference import _cache_rows

    gen = torch.Generator().manual_seed(3)
    slots = torch.randint(0, 8 * 4, (3, 5), generator=gen)
    contiguous = torch.randn(8, 4, 2, 3, generator=gen)
    interleaved = torch.randn(8, 2, 4, 2, 3, generator=gen)[:, 1]
    for cache in (contiguous, interleaved):
        want = cache[torch.div(slots, 4, rounding_mode="floor"), slots % 4]
        got = _cache_rows(cache, slots)
        assert got.shape == (3, 5, 2, 3)
        assert torch.equal(got, want)
    assert interleaved.stride(0) != 4 * interleaved.stride(1)  # the strided path was taken


@pytest.mark.parametrize(
    "layout",
    ["per-head interleaved", "per-token interleaved", "per-block interleaved", "separate", "different dims"],
)
def test_kv_rows_gathers_keys_and_values_of_every_layout(layout):
    """Keys and values at token slots equal block/offset indexing of each cache, whether one gather of
    whole token rows serves both (they interleave per token) or each cache is gathered on its own."""
    from vllm_ascend.kernels.device.reference import _joint_row, _kv_rows

    gen = torch.Generator().manual_seed(5)
    blocks, bs, h, d = 8, 4, 2, 3
    if layout == "per-head interleaved":  # [blocks, bs, H, 2, D]
        buf = torch.randn(blocks, bs, h, 2, d, generator=gen)
        key_cache, value_cache = buf[:, :, :, 0], buf[:, :, :, 1]
    elif layout == "per-token interleaved":  # [blocks, bs, 2, H, D]
        buf = torch.randn(blocks, bs, 2, h, d, generator=gen)
        key_cache, value_cache = buf[:, :, 0], buf[:, :, 1]
    elif layout == "per-block interleaved":  # [blocks, 2, bs, H, D]: blocks and tokens not one run
        buf = torch.randn(blocks, 2, bs, h, d, generator=gen)
        key_cache, value_cache = buf[:, 0], buf[:, 1]
    elif layout == "separate":
        key_cache, value_cache = torch.randn(2, blocks, bs, h, d, generator=gen).unbind(0)
    else:  # MLA-like: values narrower than keys
        buf = torch.randn(blocks, bs, h, d + 2, generator=gen)
        key_cache, value_cache = buf, buf[..., :d]
    joint = _joint_row(key_cache, value_cache)
    assert (joint is not None) == (layout in ("per-head interleaved", "per-token interleaved"))
    slots = torch.randint(0, blocks * bs, (3, 5), generator=gen)
    got_k, got_v = _kv_rows(key_cache, value_cache, slots)
    for cache, got in ((key_cache, got_k), (value_cache, got_v)):
        want = cache[torch.div(slots, bs, rounding_mode="floor"), slots % bs]
        assert got.shape == want.shape
        assert torch.equal(got, want)
    if joint is not None:  # the two share one gathered buffer
        assert got_k.untyped_storage().data_ptr() == got_v.untyped_storage().data_ptr()


@pytest.mark.parametrize("layout", ["token rows", "per-block interleaved"])
def test_reshape_and_cache_writes_exactly_the_given_slots(ref, layout):
    """Into views of one buffer, tokens as rows ([blocks, bs, H, D + Dv]: one token axis) or K and V
    blocks interleaved ([blocks, 2, bs, H, D]: blocks and tokens not one run)."""
    if layout == "token rows":
        key_cache, value_cache = flat_cache_views(6, 4, 2, 8, 4)
        key, value = torch.randn(5, 2, 8), torch.randn(5, 2, 4)
    else:
        buf = torch.full((6, 2, 4, 2, 8), float("nan"))
        key_cache, value_cache = buf[:, 0], buf[:, 1]
        assert key_cache.stride(0) != 4 * key_cache.stride(1)
        key, value = torch.randn(5, 2, 8), torch.randn(5, 2, 8)
    assert not key_cache.is_contiguous()
    slots = torch.tensor([3, 17, -1, 0, 22])
    ref.reshape_and_cache(key, value, key_cache, value_cache, slots)
    written = torch.zeros(6, 4, dtype=torch.bool)
    for t, s in enumerate(slots.tolist()):
        if s < 0:
            continue
        written[s // 4, s % 4] = True
        assert torch.equal(key_cache[s // 4, s % 4], key[t])
        assert torch.equal(value_cache[s // 4, s % 4], value[t])
    assert torch.isnan(key_cache[~written]).all() and torch.isnan(value_cache[~written]).all()
    assert int(written.sum()) == 4


@pytest.mark.parametrize("few_slots", [0, 64])  # the slot bounds on numpy, then on Python ints
def test_reshape_and_cache_rejects_out_of_range_and_mismatched_heads(ref, monkeypatch, few_slots):
    monkeypatch.setattr(host_attention, "FEW_SLOTS", few_slots)
    key_cache, value_cache = flat_cache_views(2, 4, 2, 8, 8)
    with pytest.raises(DeviceOpError, match="slot 8 is out of range for a cache of 2 blocks x 4"):
        ref.reshape_and_cache(
            torch.randn(1, 2, 8), torch.randn(1, 2, 8), key_cache, value_cache, torch.tensor([8])
        )
    with pytest.raises(DeviceOpError, match="slot 9 is out of range for a cache of 2 blocks x 4"):
        ref.reshape_and_cache(
            torch.randn(3, 2, 8), torch.randn(3, 2, 8), key_cache, value_cache, torch.tensor([-1, 9, 2])
        )
    assert key_cache.isnan().all() and value_cache.isnan().all()  # refused before anything is written
    with pytest.raises(DeviceOpError, match="key_cache has 2 KV heads, expected 3"):
        ref.reshape_and_cache(
            torch.randn(1, 3, 8), torch.randn(1, 3, 8), key_cache, value_cache, torch.tensor([0])
        )


def test_kv_load_gathers_each_request_in_order(ref):
    key_cache, value_cache, block_table, dk, dv = build_paged(ref, [5, 12, 1], 4, 16, 2, 8, 6)
    k, v = ref.kv_load(key_cache, value_cache, block_table, torch.tensor([5, 12, 1]))
    assert torch.equal(k, torch.cat(dk)) and torch.equal(v, torch.cat(dv))


# -- norms, activation, rotary ---------------------------------------------------------------------
def test_rms_norm_matches_torch_rms_norm(ref):
    x, w = torch.randn(4, 64).half(), torch.randn(64).half()
    expected = F.rms_norm(x.float(), (64,), w.float(), eps=1e-6).half()
    out = ref.rms_norm(x, w, 1e-6)
    assert out.dtype == torch.float16
    torch.testing.assert_close(out, expected)


def test_add_rms_norm_returns_normed_sum_and_sum(ref):
    x, r, w = torch.randn(3, 32).bfloat16(), torch.randn(3, 32).bfloat16(), torch.randn(32)
    normed, total = ref.add_rms_norm(x, r, w, 1e-5)
    s = x.float() + r.float()
    torch.testing.assert_close(total, s.bfloat16())
    torch.testing.assert_close(normed, F.rms_norm(s, (32,), w, eps=1e-5).bfloat16())


def test_swiglu_is_silu_of_first_half_times_second(ref):
    x = torch.randn(3, 5, 16)
    a, b = x[..., :8], x[..., 8:]
    torch.testing.assert_close(ref.swiglu(x), a * torch.sigmoid(a) * b)
    with pytest.raises(DeviceOpError, match="even last dim, got 7"):
        ref.swiglu(torch.randn(2, 7))


def rope_cache(max_pos, rot_dim, base=10000.0):
    inv_freq = 1.0 / base ** (torch.arange(0, rot_dim, 2).float() / rot_dim)
    freqs = torch.outer(torch.arange(max_pos).float(), inv_freq)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1), freqs


@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("rot_dim", [16, 8])
def test_rotary_equals_complex_rotation(ref, is_neox, rot_dim):
    head_size, hq, hkv, t = 16, 4, 2, 6
    cache, freqs = rope_cache(32, rot_dim)
    positions = torch.tensor([0, 3, 7, 7, 20, 31])
    q, k = torch.randn(t, hq * head_size), torch.randn(t, hkv * head_size)
    q_out, k_out = ref.rotary_embedding(positions, q, k, head_size, cache, is_neox)
    angle = torch.polar(torch.ones_like(freqs[positions]), freqs[positions]).unsqueeze(1)  # e^{i theta}

    def expected(x, heads):
        x = x.view(t, heads, head_size).double()
        rot, rest = x[..., :rot_dim], x[..., rot_dim:]
        if is_neox:
            z = torch.complex(rot[..., : rot_dim // 2], rot[..., rot_dim // 2 :]) * angle
            rotated = torch.cat((z.real, z.imag), dim=-1)
        else:
            z = torch.complex(rot[..., 0::2], rot[..., 1::2]) * angle
            rotated = torch.stack((z.real, z.imag), dim=-1).flatten(-2)
        return torch.cat((rotated, rest), dim=-1).view(t, heads * head_size).float()

    torch.testing.assert_close(q_out, expected(q, hq), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(k_out, expected(k, hkv), atol=1e-5, rtol=1e-5)
    if rot_dim < head_size:  # the tail of each head is untouched
        assert torch.equal(
            q_out.view(t, hq, head_size)[..., rot_dim:], q.view(t, hq, head_size)[..., rot_dim:]
        )


# -- MoE -------------------------------------------------------------------------------------------
def test_gating_top_k_equals_softmax_topk_renormalise(ref):
    logits = torch.randn(7, 16)
    weights, ids = ref.moe_gating_top_k(logits, 3)
    assert weights.dtype == torch.float32 and ids.dtype == torch.int32
    probs = torch.softmax(logits.double(), dim=-1)
    sorted_p, sorted_i = probs.sort(dim=-1, descending=True)
    assert torch.equal(ids.long(), sorted_i[:, :3])
    torch.testing.assert_close(weights.double(), sorted_p[:, :3] / sorted_p[:, :3].sum(-1, keepdim=True))
    raw, _ = ref.moe_gating_top_k(logits, 3, renormalize=False)
    torch.testing.assert_close(raw.double(), sorted_p[:, :3])


def test_grouped_sigmoid_gating_with_bias_matches_a_naive_loop(ref):
    """With a bias each group is scored by the sum of its two best biased scores (DeepSeek-V3 / vLLM)."""
    logits, bias = torch.randn(5, 12), torch.randn(12)
    weights, ids = ref.moe_gating_top_k(
        logits, 2, scoring="sigmoid", bias=bias, num_groups=4, topk_groups=2, routed_scaling_factor=2.5
    )
    for t in range(5):
        scores = [1 / (1 + math.exp(-float(v))) for v in logits[t]]
        sel = [s + float(b) for s, b in zip(scores, bias, strict=True)]
        groups = sorted(range(4), key=lambda g: -sum(sorted(sel[g * 3 : g * 3 + 3])[-2:]))[:2]
        eligible = [e for e in range(12) if e // 3 in groups]
        top = sorted(eligible, key=lambda e: -sel[e])[:2]
        assert ids[t].tolist() == top
        w = [scores[e] for e in top]
        assert weights[t].tolist() == pytest.approx([2.5 * x / sum(w) for x in w], rel=1e-5)


def test_grouped_gating_without_bias_scores_groups_by_their_best_expert(ref):
    logits = torch.randn(6, 16)
    weights, ids = ref.moe_gating_top_k(logits, 3, num_groups=4, topk_groups=1, renormalize=False)
    probs = torch.softmax(logits.double(), dim=-1)
    for t in range(6):
        best = max(range(4), key=lambda g: float(probs[t, g * 4 : g * 4 + 4].max()))
        top = sorted(range(best * 4, best * 4 + 4), key=lambda e: -float(probs[t, e]))[:3]
        assert ids[t].tolist() == top
        assert weights[t].tolist() == pytest.approx([float(probs[t, e]) for e in top], rel=1e-5)


@pytest.mark.parametrize(
    ("shape", "k", "kwargs", "message"),
    [
        ((2, 10), 2, {"num_groups": 4}, "num_experts=10 must be divisible by num_groups=4"),
        ((2, 8), 2, {"num_groups": 4, "topk_groups": 5}, r"topk_groups=5 must be within \[1, num_groups=4\]"),
        ((2, 8), 2, {"num_groups": 4, "topk_groups": 0}, r"topk_groups=0 must be within \[1, num_groups=4\]"),
        ((2, 8), 2, {"num_groups": 0}, "num_groups=0 must be >= 1"),
        (
            (2, 16),
            5,
            {"num_groups": 4, "topk_groups": 1},
            r"k=5 must be within \[1, 4\] \(the experts of topk_groups=1 groups of 4\)",
        ),
        ((2, 8), 0, {}, r"k=0 must be within \[1, 8\]"),
        ((2, 8), 2, {"bias": torch.zeros(7)}, r"bias must be \[num_experts=8\], got shape \(7,\)"),
        (
            (2, 8),
            2,
            {"bias": torch.zeros(8), "num_groups": 8, "topk_groups": 2},
            "scores each group by its top-2 experts; num_experts=8 / num_groups=8 leaves 1 per group",
        ),
        ((8,), 2, {}, r"router_logits must be \[T, E\], got shape \(8,\)"),
    ],
)
def test_gating_rejects_bad_groups_and_shapes(ref, shape, k, kwargs, message):
    with pytest.raises(DeviceOpError, match=message):
        ref.moe_gating_top_k(torch.randn(*shape), k, **kwargs)


def test_gating_rejects_unknown_scoring(ref):
    with pytest.raises(DeviceOpError, match="scoring='relu' is invalid; allowed values: softmax, sigmoid"):
        ref.moe_gating_top_k(torch.randn(2, 4), 1, scoring="relu")


def test_init_routing_groups_copies_by_expert_and_finalize_inverts_it(ref):
    x = torch.randn(6, 4)
    ids = torch.tensor([[2, 0], [1, 2], [0, 3], [3, 1], [2, 2], [0, 1]], dtype=torch.int32)
    sorted_x, row_idx, counts = ref.moe_init_routing(x, ids, 5)
    assert counts.tolist() == [3, 3, 4, 2, 0] and counts.dtype == torch.int64
    flat = ids.reshape(-1).tolist()
    expected_order = sorted(range(12), key=lambda i: (flat[i], i))
    assert torch.equal(sorted_x, x[[i // 2 for i in expected_order]])
    for i in range(12):  # token i//2's choice i%2 sits at row row_idx[i]
        assert torch.equal(sorted_x[row_idx[i]], x[i // 2])
    w = torch.rand(6, 2)
    expert_out = sorted_x * 3.0
    out = ref.moe_finalize_routing(expert_out, row_idx, w)
    torch.testing.assert_close(out, 3.0 * x * w.sum(-1, keepdim=True))


def test_routed_moe_equals_dense_per_token_loop(ref):
    t, h, n, e, k = 9, 8, 6, 4, 2
    x, w = torch.randn(t, h), torch.randn(e, h, n)
    weights, ids = ref.moe_gating_top_k(torch.randn(t, e), k)
    sorted_x, row_idx, counts = ref.moe_init_routing(x, ids, e)
    out = ref.moe_finalize_routing(ref.grouped_matmul(sorted_x, w, counts), row_idx, weights)
    expected = torch.stack([sum(weights[i, j] * (x[i] @ w[ids[i, j]]) for j in range(k)) for i in range(t)])
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_grouped_matmul_equals_per_group_matmul(ref):
    x, w = torch.randn(10, 6), torch.randn(3, 6, 5)
    counts = torch.tensor([4, 0, 5])
    out = ref.grouped_matmul(x, w, counts)
    expected = torch.cat([x[:4] @ w[0], x[4:9] @ w[2], torch.zeros(1, 5)])
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(ref.grouped_matmul(x, w, counts.cumsum(0), group_list_type="cumsum"), expected)
    with pytest.raises(
        DeviceOpError, match="group_list_type='sizes' is invalid; allowed values: count, cumsum"
    ):
        ref.grouped_matmul(x, w, counts, group_list_type="sizes")
    with pytest.raises(DeviceOpError, match="group_list covers 11 rows but x has only 10"):
        ref.grouped_matmul(x, w, torch.tensor([4, 2, 5]))


# -- quantization ---------------------------------------------------------------------------------
def test_dynamic_quant_round_trip_within_half_a_step(ref):
    x = torch.randn(5, 3, 64) * torch.tensor([0.01, 1.0, 100.0]).view(1, 3, 1)
    x[0, 0] = 0.0
    q, scale = ref.dynamic_quant(x)
    assert q.dtype == torch.int8 and scale.shape == (5, 3) and scale.dtype == torch.float32
    torch.testing.assert_close(scale, x.abs().amax(-1) / 127)
    assert q.abs().amax(-1)[scale > 0].eq(127).all()  # the row max maps to +-127
    err = (q.float() * scale.unsqueeze(-1) - x).abs()
    assert torch.all(err <= scale.unsqueeze(-1) * 0.5 + 1e-6)
    assert torch.all(q[0, 0] == 0) and scale[0, 0] == 0


def test_dynamic_quant_with_smooth_scales(ref):
    x, s = torch.randn(4, 16), torch.rand(16) + 0.5
    q, scale = ref.dynamic_quant(x, smooth_scales=s)
    assert torch.all((q.float() * scale.unsqueeze(-1) - x * s).abs() <= scale.unsqueeze(-1) * 0.5 + 1e-6)


def test_grouped_matmul_swiglu_quant_matches_dequant_swiglu_requant(ref):
    m, kdim, n2 = 7, 16, 8
    x = torch.randint(-128, 128, (m, kdim), dtype=torch.int8)
    w = torch.randint(-128, 128, (2, kdim, n2), dtype=torch.int8)
    xs, ws = torch.rand(m) * 0.01, torch.rand(2, n2) * 0.01
    ends = torch.tensor([3, 6])  # row 6 is past the last group
    q, scale = ref.grouped_matmul_swiglu_quant(x, w, ends, ws, xs)
    for g, (lo, hi) in enumerate([(0, 3), (3, 6)]):
        y = (x[lo:hi].double() @ w[g].double()) * xs[lo:hi, None].double() * ws[g].double()
        act = y[:, :4] * torch.sigmoid(y[:, :4]) * y[:, 4:]
        assert torch.all(
            (q[lo:hi].double() * scale[lo:hi, None].double() - act).abs() <= scale[lo:hi, None] * 0.5 + 1e-6
        )
    assert torch.all(q[6] == 0) and scale[6] == 0


def test_quant_matmul_and_weight_quant_matmul_equal_dequantised_matmul(ref):
    x = torch.randint(-128, 128, (3, 8), dtype=torch.int8)
    w = torch.randint(-128, 128, (8, 4), dtype=torch.int8)
    ws, ts, bias = torch.rand(4), torch.rand(3), torch.randn(4)
    out = ref.quant_matmul(x, w, ws, pertoken_scale=ts, bias=bias, output_dtype=torch.float32)
    torch.testing.assert_close(
        out, ((x.double() @ w.double()) * ws.double() * ts.double()[:, None] + bias.double()).float()
    )
    a = torch.randn(2, 8)
    scale, offset = torch.rand(2, 4), torch.randn(2, 4)
    out = ref.weight_quant_matmul(a, w, scale, antiquant_offset=offset, group_size=4)
    deq = torch.cat([(w[:4].float() + offset[0]) * scale[0], (w[4:].float() + offset[1]) * scale[1]])
    torch.testing.assert_close(out, a @ deq, atol=1e-4, rtol=1e-4)
    with pytest.raises(DeviceOpError, match=r"antiquant_scale must be \[2, 4\] for group_size=4"):
        ref.weight_quant_matmul(a, w, torch.rand(4), group_size=4)


# -- call counting ----------------------------------------------------------------------------------
def test_every_op_is_counted_once_per_call(ref):
    x = torch.randn(2, 8)
    ref.rms_norm(x, torch.ones(8), 1e-6)
    ref.rms_norm(x, torch.ones(8), 1e-6)
    ref.swiglu(x)
    assert ref.call_counts == {"rms_norm": 2, "swiglu": 1}

    class Wrapped(ReferenceDeviceAdaptor):
        def swiglu(self, x):
            return super().swiglu(x) * 2

    wrapped = Wrapped()
    torch.testing.assert_close(wrapped.swiglu(x), 2 * ref.swiglu(x))
    assert wrapped.call_counts == {"swiglu": 1}
    assert set(OPS) <= {
        n
        for n in dir(ReferenceDeviceAdaptor)
        if getattr(getattr(ReferenceDeviceAdaptor, n), "__counted__", False)
    }


# -- random_fill: the samplers' random draws (default: on the tensor's device with torch) -------------------
def test_random_fill_default_draws_the_global_rng_then_each_seeded_segment_from_its_generator(ref):
    """vLLM's ``generate_uniform_probs`` order: every row from the global RNG, then a seeded request's rows again
    from its own generator (so they do not depend on the batch); a segment of zero rows draws nothing."""
    torch.manual_seed(1)
    got = ref.random_fill(
        torch.empty(6, dtype=torch.float64),
        "uniform",
        {1: torch.Generator().manual_seed(4), 2: torch.Generator().manual_seed(5)},
        counts=[2, 3, 0, 1],
    )
    torch.manual_seed(1)
    expected = torch.rand(6, dtype=torch.float64)
    expected[2:5].uniform_(generator=torch.Generator().manual_seed(4))
    assert torch.equal(got, expected)
    assert ref.call_counts["random_fill"] == 1


def test_random_fill_seeds_and_exponentials_keep_their_ranges(ref):
    seeds = ref.random_fill(
        torch.empty(512, dtype=torch.int64), "seed", {0: torch.Generator().manual_seed(2)}
    )
    assert bool(((seeds >= 0) & (seeds < 1 << 62)).all()) and seeds.unique().numel() == 512
    assert seeds[0] == torch.randint(0, 1 << 62, (1,), generator=torch.Generator().manual_seed(2))[0]
    exp = ref.random_fill(torch.empty(8, 1024, dtype=torch.float16), "exponential")
    assert bool((exp >= torch.finfo(torch.float16).tiny).all())
    assert abs(float(exp.float().mean()) - 1.0) < 0.05


def test_random_fill_refuses_arguments_outside_its_contract(ref):
    with pytest.raises(DeviceOpError, match="distribution='gumbel' is invalid"):
        ref.random_fill(torch.empty(2), "gumbel")
    with pytest.raises(DeviceOpError, match="needs an int64 out"):
        ref.random_fill(torch.empty(2), "seed")
    with pytest.raises(DeviceOpError, match=r"must be non-negative and sum to out's 2 rows"):
        ref.random_fill(torch.empty(2), "uniform", counts=[3, -1])
