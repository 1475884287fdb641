"""Sliding-window and sink attention through the runner's dense backend vs the equations, on random inputs.

The oracle is written from the definitions: query at position ``p`` sees keys ``k`` with
``p - W < k <= p`` (HF's and vLLM's window: the last ``W`` keys, itself included); sinks add
``exp(sink_h)`` to the softmax denominator and nothing to the numerator. Blocks that fell out of every
query's window are vLLM's null block in the block table; here that block is filled with NaN, so any read
of it would show in the output.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from vllm.v1.attention.backend import CommonAttentionMetadata

from vllm_ascend.runner.attention.backend import AscendAttentionBackend
from vllm_ascend.runner.attention.impl import AscendAttentionImpl
from vllm_ascend.runner.attention.metadata import AscendAttentionMetadataBuilder
from vllm_ascend.runner.attention.support import AttentionConfigError

BS, D = 16, 32
NULL_BLOCK = 0  # vLLM's null block id: what the block table holds for blocks out of the window


def oracle(q, k, v, ctx, window, sinks, scale):
    """``q [Q, Hq, D]`` at positions ``ctx..ctx+Q-1`` over ``k/v [S, Hkv, D]``, in float64."""
    group = q.shape[1] // k.shape[1]
    k = k.double().repeat_interleave(group, dim=1)
    v = v.double().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), k) * scale  # [Hq, Q, S]
    p = ctx + torch.arange(q.shape[0])[:, None]
    key = torch.arange(k.shape[0])[None, :]
    allowed = key <= p
    if window is not None:
        allowed &= key > p - window
    scores = scores.masked_fill(~allowed, -math.inf)
    m = scores.amax(-1, keepdim=True)
    if sinks is not None:
        m = torch.maximum(m, sinks.double()[:, None, None])
    weights = torch.exp(scores - m)
    denom = weights.sum(-1, keepdim=True)
    if sinks is not None:
        denom = denom + torch.exp(sinks.double()[:, None, None] - m)
    return torch.einsum("hqk,khd->qhd", weights / denom, v)


def _builder() -> AscendAttentionMetadataBuilder:
    return AscendAttentionMetadataBuilder(
        SimpleNamespace(block_size=BS),
        ["layer.0"],
        SimpleNamespace(speculative_config=None),
        torch.device("cpu"),
    )


def _metadata(q_lens, seq_lens, block_table):
    qsl = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    seq = torch.tensor(seq_lens, dtype=torch.int32)
    n = int(qsl[-1])
    common = CommonAttentionMetadata(
        query_start_loc=qsl, query_start_loc_cpu=qsl, seq_lens=seq, num_reqs=len(q_lens),
        num_actual_tokens=n, max_query_len=max(q_lens), max_seq_len=max(seq_lens),
        block_table_tensor=block_table, slot_mapping=torch.full((n,), -1, dtype=torch.int64),
        seq_lens_cpu_upper_bound=seq,
    )  # fmt: skip
    return _builder().build(0, common)


def run_case(ctx_lens, q_lens, hq, hkv, window, sinks, seed=0):
    """Write each request's keys into shuffled blocks (blocks wholly before its first query's window
    become the NaN null block), run the impl's forward and return (output, oracle)."""
    gen = torch.Generator().manual_seed(seed)
    scale = 1 / math.sqrt(D)
    impl = AscendAttentionImpl(hq, D, scale, hkv, sliding_window=window, sinks=sinks)
    seq_lens = [c + n for c, n in zip(ctx_lens, q_lens, strict=True)]
    need = [-(-s // BS) for s in seq_lens]
    num_blocks = 1 + sum(need)
    kv_cache = torch.zeros(num_blocks, hkv, BS, 2 * D)
    kv_cache[NULL_BLOCK] = float("nan")
    free = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    block_table = torch.full((len(q_lens), max(need) + 1), NULL_BLOCK, dtype=torch.int32)
    keys, values, nulled = [], [], 0
    for r, (ctx, seq_len) in enumerate(zip(ctx_lens, seq_lens, strict=True)):
        k = torch.randn(seq_len, hkv, D, generator=gen)
        v = torch.randn(seq_len, hkv, D, generator=gen)
        keys.append(k)
        values.append(v)
        first_kept = max(0, ctx - window + 1) // BS if window is not None else 0
        for i in range(need[r]):
            if i < first_kept:
                nulled += 1
                continue  # out of the window: vLLM freed it, the table holds the null block
            block = free.pop()
            block_table[r, i] = block
            rows = slice(i * BS, min((i + 1) * BS, seq_len))
            slots = torch.arange(rows.start, rows.stop) - i * BS + block * BS
            impl.do_kv_cache_update(None, k[rows], v[rows], kv_cache, slots)
    md = _metadata(q_lens, seq_lens, block_table)
    n = sum(q_lens)
    query = torch.randn(n, hq, D, generator=gen)
    output = torch.full((n, hq, D), 7.0)
    impl.forward(None, query, None, None, kv_cache, md, output)
    expected, start = [], 0
    for r, (ctx, q_len) in enumerate(zip(ctx_lens, q_lens, strict=True)):
        expected.append(oracle(query[start : start + q_len], keys[r], values[r], ctx, window, sinks, scale))
        start += q_len
    return output, torch.cat(expected).float(), nulled


CASES = {
    # name: (ctx_lens, q_lens, Hq, Hkv)
    "prefill": ([0], [37], 4, 4),
    "decode_paged": ([40, 70, 5], [1, 1, 1], 4, 2),
    "chunked_prefill_with_context": ([45], [12], 4, 2),
    "mixed_batch_gqa": ([0, 50, 33, 64], [21, 1, 9, 1], 8, 2),
}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize(
    ("window", "with_sinks"),
    [(8, False), (None, True), (8, True), (19, True)],
    ids=["window", "sinks", "both", "w19"],
)
def test_forward_equals_the_equations(name, window, with_sinks):
    ctx_lens, q_lens, hq, hkv = CASES[name]
    sinks = torch.randn(hq, generator=torch.Generator().manual_seed(1)) * 2 if with_sinks else None
    out, expected, nulled = run_case(ctx_lens, q_lens, hq, hkv, window, sinks)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    if window == 8 and name != "prefill":
        assert nulled > 0  # the case does reach past null blocks


def test_the_window_and_the_sinks_change_the_result():
    """Guards the oracle comparisons above: each feature on its own moves the output."""
    ctx_lens, q_lens, hq, hkv = CASES["mixed_batch_gqa"]
    sinks = torch.full((hq,), 1.5)
    plain, _, _ = run_case(ctx_lens, q_lens, hq, hkv, None, None)
    windowed, _, _ = run_case(ctx_lens, q_lens, hq, hkv, 8, None)
    sunk, _, _ = run_case(ctx_lens, q_lens, hq, hkv, None, sinks)
    assert (windowed - plain).abs().max() > 1e-2
    assert (sunk - plain).abs().max() > 1e-2
    # A sink of -inf weight (very negative logit) is no sink at all.
    no_sink, _, _ = run_case(ctx_lens, q_lens, hq, hkv, None, torch.full((hq,), -1e4))
    torch.testing.assert_close(no_sink, plain, atol=1e-6, rtol=1e-6)


def test_a_window_wider_than_the_sequence_is_full_attention():
    ctx_lens, q_lens, hq, hkv = CASES["mixed_batch_gqa"]
    plain, _, _ = run_case(ctx_lens, q_lens, hq, hkv, None, None)
    wide, _, _ = run_case(ctx_lens, q_lens, hq, hkv, 1000, None)
    torch.testing.assert_close(wide, plain, atol=1e-6, rtol=1e-6)


def test_sinks_are_read_at_forward_time():
    """vLLM loads the sink weights after building the layer: the impl must read the live parameter."""
    ctx_lens, q_lens, hq, hkv = [10], [3], 4, 4
    sinks = torch.zeros(hq)
    before, expected_zero, _ = run_case(ctx_lens, q_lens, hq, hkv, None, sinks)
    sinks.fill_(3.0)
    after, expected_three, _ = run_case(ctx_lens, q_lens, hq, hkv, None, sinks)
    torch.testing.assert_close(before, expected_zero, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(after, expected_three, atol=1e-5, rtol=1e-5)
    assert (after - before).abs().max() > 1e-2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"sliding_window": 0}, r"sliding_window=0 is not supported .*allowed: None or an int >= 1"),
        ({"sliding_window": 4.5}, r"sliding_window=4.5 is not supported"),
        ({"sinks": torch.zeros(3)}, r"sinks must have shape \[num_heads=4\].*got \(3,\)"),
    ],
)
def test_bad_window_or_sinks_are_refused(kwargs, message):
    with pytest.raises(AttentionConfigError, match=message):
        AscendAttentionImpl(4, D, 0.1, 2, **kwargs)


def test_a_subclass_with_its_own_forward_refuses_window_and_sinks():
    class OwnForward(AscendAttentionImpl):
        def forward(self, *args, **kwargs):
            raise AssertionError("never reached")

    with pytest.raises(AttentionConfigError, match=r"sliding_window is not supported by OwnForward"):
        OwnForward(4, D, 0.1, 2, sliding_window=8)
    with pytest.raises(AttentionConfigError, match=r"sinks is not supported by OwnForward"):
        OwnForward(4, D, 0.1, 2, sinks=torch.zeros(4))
    assert OwnForward(4, D, 0.1, 2).sliding_window is None


def test_backend_declares_window_and_sinks():
    assert AscendAttentionBackend.supports_sliding_window()
    assert AscendAttentionBackend.supports_sink()
