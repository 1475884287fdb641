"""The NPU adaptors' glue (layouts, index conventions, option mapping) against emulated torch_npu ops.

A stand-in ``torch_npu`` module implements each op from the formula and layout its documentation
in the torch-npu 2.13.0 wheel states (e.g. ``npu_moe_finalize_routing`` reads
``expanded_src_to_dst_row[i + k * num_rows]``; ``npu_grouped_matmul``'s ``group_list_type`` 0 is
cumsum, 1 is count; ``npu_rotary_mul``'s half/interleave formulas; rows past the groups are garbage).
Each NPU adaptor, run through it on CPU tensors, must agree with the reference adaptor.
"""

from __future__ import annotations

import math
import sys
import types
from collections import Counter

import pytest
import torch
import torch.nn.functional as F

from vllm_ascend.core.device.adaptor.base import DeviceOpError
from vllm_ascend.kernels.device.a5 import A5DeviceAdaptor
from vllm_ascend.kernels.device.npu import A2A3DeviceAdaptor
from vllm_ascend.kernels.device.reference import ReferenceDeviceAdaptor

GARBAGE = 1e4  # what the emulated kernels leave in rows past the last group


def _paged_rows(cache: torch.Tensor, block_table_row: torch.Tensor, length: int, heads: int) -> torch.Tensor:
    num_blocks = -(-length // cache.shape[1])
    rows = cache[block_table_row[:num_blocks].long()].reshape(-1, cache.shape[-1])[:length]
    return rows.view(length, heads, -1).double()


def _attend(q, k, v, scale, causal):
    """q [q, Hq, D], k/v [S, Hkv, D]; right-down causal: query j sees keys <= S - q + j."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = torch.einsum("qhd,shd->hqs", q.double(), k) * scale
    if causal:
        allowed = torch.ones(q.shape[0], k.shape[0], dtype=torch.bool).tril(k.shape[0] - q.shape[0])
        scores = scores.masked_fill(~allowed, -math.inf)
    return torch.einsum("hqs,shd->qhd", scores.softmax(-1), v)


class FakeTorchNpu(types.ModuleType):
    """torch_npu ops as their documentation describes them (CPU, float64 math)."""

    def __init__(self) -> None:
        super().__init__("torch_npu")
        self.calls: Counter[str] = Counter()
        self.formats: Counter[int] = Counter()

    def __getattribute__(self, name: str):
        if name.startswith("npu_"):
            object.__getattribute__(self, "calls")[name] += 1
        return object.__getattribute__(self, name)

    def npu_rms_norm(self, x, gamma, epsilon=1e-6):
        rstd = torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + epsilon)
        return (x.double() * rstd * gamma.double()).to(x.dtype), rstd.float()

    def npu_swiglu(self, x, dim=-1):
        a, b = x.double().chunk(2, dim=dim)
        return (F.silu(a) * b).to(x.dtype)

    def npu_rotary_mul(self, x, r1, r2, rotary_mode="half"):
        assert x.dim() == 4 and r1.dim() == 4, "npu_rotary_mul takes 4-D input/r1/r2"
        xd = x.double()
        if rotary_mode == "half":
            x1, x2 = xd.chunk(2, -1)
            x_new = torch.cat((-x2, x1), -1)
        else:
            x_new = torch.stack((-xd[..., 1::2], xd[..., ::2]), -1).flatten(-2)
        return (r1.double() * xd + r2.double() * x_new).to(x.dtype)

    def npu_mrope(
        self, positions, query, key, cos_sin_cache, head_size, *, mrope_section=None, rotary_mode="half"
    ):
        """Chunked sections: the first t frequencies of a [3, T] position from T, next h from H, last w from W;
        [T] positions with section [0, 0, 0] rotate like plain rope."""
        rot = cos_sin_cache.shape[-1]
        cos, sin = cos_sin_cache.double()[positions.long()].chunk(2, -1)
        if positions.dim() == 2:
            assert sum(mrope_section) == rot // 2, mrope_section
            cos = torch.cat([part[i] for i, part in enumerate(cos.split(mrope_section, -1))], -1)
            sin = torch.cat([part[i] for i, part in enumerate(sin.split(mrope_section, -1))], -1)
        else:
            assert list(mrope_section) == [0, 0, 0], mrope_section

        def rotate(x):
            heads = x.double().view(x.shape[0], -1, head_size)
            r, rest = heads[..., :rot], heads[..., rot:]
            c, s_ = cos.unsqueeze(1), sin.unsqueeze(1)
            if rotary_mode == "half":
                x1, x2 = r.chunk(2, -1)
                out = torch.cat((x1 * c - x2 * s_, x2 * c + x1 * s_), -1)
            else:
                x1, x2 = r[..., 0::2], r[..., 1::2]
                out = torch.stack((x1 * c - x2 * s_, x2 * c + x1 * s_), -1).flatten(-2)
            return torch.cat((out, rest), -1).reshape(x.shape).to(x.dtype)

        return rotate(query), rotate(key)

    def npu_dynamic_quant(self, x, *, smooth_scales=None, group_index=None, dst_type=None):
        xd = x.double() * (smooth_scales.double() if smooth_scales is not None else 1.0)
        scale = xd.abs().amax(-1) / 127
        q = torch.round(xd / scale.clamp_min(1e-300).unsqueeze(-1)).clamp(-128, 127).to(torch.int8)
        return q, scale.float()

    def npu_moe_gating_top_k(
        self,
        x,
        k,
        bias=None,
        input_ids=None,
        tid2eid=None,
        k_group=1,
        group_count=1,
        group_select_mode=0,
        renorm=0,
        norm_type=0,
        out_flag=False,
        routed_scaling_factor=1.0,
        eps=1e-20,
    ):
        num_experts = x.shape[-1]
        per = num_experts // group_count
        assert x.dim() == 2 and num_experts <= 2048 and renorm == 0 and group_select_mode in (0, 1)
        assert bias is None or (bias.dtype == x.dtype and tuple(bias.shape) == (num_experts,))
        assert group_count > 0 and num_experts % group_count == 0 and per > 2
        assert -(-per // 32) * 32 * group_count <= 2048 and 1 <= k_group <= group_count
        assert 1 <= k <= per * k_group
        norm = torch.softmax(x.double(), -1) if norm_type == 0 else torch.sigmoid(x.double())
        sel = norm + (bias.double() if bias is not None else 0)
        if group_count > 1:
            grouped = sel.view(-1, group_count, per)
            group_score = grouped.topk(2, -1).values.sum(-1) if group_select_mode == 1 else grouped.amax(-1)
            top = group_score.topk(k_group, -1).indices
            keep = torch.zeros(x.shape[0], group_count, dtype=torch.bool).scatter_(1, top, True)
            sel = sel.masked_fill(~keep.repeat_interleave(per, 1), -math.inf)
        idx = sel.topk(k, -1).indices
        y = norm.gather(1, idx)
        y = y / (y.sum(-1, keepdim=True) + eps) * routed_scaling_factor
        return y.to(x.dtype), idx.to(torch.int32), norm.float()

    def npu_moe_finalize_routing(
        self, rows, skip1, skip2, bias, scales, src_to_dst, export_for_source_row, drop_pad_mode=0, k=1
    ):
        assert skip1 is None and skip2 is None and bias is None and drop_pad_mode == 0
        num_rows, top_k = scales.shape
        out = torch.zeros(num_rows, rows.shape[1], dtype=torch.float64)
        for i in range(num_rows):
            for j in range(top_k):
                out[i] += scales[i, j].double() * rows[src_to_dst[i + j * num_rows]].double()
        return out.to(rows.dtype)

    def _group_ends(self, group_list, group_list_type):
        return group_list.tolist() if group_list_type == 0 else group_list.cumsum(0).tolist()

    def npu_grouped_matmul(
        self,
        x,
        weight,
        *,
        group_list=None,
        split_item=0,
        group_type=None,
        group_list_type=0,
        scale=None,
        per_token_scale=None,
        output_dtype=None,
        **unused,
    ):
        assert split_item == 2 and group_type == 0 and len(x) == 1 and len(weight) == 1 and not unused
        xs, w = x[0], weight[0]
        assert scale is None or w.dtype == torch.int8  # per-token quant: int8 weights only
        out = torch.full((xs.shape[0], w.shape[-1]), GARBAGE, dtype=torch.float64)
        start = 0
        for g, end in enumerate(self._group_ends(group_list, group_list_type)):
            y = xs[start:end].double() @ w[g].double()
            if scale is not None:
                y = y * scale[0][g].double() * per_token_scale[0][start:end].double().unsqueeze(1)
            out[start:end] = y
            start = end
        return [out.to(output_dtype or xs.dtype)]

    def npu_grouped_matmul_swiglu_quant(
        self, x, weight, group_list, weight_scale, x_scale, *, bias=None, offset=None
    ):
        ends = group_list.tolist()  # documented: valid rows end at group_list[-1] (cumsum)
        q = torch.full((x.shape[0], weight.shape[-1] // 2), 99, dtype=torch.int8)
        scale = torch.full((x.shape[0],), GARBAGE)
        start = 0
        for g, end in enumerate(ends):
            y = (
                (x[start:end].double() @ weight[g].double())
                * x_scale[start:end, None].double()
                * weight_scale[g].double()
            )
            q[start:end], scale[start:end] = self.npu_dynamic_quant(self.npu_swiglu(y))
            start = end
        return q, scale, None

    def npu_quantize(self, input, scales, zero_points, dtype, axis=1, div_mode=True):
        assert dtype == torch.qint8 and div_mode and scales.dtype in (torch.float32, torch.bfloat16)
        assert zero_points is None or zero_points.dtype == torch.int8
        y = torch.round(input.double() / scales.double()) + (
            zero_points.double() if zero_points is not None else 0
        )
        return y.clamp(-128, 127).to(torch.int8)

    def npu_trans_quant_param(self, scale, offset=None, round_mode=0):
        # float32 -> the int64 the kernels read: fp19 (mantissa truncated to 10 bits) in the low 32 bits.
        assert scale.dtype == torch.float32 and offset is None and round_mode == 0
        return (scale.view(torch.int32).to(torch.int64) & 0xFFFFE000) & 0xFFFFFFFF

    def npu_format_cast(self, tensor, acl_format):
        assert acl_format in (2, 29)
        self.formats[acl_format] += 1
        return tensor

    def npu_quant_matmul(
        self, x1, x2, scale, *, offset=None, pertoken_scale=None, bias=None, output_dtype=None
    ):
        assert x1.dtype == x2.dtype == torch.int8  # int8 activations take int8 weights only
        if scale.dtype == torch.int64:
            scale = scale.to(torch.int32).view(torch.float32)
        acc = x1.long() @ x2.long() + (bias.long() if bias is not None else 0)
        assert bias is None or bias.dtype == torch.int32
        y = acc.double() * scale.double()
        if pertoken_scale is not None:
            y = y * pertoken_scale.double().unsqueeze(-1)
        return y.to(output_dtype or torch.int8)

    def npu_weight_quant_batchmatmul(
        self,
        x,
        weight,
        antiquant_scale,
        antiquant_offset=None,
        quant_scale=None,
        quant_offset=None,
        bias=None,
        antiquant_group_size=0,
        inner_precise=0,
    ):
        def expand(p):
            return (
                p.double().repeat_interleave(antiquant_group_size, 0)[: weight.shape[0]]
                if antiquant_group_size
                else p.double()
            )

        assert x.numel() and antiquant_scale.dtype == x.dtype  # documented: no empty tensors
        assert bias is None or bias.dtype == (torch.float32 if x.dtype == torch.bfloat16 else x.dtype)
        if weight.dtype == torch.int32:  # int4 carried in int32: nibble j of each word is element j
            nibbles = torch.stack([(weight >> (4 * j)) & 0xF for j in range(8)], dim=-1).flatten(-2)
            weight = torch.where(nibbles >= 8, nibbles - 16, nibbles)
        w = weight.double() + (expand(antiquant_offset) if antiquant_offset is not None else 0)
        y = x.double() @ (w * expand(antiquant_scale))
        return (y + (bias.double() if bias is not None else 0)).to(x.dtype)

    def npu_scatter_pa_kv_cache(
        self, key, value, key_cache, value_cache, slot_mapping, *, cache_mode="PA_NZ", **unused
    ):
        # Documented constraints: contiguous inputs, slots within [0, num_blocks * block_size).
        assert cache_mode == "Norm" and not unused
        assert all(t.is_contiguous() for t in (key, value, key_cache, value_cache))
        assert key.shape[0] == slot_mapping.shape[0] and bool((slot_mapping >= 0).all())
        bs = key_cache.shape[1]
        for t, s in enumerate(slot_mapping.tolist()):
            key_cache[s // bs, s % bs] = key[t]
            value_cache[s // bs, s % bs] = value[t]

    def _paged_fia(
        self,
        query,
        key,
        value,
        *,
        mask,
        q_ends,
        kv_lens,
        block_table,
        heads,
        kv_heads,
        scale,
        layout,
        sparse_mode,
        block_size,
    ):
        assert layout == "TND" and key.dim() == 3 and block_size == key.shape[1]
        assert sparse_mode in (0, 3) and (sparse_mode == 0 or tuple(mask.shape) == (2048, 2048))
        out, start = [], 0
        for b, end in enumerate(q_ends):  # TND: cumulative query lengths
            k = _paged_rows(key, block_table[b], kv_lens[b], kv_heads)
            v = _paged_rows(value, block_table[b], kv_lens[b], kv_heads)
            out.append(_attend(query[start:end].view(end - start, heads, -1), k, v, scale, sparse_mode == 3))
            start = end
        return torch.cat(out).to(query.dtype), torch.zeros(1)

    def npu_fused_infer_attention_score(
        self,
        query,
        key,
        value,
        *,
        atten_mask=None,
        actual_seq_lengths=None,
        actual_seq_lengths_kv=None,
        block_table=None,
        num_heads=1,
        num_key_value_heads=0,
        scale=1.0,
        input_layout="BSH",
        sparse_mode=0,
        block_size=0,
        **unused,
    ):
        assert not unused
        return self._paged_fia(
            query,
            key,
            value,
            mask=atten_mask,
            q_ends=actual_seq_lengths,
            kv_lens=actual_seq_lengths_kv,
            block_table=block_table,
            heads=num_heads,
            kv_heads=num_key_value_heads,
            scale=scale,
            layout=input_layout,
            sparse_mode=sparse_mode,
            block_size=block_size,
        )

    def npu_fused_infer_attention_score_v2(
        self,
        query,
        key,
        value,
        *,
        atten_mask=None,
        actual_seq_qlen=None,
        actual_seq_kvlen=None,
        block_table=None,
        num_query_heads=1,
        num_key_value_heads=0,
        softmax_scale=1.0,
        input_layout="BSH",
        sparse_mode=0,
        block_size=0,
        **unused,
    ):
        assert not unused
        return self._paged_fia(
            query,
            key,
            value,
            mask=atten_mask,
            q_ends=actual_seq_qlen,
            kv_lens=actual_seq_kvlen,
            block_table=block_table,
            heads=num_query_heads,
            kv_heads=num_key_value_heads,
            scale=softmax_scale,
            layout=input_layout,
            sparse_mode=sparse_mode,
            block_size=block_size,
        )

    def npu_prompt_flash_attention(
        self,
        query,
        key,
        value,
        *,
        atten_mask=None,
        num_heads=1,
        scale_value=1.0,
        pre_tokens=2147483647,
        next_tokens=0,
        input_layout="BSH",
        sparse_mode=0,
        **unused,
    ):
        # 310P: BSND, no num_key_value_heads, sparse_mode 0 with a full (Q_S, KV_S) mask (True = masked).
        assert input_layout == "BSND" and sparse_mode == 0 and not unused and key.shape[2] == num_heads
        assert next_tokens == pre_tokens == 2147483647
        scores = torch.einsum("qhd,shd->hqs", query[0].double(), key[0].double()) * scale_value
        if atten_mask is not None:
            scores = scores.masked_fill(atten_mask.view(1, *atten_mask.shape[-2:]), -math.inf)
        return (
            torch.einsum("hqs,shd->qhd", scores.softmax(-1), value[0].double()).unsqueeze(0).to(query.dtype)
        )

    def npu_fusion_attention(
        self,
        query,
        key,
        value,
        head_num,
        input_layout,
        *,
        scale=1.0,
        atten_mask=None,
        sparse_mode=0,
        actual_seq_qlen=None,
        actual_seq_kvlen=None,
        **unused,
    ):
        # TND varlen: cumulative per-sequence ends; N2 KV heads may divide N1; sparse_mode 3 =
        # right-down causal from the compressed 2048x2048 mask (True = masked); 0 with no mask = full.
        assert input_layout == "TND" and not unused and query.shape[1] == head_num
        assert (sparse_mode, atten_mask is None) in ((0, True), (3, False))
        if atten_mask is not None:
            assert atten_mask.dtype == torch.bool and tuple(atten_mask.shape) == (2048, 2048)
        out = torch.full_like(query, GARBAGE)
        start = 0
        for q_end, kv_end in zip(actual_seq_qlen, actual_seq_kvlen, strict=True):
            assert q_end == kv_end
            if q_end > start:
                q, k, v = (t[start:q_end].double() for t in (query, key, value))
                out[start:q_end] = _attend(q, k, v, scale, sparse_mode == 3).to(query.dtype)
            start = q_end
        return out, None, None, None, 0, 0, 0


@pytest.fixture
def fake_npu(monkeypatch) -> FakeTorchNpu:
    fake = FakeTorchNpu()
    monkeypatch.setitem(sys.modules, "torch_npu", fake)
    return fake


def adaptors():
    classes = [A2A3DeviceAdaptor, A5DeviceAdaptor]
    try:
        from vllm_ascend.ascend310p.overlay import Ascend310PDeviceAdaptor
    except ImportError:
        return classes
    return [*classes, Ascend310PDeviceAdaptor]


@pytest.fixture(params=adaptors(), ids=lambda c: c.__name__)
def npu_adaptor(request, fake_npu):
    torch.manual_seed(0)
    return request.param()


def _paged_case(ref, dtype):
    """Two prefill/chunk/decode requests in shuffled blocks, GQA 4:2, D=16, block 8; padded block table."""
    hkv, d, bs, seqs, q_lens = 2, 16, 8, [19, 7, 30], [19, 1, 6]
    kc, vc = torch.zeros(12, bs, hkv, d, dtype=dtype), torch.zeros(12, bs, hkv, d, dtype=dtype)
    perm = torch.randperm(12).tolist()
    table = torch.zeros(3, 6, dtype=torch.int32)
    for b, s in enumerate(seqs):
        blocks = [perm.pop() for _ in range(-(-s // bs))]
        table[b, : len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
        slots = torch.tensor([blocks[i // bs] * bs + i % bs for i in range(s)])
        ref.reshape_and_cache(
            torch.randn(s, hkv, d).to(dtype), torch.randn(s, hkv, d).to(dtype), kc, vc, slots
        )
    qsl = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()])
    return torch.randn(int(qsl[-1]), 4, d).to(dtype), kc, vc, table, qsl, torch.tensor(seqs)


def test_paged_attention_matches_reference(npu_adaptor, fake_npu):
    ref = ReferenceDeviceAdaptor()
    args = _paged_case(ref, torch.float16)
    expected = ref.fused_infer_attention(*args, 0.25)
    got = npu_adaptor.fused_infer_attention(*args, 0.25)
    torch.testing.assert_close(got, expected, atol=2e-3, rtol=2e-3)
    attention_ops = {
        "npu_fused_infer_attention_score",
        "npu_fused_infer_attention_score_v2",
        "npu_prompt_flash_attention",
    }
    assert sum(fake_npu.calls[op] for op in attention_ops) >= 1
    assert npu_adaptor.call_counts["fused_infer_attention"] == 1


def test_reshape_and_cache_skips_padding_slots(npu_adaptor):
    ref = ReferenceDeviceAdaptor()
    caches = [torch.zeros(3, 4, 2, 8) for _ in range(4)]
    key, value = torch.randn(5, 2, 8), torch.randn(5, 2, 8)
    slots = torch.tensor([4, -1, 11, 0, -1])
    npu_adaptor.reshape_and_cache(key, value, caches[0], caches[1], slots)
    ref.reshape_and_cache(key, value, caches[2], caches[3], slots)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])


def test_norms_activation_and_rotary_match_reference(npu_adaptor):
    ref = ReferenceDeviceAdaptor()
    x, r, w = torch.randn(4, 32), torch.randn(4, 32), torch.randn(32)
    torch.testing.assert_close(npu_adaptor.rms_norm(x, w, 1e-6), ref.rms_norm(x, w, 1e-6))
    for got, want in zip(
        npu_adaptor.add_rms_norm(x, r, w, 1e-6), ref.add_rms_norm(x, r, w, 1e-6), strict=True
    ):
        torch.testing.assert_close(got, want)
    torch.testing.assert_close(npu_adaptor.swiglu(x), ref.swiglu(x))
    inv = 1.0 / 10000 ** (torch.arange(0, 8, 2).float() / 8)
    freqs = torch.outer(torch.arange(16).float(), inv)
    cache = torch.cat((freqs.cos(), freqs.sin()), -1)  # rot_dim 8 < head_size 16
    pos, q, k = torch.tensor([0, 5, 9, 15]), torch.randn(4, 64), torch.randn(4, 32)
    for neox in (True, False):
        for got, want in zip(
            npu_adaptor.rotary_embedding(pos, q, k, 16, cache, neox),
            ref.rotary_embedding(pos, q, k, 16, cache, neox),
            strict=True,
        ):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("neox", [True, False])
def test_mrope_matches_reference(npu_adaptor, fake_npu, interleaved, neox):
    ref = ReferenceDeviceAdaptor()
    inv = 1.0 / 10000 ** (torch.arange(0, 12, 2).float() / 12)
    freqs = torch.outer(torch.arange(32).float(), inv)
    cache = torch.cat((freqs.cos(), freqs.sin()), -1)  # rot_dim 12 < head_size 16
    positions = torch.randint(0, 32, (3, 5))
    q, k = torch.randn(5, 64), torch.randn(5, 32)
    for pos in (positions, positions[0]):
        got = npu_adaptor.mrope(pos, q, k, 16, cache, [2, 2, 2], neox, interleaved)
        want = ref.mrope(pos, q, k, 16, cache, [2, 2, 2], neox, interleaved)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)
    assert npu_adaptor.call_counts["mrope"] == 2
    if "mrope" not in npu_adaptor.TORCH_OPS:  # 310P rotates in torch; A2/A3/A5 call npu_mrope
        assert fake_npu.calls["npu_mrope"] == (1 if interleaved else 2)


def test_moe_path_matches_reference(npu_adaptor):
    ref = ReferenceDeviceAdaptor()
    logits, bias = torch.randn(6, 8), torch.randn(8)
    got_w, got_ids = npu_adaptor.moe_gating_top_k(logits, 2)
    want_w, want_ids = ref.moe_gating_top_k(logits, 2)
    assert torch.equal(got_ids, want_ids) and got_ids.dtype == torch.int32
    torch.testing.assert_close(got_w, want_w)
    x, w = torch.randn(6, 16), torch.randn(8, 16, 4)
    weights, ids = ref.moe_gating_top_k(logits, 2, scoring="sigmoid", bias=bias)
    sorted_x, row_idx, counts = ref.moe_init_routing(
        x, ids, 8
    )  # init_routing_v2's index type is not emulated
    expert_out = npu_adaptor.grouped_matmul(sorted_x, w, counts)
    torch.testing.assert_close(expert_out, ref.grouped_matmul(sorted_x, w, counts))
    torch.testing.assert_close(
        npu_adaptor.moe_finalize_routing(expert_out, row_idx, weights),
        ref.moe_finalize_routing(expert_out, row_idx, weights),
    )


def test_grouped_matmuls_zero_rows_past_the_groups(npu_adaptor):
    ref = ReferenceDeviceAdaptor()
    x, w = torch.randn(9, 6), torch.randn(3, 6, 4)
    for group_list, kind in ((torch.tensor([2, 0, 4]), "count"), (torch.tensor([2, 2, 6]), "cumsum")):
        got = npu_adaptor.grouped_matmul(x, w, group_list, group_list_type=kind)
        torch.testing.assert_close(got, ref.grouped_matmul(x, w, group_list, group_list_type=kind))
        assert torch.all(got[6:] == 0)
    xq = torch.randint(-128, 128, (9, 16), dtype=torch.int8)
    wq = torch.randint(-128, 128, (2, 16, 8), dtype=torch.int8)
    xs, ws = torch.rand(9) / 100, torch.rand(2, 8) / 100
    for group_list, kind in ((torch.tensor([3, 4]), "count"), (torch.tensor([3, 7]), "cumsum")):
        got_q, got_s = npu_adaptor.grouped_matmul_swiglu_quant(
            xq, wq, group_list, ws, xs, group_list_type=kind
        )
        want_q, want_s = ref.grouped_matmul_swiglu_quant(xq, wq, group_list, ws, xs, group_list_type=kind)
        assert (got_q.int() - want_q.int()).abs().max() <= 1  # rounding at .5 may differ by one step
        torch.testing.assert_close(got_s, want_s)
        assert torch.all(got_q[7:] == 0) and torch.all(got_s[7:] == 0)


def test_quant_ops_match_reference(npu_adaptor):
    ref = ReferenceDeviceAdaptor()
    x = torch.randn(4, 32)
    for got, want in zip(npu_adaptor.dynamic_quant(x), ref.dynamic_quant(x), strict=True):
        torch.testing.assert_close(got, want)
    xq, wq = (
        torch.randint(-128, 128, (3, 8), dtype=torch.int8),
        torch.randint(-128, 128, (8, 4), dtype=torch.int8),
    )
    ws, ts = torch.rand(4), torch.rand(3)
    torch.testing.assert_close(
        npu_adaptor.quant_matmul(xq, wq, ws, pertoken_scale=ts, output_dtype=torch.float32),
        ref.quant_matmul(xq, wq, ws, pertoken_scale=ts, output_dtype=torch.float32),
    )
    a, scale, offset = torch.randn(2, 8), torch.rand(2, 4), torch.randn(2, 4)
    torch.testing.assert_close(
        npu_adaptor.weight_quant_matmul(a, wq, scale, antiquant_offset=offset, group_size=4),
        ref.weight_quant_matmul(a, wq, scale, antiquant_offset=offset, group_size=4),
        atol=1e-4,
        rtol=1e-4,
    )


def test_static_quantize_and_quant_matmul_bias_paths_match_reference(npu_adaptor):
    ref = ReferenceDeviceAdaptor()
    x = torch.randn(5, 32) * 3
    scale, offset = torch.tensor([0.05]), torch.tensor([-7.0])
    assert torch.equal(npu_adaptor.quantize(x, scale, offset), ref.quantize(x, scale, offset))
    xq = torch.randint(-128, 128, (5, 16), dtype=torch.int8)
    wq = torch.randint(-128, 128, (16, 8), dtype=torch.int8)
    ws, ts = torch.rand(8) / 100, torch.rand(5)
    for bias in (torch.randint(-500, 500, (8,), dtype=torch.int32), torch.randn(8)):
        for kwargs in (
            {"pertoken_scale": ts, "output_dtype": torch.bfloat16},
            {"output_dtype": torch.float16},
        ):
            got = npu_adaptor.quant_matmul(xq, wq, ws, bias=bias, **kwargs)
            want = ref.quant_matmul(xq, wq, ws, bias=bias, **kwargs)
            assert got.dtype == want.dtype == kwargs["output_dtype"]
            # fp16: the scale goes as fp19 (npu_trans_quant_param, 10 mantissa bits); bf16: a float bias
            # is added to the bf16 result (one more bf16 rounding)
            torch.testing.assert_close(got.float(), want.float(), rtol=1.6e-2, atol=1e-3)


def test_int4_weights_match_reference(npu_adaptor, fake_npu):
    from vllm_ascend.kernels.device.reference import pack_int4

    ref = ReferenceDeviceAdaptor()
    xq = torch.randint(-128, 128, (6, 16), dtype=torch.int8)
    w4 = torch.randint(-8, 8, (16, 16), dtype=torch.int8)
    ws, ts = torch.rand(16) / 100, torch.rand(6)
    torch.testing.assert_close(
        npu_adaptor.quant_matmul(xq, pack_int4(w4), ws, pertoken_scale=ts, output_dtype=torch.float32),
        ref.quant_matmul(xq, w4, ws, pertoken_scale=ts, output_dtype=torch.float32),
    )
    a, scale, offset = torch.randn(3, 16).to(torch.bfloat16), torch.rand(16), torch.randn(16)
    torch.testing.assert_close(
        npu_adaptor.weight_quant_matmul(a, pack_int4(w4), scale, antiquant_offset=offset),
        ref.weight_quant_matmul(a, w4, scale.bfloat16(), antiquant_offset=offset.bfloat16()),
    )
    empty = npu_adaptor.weight_quant_matmul(a[:0], pack_int4(w4), scale, antiquant_offset=offset)
    assert empty.shape == (0, 16) and empty.dtype == torch.bfloat16
    wg = torch.randint(-8, 8, (3, 16, 16), dtype=torch.int8)
    wsg, counts = torch.rand(3, 16) / 100, torch.tensor([2, 0, 3])
    got = npu_adaptor.grouped_quant_matmul(xq, pack_int4(wg), counts, wsg, ts, output_dtype=torch.float32)
    torch.testing.assert_close(
        got, ref.grouped_quant_matmul(xq, wg, counts, wsg, ts, output_dtype=torch.float32)
    )
    assert torch.all(got[5:] == 0)
    got_q, got_s = npu_adaptor.grouped_matmul_swiglu_quant(
        xq, pack_int4(wg), counts, wsg, ts, group_list_type="count"
    )
    want_q, want_s = ref.grouped_matmul_swiglu_quant(xq, wg, counts, wsg, ts, group_list_type="count")
    assert (got_q.int() - want_q.int()).abs().max() <= 1
    torch.testing.assert_close(got_s, want_s)


def test_cast_weight_format_maps_to_npu_format_cast(npu_adaptor, fake_npu):
    w = torch.randint(-128, 128, (16, 8), dtype=torch.int8)
    assert torch.equal(npu_adaptor.cast_weight_format(w, "NZ"), w)
    assert torch.equal(npu_adaptor.cast_weight_format(w, "ND"), w)
    assert fake_npu.formats == {29: 1, 2: 1}
    with pytest.raises(ValueError, match="fmt='NCHW' is invalid; allowed values: ND, NZ"):
        npu_adaptor.cast_weight_format(w, "NCHW")


@pytest.mark.parametrize(
    ("with_bias", "kwargs"),
    [
        (True, {"scoring": "sigmoid", "num_groups": 4, "topk_groups": 2, "routed_scaling_factor": 2.5}),
        (True, {"scoring": "sigmoid", "num_groups": 8, "topk_groups": 3, "renormalize": False}),
        (False, {"scoring": "softmax", "num_groups": 4, "topk_groups": 1}),
        (True, {"scoring": "softmax"}),
    ],
)
def test_grouped_gating_maps_onto_npu_moe_gating_top_k(npu_adaptor, fake_npu, with_bias, kwargs):
    """Bias → group_select_mode 1 (top-2 sum), else 0 (max); weights from the fp32 norm_out."""
    torch.manual_seed(0)
    ref = ReferenceDeviceAdaptor()
    logits = torch.randn(64, 32, dtype=torch.bfloat16)
    if with_bias:
        kwargs = {**kwargs, "bias": torch.randn(32) * 0.5}
    before = fake_npu.calls["npu_moe_gating_top_k"]
    got_w, got_ids = npu_adaptor.moe_gating_top_k(logits, 4, **kwargs)
    # the 310P overlay gates with the reference op (no kernel)
    kernel = type(npu_adaptor).moe_gating_top_k is A2A3DeviceAdaptor.moe_gating_top_k
    assert fake_npu.calls["npu_moe_gating_top_k"] == before + kernel
    want_w, want_ids = ref.moe_gating_top_k(logits, 4, **kwargs)
    assert torch.equal(got_ids, want_ids) and got_ids.dtype == torch.int32
    assert got_w.dtype == torch.float32
    torch.testing.assert_close(got_w, want_w, atol=1e-6, rtol=1e-6)


def test_gating_layouts_the_kernel_refuses_run_the_reference(npu_adaptor, fake_npu):
    """Groups of 2 experts (the op needs more than 2) are gated without calling the kernel, same result."""
    ref = ReferenceDeviceAdaptor()
    logits, bias = torch.randn(5, 8), torch.randn(8)
    kwargs = {"scoring": "sigmoid", "bias": bias, "num_groups": 4, "topk_groups": 2}
    before = fake_npu.calls["npu_moe_gating_top_k"]
    got_w, got_ids = npu_adaptor.moe_gating_top_k(logits, 2, **kwargs)
    assert fake_npu.calls["npu_moe_gating_top_k"] == before
    want_w, want_ids = ref.moe_gating_top_k(logits, 2, **kwargs)
    assert torch.equal(got_ids, want_ids)
    torch.testing.assert_close(got_w, want_w)


def test_npu_gating_refuses_bad_groups_before_the_kernel(npu_adaptor, fake_npu):
    before = fake_npu.calls["npu_moe_gating_top_k"]
    with pytest.raises(DeviceOpError, match="num_experts=30 must be divisible by num_groups=4"):
        npu_adaptor.moe_gating_top_k(torch.randn(2, 30), 2, num_groups=4)
    assert fake_npu.calls["npu_moe_gating_top_k"] == before


@pytest.mark.parametrize("causal", [False, True])
def test_packed_attention_matches_reference(npu_adaptor, fake_npu, causal):
    ref = ReferenceDeviceAdaptor()
    cu = torch.tensor([0, 5, 5, 12, 19], dtype=torch.int32)  # an empty sequence and two of equal length
    q = torch.randn(21, 4, 16).half()
    k, v = torch.randn(21, 2, 16).half(), torch.randn(21, 2, 16).half()
    expected = ref.packed_attention(q, k, v, cu, 0.25, causal=causal)
    out = torch.full((21, 4, 16), 7.0, dtype=torch.float16)
    got = npu_adaptor.packed_attention(q, k, v, cu, 0.25, causal=causal, output=out)
    assert got.data_ptr() == out.data_ptr()
    torch.testing.assert_close(got[:19], expected[:19], atol=2e-3, rtol=2e-3)
    assert torch.all(got[19:] == 7.0)  # rows past cu_seqlens[-1] are left untouched
    assert fake_npu.calls["npu_fusion_attention"] + fake_npu.calls["npu_prompt_flash_attention"] >= 1


def test_stateless_process_group_is_torch_npu_hccl(npu_adaptor, fake_npu, monkeypatch):
    """torch_npu's ``ProcessGroupHCCL`` built over the caller's store, rank and size with the timeout in its
    options, registered as the group's custom backend for the npu device; gloo is refused by name."""
    from datetime import timedelta

    import vllm_ascend.kernels.device.npu as npu_module

    class FakeHccl:
        class Options:
            _timeout = None

        def __init__(self, store, rank, size, options):
            self.args = (store, rank, size, options._timeout)

    fake_npu._C = types.SimpleNamespace(_distributed_c10d=types.SimpleNamespace(ProcessGroupHCCL=FakeHccl))
    registered = {}
    monkeypatch.setattr(
        npu_module,
        "stateless_group",
        lambda store, rank, size, impl, kind, device: (
            registered.update(args=(store, rank, size), impl=impl, kind=kind, device=device) or "group"
        ),
    )
    store = object()
    assert npu_adaptor.stateless_process_group("hccl", store, 1, 3, timedelta(seconds=7)) == "group"
    assert registered["args"] == (store, 1, 3) and (registered["kind"], registered["device"]) == (
        "CUSTOM",
        "npu",
    )
    assert registered["impl"].args == (store, 1, 3, timedelta(seconds=7))
    with pytest.raises(DeviceOpError, match=r"backend='gloo' is not served here; allowed: 'hccl'"):
        npu_adaptor.stateless_process_group("gloo", store, 1, 3, timedelta(seconds=7))
