"""DeepSeek sparse attention in the runner: the sparse MLA impl against MLA from its equations restricted to the
selected keys, its guards, and the model patch that brings the Ascend indexer into vLLM's DeepSeek model."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from vllm_ascend.runner.attention.mla.sparse import AscendSFAImpl, AscendSparseMetadata
from vllm_ascend.runner.attention.support import AttentionConfigError
from vllm_ascend.runner.model_patches import MODEL_PATCHES, applicable_patches, model_patches

BLOCK, HEADS, NOPE, V, LORA, ROPE = 4, 3, 8, 6, 16, 8


class _KvBProj(torch.nn.Module):
    """``kv_b_proj`` as vLLM's linear layers return it: ``(x @ W.T, bias)``."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = weight

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, None]:
        return x @ self.weight.T, None


def _impl(weight: torch.Tensor, buffer: torch.Tensor | None, scale: float = 0.3) -> AscendSFAImpl:
    return AscendSFAImpl(
        num_heads=HEADS, head_size=LORA + ROPE, scale=scale, num_kv_heads=1, alibi_slopes=None,
        sliding_window=None, kv_cache_dtype="auto", logits_soft_cap=None, attn_type="decoder",
        kv_sharing_target_layer_name=None, q_lora_rank=16, kv_lora_rank=LORA, qk_nope_head_dim=NOPE,
        qk_rope_head_dim=ROPE, qk_head_dim=NOPE + ROPE, v_head_dim=V, kv_b_proj=_KvBProj(weight),
        indexer=object(), topk_indices_buffer=buffer, index_group_builder=object(),
    )  # fmt: skip


def test_sparse_impl_equals_mla_restricted_to_the_selected_keys():
    """Requests: a decode (1 of 9), a chunked prefill with context (3 of 11), a full prefill (5 of 5). Each row
    keeps 4 positions (some beyond its causal bound, some -1): the absorbed sparse attention projected through
    W_UV equals float64 attention over decompressed K/V with every other key masked."""
    gen = torch.Generator().manual_seed(3)
    weight = torch.randn(HEADS * (NOPE + V), LORA, generator=gen) * 0.3
    q_lens, seq_lens, topk = [1, 3, 5], [9, 11, 5], 4
    num_tokens = sum(q_lens)
    buffer = torch.full((16, topk), -7, dtype=torch.int32)
    impl = _impl(weight, buffer)
    table = torch.randperm(12, generator=gen).view(3, 4)
    cache = torch.full((12, BLOCK, LORA + ROPE), float("nan"))
    kv_c = [torch.randn(s, LORA, generator=gen) for s in seq_lens]
    k_pe = [torch.randn(s, ROPE, generator=gen) for s in seq_lens]
    for b, s in enumerate(seq_lens):
        slots = table[b, torch.arange(s) // BLOCK] * BLOCK + torch.arange(s) % BLOCK
        impl.do_kv_cache_update(kv_c[b], k_pe[b].unsqueeze(1), cache, slots, "auto", torch.tensor(1.0))
    selected = []
    for q_len, s in zip(q_lens, seq_lens, strict=True):
        for j in range(q_len):
            picks = torch.randperm(s, generator=gen)[:topk].int()
            if j == 0:
                picks[-1] = -1
            selected.append(picks)
    buffer[:num_tokens] = torch.stack(selected)
    q = torch.randn(num_tokens, HEADS, NOPE + ROPE, generator=gen)
    w_kv = weight.view(HEADS, NOPE + V, LORA)
    w_uk, w_uv = w_kv[:, :NOPE], w_kv[:, NOPE:]
    ql_nope = torch.einsum("thn,hnl->thl", q[..., :NOPE], w_uk)
    starts = torch.tensor([0, 1, 4, 9])
    meta = AscendSparseMetadata(
        num_reqs=3, num_actual_tokens=num_tokens, num_decodes=3, num_decode_tokens=num_tokens, num_prefills=0,
        slot_mapping=torch.zeros(num_tokens, dtype=torch.int64), block_table=table, query_start_loc_cpu=starts,
        seq_lens_cpu=torch.tensor(seq_lens),
    )  # fmt: skip
    impl.record_logical_topk_ready()
    latent, lse = impl.forward_mqa((ql_nope, q[..., NOPE:]), cache, meta, None)
    assert lse is None and latent.shape == (num_tokens, HEADS, LORA)
    got = torch.einsum("thl,hvl->thv", latent.double(), w_uv.double())

    for b, (q_len, s) in enumerate(zip(q_lens, seq_lens, strict=True)):
        kv = (kv_c[b].double() @ weight.double().T).view(s, HEADS, NOPE + V)
        key = torch.cat([kv[..., :NOPE], k_pe[b].double().unsqueeze(1).expand(-1, HEADS, -1)], dim=-1)
        for j in range(q_len):
            t = int(starts[b]) + j
            keep = torch.zeros(s, dtype=torch.bool)
            picks = buffer[t][buffer[t] >= 0].long()
            keep[picks] = True
            keep &= torch.arange(s) <= s - q_len + j
            scores = torch.einsum("hd,khd->hk", q[t].double(), key) * 0.3
            probs = torch.softmax(scores.masked_fill(~keep, float("-inf")), dim=-1).nan_to_num(0.0)
            expected = torch.einsum("hk,khv->hv", probs, kv[..., NOPE:])
            torch.testing.assert_close(got[t], expected, rtol=0, atol=1e-5)


def test_sparse_impl_guards():
    weight = torch.zeros(HEADS * (NOPE + V), LORA)
    with pytest.raises(AttentionConfigError, match="needs the model's top-k indices buffer"):
        _impl(weight, None)
    impl = _impl(weight, torch.zeros(4, 2, dtype=torch.int32))
    assert impl.is_sparse and not impl.supports_dense_mha_prefill
    with pytest.raises(AttentionConfigError, match="forward_mha was called for a sparse layer"):
        impl.forward_mha()


def test_sparse_impl_refuses_host_offloaded_sparse_kv():
    from vllm.config import VllmConfig, set_current_vllm_config

    config = VllmConfig()
    config.attention_config.hisparse_config = object()  # any value: the option is not served
    with set_current_vllm_config(config), pytest.raises(AttentionConfigError, match="hisparse_config"):
        _impl(torch.zeros(HEADS * (NOPE + V), LORA), torch.zeros(4, 2, dtype=torch.int32))


def test_the_indexer_patch_applies_to_dsa_models_only_and_is_scoped():
    from vllm.model_executor.models import deepseek_v2

    from vllm_ascend.runner.attention.mla.indexer import AscendIndexer

    assert [p.name for p in applicable_patches(SimpleNamespace(index_topk=2048))] == ["Indexer"]
    assert applicable_patches(SimpleNamespace(kv_lora_rank=512)) == []
    assert all(p.why for p in MODEL_PATCHES)
    original = deepseek_v2.Indexer
    with model_patches(SimpleNamespace(index_topk=8)) as applied:
        assert deepseek_v2.Indexer is AscendIndexer and [p.name for p in applied] == ["Indexer"]
    assert deepseek_v2.Indexer is original
    with model_patches(SimpleNamespace()) as applied:
        assert applied == [] and deepseek_v2.Indexer is original


def test_config_defaults_fill_only_what_a_deepseek_v3_config_lacks():
    from vllm_ascend.runner.model_patches import CONFIG_DEFAULTS, apply_config_defaults

    plain = SimpleNamespace(model_type="deepseek_v3")
    applied = apply_config_defaults(plain)
    assert (plain.scoring_func, plain.topk_method) == ("sigmoid", "noaux_tc") and len(applied) == 2
    chosen = SimpleNamespace(model_type="deepseek_v32", scoring_func="softmax", topk_method=None)
    apply_config_defaults(chosen)
    assert (chosen.scoring_func, chosen.topk_method) == ("softmax", "noaux_tc")
    v2 = SimpleNamespace(model_type="deepseek_v2", n_group=None, topk_group=None)
    assert [d.field for d in apply_config_defaults(v2)] == ["n_group", "topk_group"]
    assert (v2.n_group, v2.topk_group) == (1, 1) and not hasattr(v2, "scoring_func")
    other = SimpleNamespace(model_type="qwen3")
    assert apply_config_defaults(other) == [] and vars(other) == {"model_type": "qwen3"}
    assert all(default.why for default in CONFIG_DEFAULTS)
