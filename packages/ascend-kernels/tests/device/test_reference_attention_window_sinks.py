"""``fused_infer_attention``'s sliding window and sinks: the reference adaptor vs the equations, argument
errors, and the NPU adaptors' window/sink helpers (block-table shift, the v2 op's sink constraints)."""

from __future__ import annotations

import math

import pytest
import torch

from vllm_ascend.core.device.adaptor.base import DeviceOpError
from vllm_ascend.kernels.device.npu import check_sink_inputs, window_block_table
from vllm_ascend.kernels.device.reference import ReferenceDeviceAdaptor

BS, D = 8, 16


def _oracle(q, k, v, ctx, window, sinks, scale):
    """Float64 masked softmax attention of ``q [Q, Hq, D]`` at positions ``ctx..`` over ``k/v [S, Hkv, D]``;
    sinks add ``exp(sink_h)`` to the denominator."""
    group = q.shape[1] // k.shape[1]
    k, v = k.double().repeat_interleave(group, 1), v.double().repeat_interleave(group, 1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), k) * scale
    p = ctx + torch.arange(q.shape[0])[:, None]
    key = torch.arange(k.shape[0])[None, :]
    allowed = (key <= p) & ((key > p - window) if window is not None else True)
    weights = torch.exp(scores.masked_fill(~allowed, -math.inf))  # small logits: no max shift needed
    denom = weights.sum(-1, keepdim=True)
    if sinks is not None:
        denom = denom + torch.exp(sinks.double())[:, None, None]
    return torch.einsum("hqk,khd->qhd", weights / denom, v)


def _case(ctx_lens, q_lens, hq=4, hkv=2, window=None, seed=0):
    gen = torch.Generator().manual_seed(seed)
    seq = [c + n for c, n in zip(ctx_lens, q_lens, strict=True)]
    need = [-(-s // BS) for s in seq]
    kc = torch.full((1 + sum(need), BS, hkv, D), float("nan"))  # block 0: the null block, NaN
    vc = torch.full_like(kc, float("nan"))
    table = torch.zeros(len(seq), max(need), dtype=torch.int32)
    ks, vs, nxt = [], [], 1
    for b, (ctx, s) in enumerate(zip(ctx_lens, seq, strict=True)):
        k, v = torch.randn(s, hkv, D, generator=gen) * 0.5, torch.randn(s, hkv, D, generator=gen)
        ks.append(k)
        vs.append(v)
        first = max(0, ctx - window + 1) // BS if window else 0
        for i in range(first, need[b]):
            table[b, i] = nxt
            rows = slice(i * BS, min(s, (i + 1) * BS))
            kc[nxt, : rows.stop - rows.start] = k[rows]
            vc[nxt, : rows.stop - rows.start] = v[rows]
            nxt += 1
    qsl = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()])
    q = torch.randn(int(qsl[-1]), hq, D, generator=gen)
    return q, kc, vc, table, qsl, torch.tensor(seq), ks, vs


@pytest.mark.parametrize(
    ("window", "with_sinks"),
    [(1, False), (5, False), (12, False), (None, True), (1, True), (5, True), (12, True)],
)
def test_reference_matches_the_equations_and_never_reads_the_null_block(window, with_sinks):
    ctx_lens, q_lens = [0, 20, 31, 9], [11, 1, 6, 1]
    q, kc, vc, table, qsl, seq, ks, vs = _case(ctx_lens, q_lens, window=window)
    sinks = torch.linspace(-1.0, 2.0, 4) if with_sinks else None
    out = ReferenceDeviceAdaptor().fused_infer_attention(
        q, kc, vc, table, qsl, seq, 0.25, sliding_window=window, sinks=sinks
    )
    expected = torch.cat(
        [
            _oracle(q[int(qsl[b]) : int(qsl[b + 1])], ks[b], vs[b], ctx_lens[b], window, sinks, 0.25)
            for b in range(len(q_lens))
        ]
    )
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)


def test_window_one_is_each_query_on_its_own_value():
    q, kc, vc, table, qsl, seq, _, vs = _case([4], [5], hq=2, hkv=2, window=1)
    out = ReferenceDeviceAdaptor().fused_infer_attention(q, kc, vc, table, qsl, seq, 0.5, sliding_window=1)
    torch.testing.assert_close(out, vs[0][4:], atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"sliding_window": 0}, r"sliding_window=0 is invalid; allowed: None or an int >= 1"),
        ({"sliding_window": True}, r"sliding_window=True is invalid"),
        ({"sliding_window": 4, "causal": False}, r"only defined for causal attention; got causal=False"),
        ({"sinks": torch.zeros(3)}, r"sinks must be a floating tensor of shape \[num_heads=4\]"),
        ({"sinks": torch.zeros(4, dtype=torch.int32)}, r"got torch.int32 of shape \(4,\)"),
    ],
)
def test_bad_window_or_sinks_raise_naming_the_field(kwargs, message):
    q, kc, vc, table, qsl, seq, _, _ = _case([0], [3])
    with pytest.raises(DeviceOpError, match=message):
        ReferenceDeviceAdaptor().fused_infer_attention(q, kc, vc, table, qsl, seq, 0.25, **kwargs)


def test_window_block_table_skips_only_blocks_before_the_first_window():
    table = torch.arange(12, dtype=torch.int32).view(2, 6) + 1
    # Request 0: 40 keys, 1 query at 39 with W=10 -> keys 30..39 -> skip blocks 0..2 (keys 0..23).
    # Request 1: 20 keys, 5 queries from 15, W=10 -> first window starts at 6 -> skip no whole block.
    shifted, kv_lens = window_block_table(table, [40, 20], [1, 5], 10, BS)
    assert kv_lens == [40 - 3 * BS, 20]
    assert shifted[0, :2].tolist() == [4, 5] and shifted[1].tolist() == table[1].tolist()


def test_npu_sinks_need_bfloat16_and_small_value_heads():
    check_sink_inputs(torch.zeros(2, 4, 64, dtype=torch.bfloat16), torch.zeros(3, 8, 2, 64))
    with pytest.raises(DeviceOpError, match=r"need bfloat16 attention .*got query dtype torch.float16"):
        check_sink_inputs(torch.zeros(2, 4, 64, dtype=torch.float16), torch.zeros(3, 8, 2, 64))
    with pytest.raises(DeviceOpError, match=r"value head size <= 128; got 256"):
        check_sink_inputs(torch.zeros(2, 4, 256, dtype=torch.bfloat16), torch.zeros(3, 8, 2, 256))


def test_310p_adaptors_refuse_window_and_sinks():
    overlay = pytest.importorskip("vllm_ascend.ascend310p.overlay")
    q, kc, vc, table, qsl, seq, _, _ = _case([0], [3])
    half = (q.half(), kc.half(), vc.half(), table, qsl, seq, 0.25)
    for cls in (overlay.Ascend310PReferenceAdaptor, overlay.Ascend310PDeviceAdaptor):
        with pytest.raises(DeviceOpError, match=r"sliding_window is not supported by Atlas 310P attention"):
            cls().fused_infer_attention(*half, sliding_window=4)
        with pytest.raises(DeviceOpError, match=r"sinks is not supported by Atlas 310P attention"):
            cls().fused_infer_attention(*half, sinks=torch.zeros(4))
