"""Attention backend: metadata from vLLM's common metadata, paged forward vs dense attention, errors."""

from __future__ import annotations

import itertools
import math
from types import SimpleNamespace

import pytest
import torch
from vllm.v1.attention.backend import AttentionType, CommonAttentionMetadata

from vllm_ascend.runner.attention.backend import AscendAttentionBackend
from vllm_ascend.runner.attention.impl import AscendAttentionImpl, split_kv_cache
from vllm_ascend.runner.attention.metadata import AscendAttentionMetadataBuilder
from vllm_ascend.runner.attention.support import AttentionConfigError, check_supported

BS, HQ, HKV, D, NUM_BLOCKS = 16, 4, 2, 32, 12


def _builder() -> AscendAttentionMetadataBuilder:
    spec = SimpleNamespace(block_size=BS)
    config = SimpleNamespace(speculative_config=None)
    return AscendAttentionMetadataBuilder(spec, ["layer.0"], config, torch.device("cpu"))


def _common(q_lens, seq_lens, block_table, padded_tokens=None):
    qsl = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    n = int(qsl[-1])
    slot_mapping = torch.full((padded_tokens or n,), -1, dtype=torch.int64)
    seq = torch.tensor(seq_lens, dtype=torch.int32)
    return CommonAttentionMetadata(
        query_start_loc=qsl, query_start_loc_cpu=qsl, seq_lens=seq, num_reqs=len(q_lens),
        num_actual_tokens=padded_tokens or n, max_query_len=max(q_lens), max_seq_len=max(seq_lens),
        block_table_tensor=block_table, slot_mapping=slot_mapping, seq_lens_cpu_upper_bound=seq,
    )  # fmt: skip


def test_metadata_trims_padding_and_keeps_the_block_table_width():
    table = torch.arange(3 * 8, dtype=torch.int32).view(3, 8)
    md = _builder().build(0, _common([5, 1], [21, 40], table, padded_tokens=8))
    assert md.num_reqs == 2 and md.num_actual_tokens == 6
    assert md.query_start_loc_cpu.tolist() == [0, 5, 6]
    assert md.seq_lens_cpu.tolist() == [21, 40]
    assert md.block_table.shape == (2, 8)  # every column: same shapes at every step (graph replays)
    assert md.block_table.data_ptr() == table.data_ptr()  # a view of the runner's table, not a copy
    assert md.slot_mapping.shape == (6,)
    assert md.max_query_len == 5 and md.max_seq_len == 40 and md.num_decodes == 1


def test_update_for_replay_takes_the_step_in_place_and_refuses_other_shapes():
    builder = _builder()
    captured = builder.build(0, _common([1, 1, 1], [1, 1, 1], torch.zeros(3, 8, dtype=torch.int32)))
    tensors = (
        captured.query_start_loc_cpu,
        captured.seq_lens_cpu,
        captured.block_table,
        captured.slot_mapping,
    )
    table = torch.arange(3 * 8, dtype=torch.int32).view(3, 8)
    step = builder.build(0, _common([1, 1, 0], [30, 17, 0], table, padded_tokens=3))  # 2 requests padded to 3
    step.slot_mapping.copy_(torch.tensor([7, 9]))
    captured.update_for_replay(step)
    assert [t.data_ptr() for t in tensors] == [
        t.data_ptr()
        for t in (
            captured.query_start_loc_cpu,
            captured.seq_lens_cpu,
            captured.block_table,
            captured.slot_mapping,
        )
    ]  # the captured tensors themselves were written
    assert captured.query_start_loc_cpu.tolist() == [0, 1, 2, 2]
    assert captured.seq_lens_cpu.tolist() == [30, 17, 0]
    assert torch.equal(captured.block_table, table)
    assert captured.slot_mapping.tolist() == [7, 9, -1]  # the padding token writes no KV
    other = builder.build(0, _common([1, 1], [5, 6], torch.zeros(2, 8, dtype=torch.int32)))
    with pytest.raises(
        ValueError, match=r"captured for 3 requests x 8 blocks cannot replay a step of 2 requests"
    ):
        captured.update_for_replay(other)


def _dense_reference(q, k_all, v_all, ctx_lens, scale):
    """Causal attention of each request's new queries over its full key sequence (GQA)."""
    out = []
    for qb, kb, vb, ctx in zip(q, k_all, v_all, ctx_lens, strict=True):
        kb = kb.repeat_interleave(HQ // HKV, dim=1)
        vb = vb.repeat_interleave(HQ // HKV, dim=1)
        scores = torch.einsum("qhd,khd->hqk", qb, kb) * scale
        allowed = torch.arange(kb.shape[0])[None, :] <= (ctx + torch.arange(qb.shape[0]))[:, None]
        scores = scores.masked_fill(~allowed, float("-inf"))
        out.append(torch.einsum("hqk,khd->qhd", scores.softmax(-1), vb))
    return torch.cat(out)


def test_kv_update_then_forward_equals_dense_attention():
    gen = torch.Generator().manual_seed(0)
    impl = AscendAttentionImpl(HQ, D, 1 / math.sqrt(D), HKV)
    kv_cache = torch.zeros(NUM_BLOCKS, HKV, BS, 2 * D)  # vLLM's per-layer [blocks, H, block_size, D + Dv]
    # Request 0: 20 cached tokens + 5 new (chunked prefill); request 1: 33 cached + 1 new (decode).
    ctx, new = [20, 33], [5, 1]
    tables = [[3, 7], [1, 4, 9]]
    block_table = torch.zeros(2, 4, dtype=torch.int32)
    for r, blocks in enumerate(tables):
        block_table[r, : len(blocks)] = torch.tensor(blocks)
    k_all = [torch.randn(c + n, HKV, D, generator=gen) for c, n in zip(ctx, new, strict=True)]
    v_all = [torch.randn(c + n, HKV, D, generator=gen) for c, n in zip(ctx, new, strict=True)]

    def slots(r, positions):
        return torch.tensor([tables[r][p // BS] * BS + p % BS for p in positions])

    # Write the context, then the new tokens, through do_kv_cache_update (padding slot -1 skipped).
    for r in range(2):
        impl.do_kv_cache_update(
            None, k_all[r][: ctx[r]], v_all[r][: ctx[r]], kv_cache, slots(r, range(ctx[r]))
        )
    new_k = torch.cat([k_all[r][ctx[r] :] for r in range(2)] + [torch.randn(2, HKV, D)])
    new_v = torch.cat([v_all[r][ctx[r] :] for r in range(2)] + [torch.randn(2, HKV, D)])
    new_slots = torch.cat(
        [slots(r, range(ctx[r], ctx[r] + new[r])) for r in range(2)] + [torch.tensor([-1, -1])]
    )
    impl.do_kv_cache_update(None, new_k, new_v, kv_cache, new_slots)

    md = _builder().build(0, _common(new, [c + n for c, n in zip(ctx, new, strict=True)], block_table, 8))
    q = torch.randn(8, HQ, D, generator=gen)
    output = torch.full((8, HQ, D), 7.0)
    impl.forward(None, q, new_k, new_v, kv_cache, md, output)
    ref = _dense_reference([q[:5], q[5:6]], k_all, v_all, ctx, 1 / math.sqrt(D))
    torch.testing.assert_close(output[:6], ref, atol=1e-5, rtol=1e-5)
    assert (output[6:] == 7.0).all()  # padding rows untouched


def test_a_step_plans_its_lengths_once_and_again_after_a_replay_update():
    builder = _builder()
    table = torch.arange(3 * 8, dtype=torch.int32).view(3, 8)
    md = builder.build(0, _common([5, 1], [21, 40], table))
    plan = md.attention_plan(BS)
    assert md.attention_plan(BS) is plan  # every layer of the step reads the same plan
    assert (plan.starts, plan.lens, plan.decodes, plan.prefills) == ((0, 5, 6), (21, 40), (1,), (0,))
    assert plan.query_start_loc is md.query_start_loc_cpu and plan.block_table is md.block_table
    step = builder.build(0, _common([1, 1], [30, 17], table))
    md.update_for_replay(step)
    replanned = md.attention_plan(BS)
    assert replanned is not plan and (replanned.starts, replanned.lens) == ((0, 1, 2), (30, 17))


def test_a_layer_splits_its_cache_once_and_again_when_its_memory_moves():
    kv_cache = torch.zeros(NUM_BLOCKS, HKV, BS, 2 * D)
    views = split_kv_cache(kv_cache, D)
    assert split_kv_cache(kv_cache, D) is views
    assert views[0].data_ptr() == kv_cache.data_ptr()
    kv_cache.set_(torch.ones(NUM_BLOCKS, HKV, BS, 2 * D))  # the same tensor over other memory
    moved = split_kv_cache(kv_cache, D)
    assert moved is not views and moved[0].data_ptr() == kv_cache.data_ptr() and bool((moved[1] == 1).all())


def test_profile_run_without_metadata_returns_zeros():
    impl = AscendAttentionImpl(HQ, D, 0.1, HKV)
    out = torch.ones(3, HQ, D)
    impl.forward(None, torch.randn(3, HQ, D), None, None, torch.zeros(1), None, out)
    assert (out == 0).all()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((24, torch.float32, "auto"), r"head_size=24 .*allowed: multiples of 16 from 16 to 512"),
        ((1024, torch.float32, "auto"), r"head_size=1024"),
        ((64, torch.float64, "auto"), r"dtype=torch.float64 .*allowed: float16, bfloat16, float32"),
        ((64, torch.float16, "fp8"), r"kv_cache_dtype='fp8' .*allowed: auto, float16, bfloat16"),
    ],
)
def test_unsupported_configurations_name_field_and_allowed_values(args, message):
    with pytest.raises(AttentionConfigError, match=message):
        check_supported(*args)


def test_unsupported_attention_features_are_refused():
    with pytest.raises(AttentionConfigError, match=r"alibi_slopes is not supported.*allowed: None"):
        AscendAttentionImpl(HQ, D, 0.1, HKV, alibi_slopes=[1.0] * HQ)
    for attn_type in (AttentionType.ENCODER, AttentionType.ENCODER_DECODER):
        with pytest.raises(
            AttentionConfigError,
            match=rf"attn_type='{attn_type.value}' is not supported .*allowed: 'decoder', 'encoder_only'",
        ):
            AscendAttentionImpl(HQ, D, 0.1, HKV, attn_type=attn_type)
    with pytest.raises(
        AttentionConfigError, match=r"sliding_window with attn_type='encoder_only' .*allowed: None"
    ):
        AscendAttentionImpl(HQ, D, 0.1, HKV, attn_type=AttentionType.ENCODER_ONLY, sliding_window=8)


def test_encoder_only_attends_to_whole_sequences_through_packed_attention_and_writes_no_kv():
    """vLLM's encoder-only metadata (causal=False, a dummy block table, no KV cache tensor): each sequence's
    queries see all of its keys, computed by the adaptor's packed_attention; the KV update writes nothing."""
    from vllm_ascend.core.sdk import get_device_adaptor

    gen = torch.Generator().manual_seed(3)
    impl = AscendAttentionImpl(HQ, D, 1 / math.sqrt(D), HKV, attn_type=AttentionType.ENCODER_ONLY)
    q_lens = [6, 1, 11]
    n = sum(q_lens)
    q, k, v = (torch.randn(n + 2, h, D, generator=gen) for h in (HQ, HKV, HKV))  # 2 padding rows
    kv_cache = torch.empty(0)
    impl.do_kv_cache_update(None, k, v, kv_cache, torch.zeros(n + 2, dtype=torch.int64))
    assert kv_cache.numel() == 0
    common = _common(q_lens, q_lens, torch.zeros(3, 1, dtype=torch.int32), n + 2)
    common.causal = False
    md = _builder().build(0, common)
    assert md.causal is False
    adaptor = get_device_adaptor()
    adaptor.call_counts.clear()
    output = torch.full((n + 2, HQ, D), 7.0)
    impl.forward(None, q, k, v, kv_cache, md, output)
    runs = list(itertools.pairwise([0, 6, 7, 18]))
    ref = _dense_reference(
        [q[a:b] for a, b in runs],
        [k[a:b] for a, b in runs],
        [v[a:b] for a, b in runs],
        [b - a - 1 for a, b in runs],  # every key is at or before "ctx + 0": bidirectional
        1 / math.sqrt(D),
    )
    torch.testing.assert_close(output[:n], ref, atol=1e-5, rtol=1e-5)
    assert (output[n:] == 7.0).all()  # padding rows untouched
    assert adaptor.call_counts["packed_attention"] == 1 and adaptor.call_counts["fused_infer_attention"] == 0


def test_backend_identity():
    assert AscendAttentionBackend.get_name() == "CUSTOM"
    assert AscendAttentionBackend.forward_includes_kv_cache_update is False
    assert AscendAttentionBackend.get_impl_cls() is AscendAttentionImpl
    assert AscendAttentionBackend.supports_block_size(128) and not AscendAttentionBackend.supports_block_size(
        8
    )


def test_dtypes_and_block_sizes_come_from_the_device_profile(monkeypatch):
    from vllm_ascend.core.device.profile import REFERENCE_PROFILE, HardwareCapability
    from vllm_ascend.runner.attention import backend, support

    fp16_only = REFERENCE_PROFILE.with_changes(
        supported_dtypes=("float16", "float32"),
        block_size_multiple=32,
        capabilities=REFERENCE_PROFILE.capabilities - {HardwareCapability.BF16},
    )
    monkeypatch.setattr(support, "get_current_hardware_profile", lambda: fp16_only)
    monkeypatch.setattr(backend, "get_current_hardware_profile", lambda: fp16_only)
    check_supported(64, torch.float16, "auto")
    with pytest.raises(AttentionConfigError, match=r"dtype=torch.bfloat16 .*allowed: float16, float32"):
        check_supported(64, torch.bfloat16, "auto")
    assert AscendAttentionBackend.supports_block_size(64)
    assert not AscendAttentionBackend.supports_block_size(48)
