"""The Ascend MLA backend against MLA written from its equations (decompressed K/V, full softmax).

The impl is driven the way vLLM's ``MLAAttention.forward_impl`` drives it: latent rows written through
``do_kv_cache_update``, prefill rows through ``forward_mha``, decode rows through ``forward_mqa`` with the
query absorbed into latent space (``q_nope @ W_UK``) and the latent output projected through ``W_UV``.
"""

from __future__ import annotations

import pytest
import torch

from vllm_ascend.runner.attention.mla.impl import AscendMLAImpl
from vllm_ascend.runner.attention.mla.metadata import (
    AscendMLADecodeMetadata,
    AscendMLAMetadata,
    AscendMLAPrefillMetadata,
)
from vllm_ascend.runner.attention.support import AttentionConfigError

BLOCK = 4
HEADS, NOPE, V = 3, 8, 6


class _KvBProj(torch.nn.Module):
    """``kv_b_proj`` as vLLM's linear layers return it: ``(x @ W.T, bias)``."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = weight

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, None]:
        return x @ self.weight.T, None


def _impl(kv_lora: int, rope: int, weight: torch.Tensor, scale: float) -> AscendMLAImpl:
    return AscendMLAImpl(
        num_heads=HEADS,
        head_size=kv_lora + rope,
        scale=scale,
        num_kv_heads=1,
        alibi_slopes=None,
        sliding_window=None,
        kv_cache_dtype="auto",
        logits_soft_cap=None,
        attn_type="decoder",
        kv_sharing_target_layer_name=None,
        q_lora_rank=None,
        kv_lora_rank=kv_lora,
        qk_nope_head_dim=NOPE,
        qk_rope_head_dim=rope,
        qk_head_dim=NOPE + rope,
        v_head_dim=V,
        kv_b_proj=_KvBProj(weight),
    )


def _equations(q, kv_c, k_pe, weight, scale, q_len):
    """One request from the equations: ``K_h = [kv_c W_UK_h | k_pe]``, ``V_h = kv_c W_UV_h``, causal softmax
    with the queries being the last ``q_len`` of the ``S`` keys. Float64."""
    kv = (kv_c.double() @ weight.double().T).view(-1, HEADS, NOPE + V)
    k = torch.cat([kv[..., :NOPE], k_pe.double().unsqueeze(1).expand(-1, HEADS, -1)], dim=-1)
    v = kv[..., NOPE:]
    s = k.shape[0]
    scores = torch.einsum("qhd,khd->hqk", q.double(), k) * scale
    allowed = torch.arange(s).unsqueeze(0) <= torch.arange(s - q_len, s).unsqueeze(1)
    probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    return torch.einsum("hqk,khd->qhd", probs, v)


def _case(kv_lora, rope, dtype, q_lens, ctx_lens, shared_prefix_blocks=0, seed=0):
    """Random latent rows for every token of every request in a shuffled paged cache, queries for the new
    tokens; requests 1.. may share request 0's first blocks (a prefix-cache hit)."""
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [c + q for c, q in zip(ctx_lens, q_lens, strict=True)]
    max_blocks = max(-(-s // BLOCK) for s in seq_lens)
    num_blocks = len(seq_lens) * max_blocks + 2
    perm = torch.randperm(num_blocks, generator=gen)
    table = perm[: len(seq_lens) * max_blocks].view(len(seq_lens), max_blocks).clone()
    if shared_prefix_blocks:
        table[1:, :shared_prefix_blocks] = table[0, :shared_prefix_blocks]
    kv_c = [torch.randn(s, kv_lora, generator=gen) for s in seq_lens]
    k_pe = [torch.randn(s, rope, generator=gen) for s in seq_lens]
    for b in range(1, len(seq_lens)):  # a shared prefix holds the same tokens
        n = min(shared_prefix_blocks * BLOCK, seq_lens[b])
        kv_c[b][:n], k_pe[b][:n] = kv_c[0][:n], k_pe[0][:n]
    q = [torch.randn(q_len, HEADS, NOPE + rope, generator=gen) for q_len in q_lens]
    weight = torch.randn(HEADS * (NOPE + V), kv_lora, generator=gen) / kv_lora**0.5
    cache = torch.full((num_blocks, BLOCK, kv_lora + rope), float("nan"), dtype=dtype)
    return (
        table,
        seq_lens,
        [t.to(dtype) for t in kv_c],
        [t.to(dtype) for t in k_pe],
        [t.to(dtype) for t in q],
        weight.to(dtype),
        cache,
    )


def _write(impl, cache, table, kv_c, k_pe, seq_lens, ctx_lens):
    """Write every token (context first, as earlier steps would have, then the new tokens)."""
    for phase in ("context", "new"):
        rows_c, rows_pe, slots = [], [], []
        for b, s in enumerate(seq_lens):
            lo, hi = (0, ctx_lens[b]) if phase == "context" else (ctx_lens[b], s)
            pos = torch.arange(lo, hi)
            slots.append(table[b, pos // BLOCK] * BLOCK + pos % BLOCK)
            rows_c.append(kv_c[b][lo:hi])
            rows_pe.append(k_pe[b][lo:hi])
        slot_mapping = torch.cat([*slots, torch.tensor([-1])])  # a padding slot is skipped
        c = torch.cat([*rows_c, kv_c[0][:1]])
        pe = torch.cat([*rows_pe, k_pe[0][:1]]).unsqueeze(1)
        impl.do_kv_cache_update(c, pe, cache, slot_mapping, "auto", torch.tensor(1.0))


def _starts(lens):
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()])


LATENTS = [(32, 16), (512, 64), (24, 8)]


@pytest.mark.parametrize(("kv_lora", "rope"), LATENTS, ids=lambda v: str(v))
@pytest.mark.parametrize(
    ("ctx_lens", "q_lens", "shared"),
    [([0, 0], [5, 9], 0), ([6, 11], [3, 5], 0), ([8, 9, 12], [2, 4, 3], 2)],
    ids=["prefill", "chunked-prefill-with-context", "prefix-cache-hit"],
)
def test_forward_mha_equals_the_equations(kv_lora, rope, ctx_lens, q_lens, shared):
    scale = (NOPE + rope) ** -0.5
    table, seq_lens, kv_c, k_pe, q, weight, cache = _case(
        kv_lora, rope, torch.float32, q_lens, ctx_lens, shared
    )
    impl = _impl(kv_lora, rope, weight, scale)
    _write(impl, cache, table, kv_c, k_pe, seq_lens, ctx_lens)
    meta = AscendMLAMetadata(
        num_reqs=len(q_lens),
        num_actual_tokens=sum(q_lens),
        num_decodes=0,
        num_decode_tokens=0,
        num_prefills=len(q_lens),
        slot_mapping=torch.empty(0),
        prefill=AscendMLAPrefillMetadata(table, _starts(q_lens), torch.tensor(seq_lens), max(q_lens)),
    )
    output = torch.zeros(sum(q_lens), HEADS * V)
    impl.forward_mha(torch.cat(q), None, None, cache, meta, torch.tensor(1.0), output)
    expected = torch.cat(
        [_equations(q[b], kv_c[b], k_pe[b], weight, scale, q_lens[b]) for b in range(len(q_lens))]
    )
    torch.testing.assert_close(output.view(-1, HEADS, V).double(), expected, rtol=0, atol=1e-5)


def _absorbed_decode(impl, q, cache, weight, meta, kv_lora):
    """What vLLM's layer does around ``forward_mqa``: absorb ``W_UK`` into the query, project through ``W_UV``."""
    w = weight.view(HEADS, NOPE + V, kv_lora)
    w_uk, w_uv = w[:, :NOPE], w[:, NOPE:]  # [N, P, L], [N, V, L]
    q_nope, q_pe = q[..., :NOPE], q[..., NOPE:]
    ql_nope = torch.einsum("bnp,npl->bnl", q_nope, w_uk)
    latent, lse = impl.forward_mqa((ql_nope, q_pe), cache, meta, None)
    assert lse is None and latent.shape == (q.shape[0], HEADS, kv_lora)
    return torch.einsum("bnl,nvl->bnv", latent, w_uv)


@pytest.mark.parametrize(("kv_lora", "rope"), LATENTS, ids=lambda v: str(v))
@pytest.mark.parametrize("shared", [0, 2], ids=["own-blocks", "shared-prefix-blocks"])
def test_absorbed_decode_over_the_paged_latent_cache_equals_the_equations(kv_lora, rope, shared):
    scale = (NOPE + rope) ** -0.5
    ctx_lens = [9, 14, 10]
    table, seq_lens, kv_c, k_pe, q, weight, cache = _case(
        kv_lora, rope, torch.float32, [1, 1, 1], ctx_lens, shared, 1
    )
    impl = _impl(kv_lora, rope, weight, scale)
    _write(impl, cache, table, kv_c, k_pe, seq_lens, ctx_lens)
    meta = AscendMLAMetadata(
        num_reqs=3,
        num_actual_tokens=3,
        num_decodes=3,
        num_decode_tokens=3,
        num_prefills=0,
        slot_mapping=torch.empty(0),
        decode=AscendMLADecodeMetadata(table, _starts([1, 1, 1]), torch.tensor(seq_lens)),
    )
    got = _absorbed_decode(impl, torch.cat(q), cache, weight, meta, kv_lora)
    expected = torch.cat([_equations(q[b], kv_c[b], k_pe[b], weight, scale, 1) for b in range(3)])
    torch.testing.assert_close(got.double(), expected, rtol=0, atol=1e-5)


def _builder_config(num_speculative_tokens: int | None):
    """The fields of a ``VllmConfig`` the metadata builder reads to set its decode threshold."""
    from types import SimpleNamespace

    spec = None
    if num_speculative_tokens is not None:
        spec = SimpleNamespace(num_speculative_tokens=num_speculative_tokens, parallel_drafting=False)
    return SimpleNamespace(
        speculative_config=spec,
        use_v2_model_runner=False,
        parallel_config=SimpleNamespace(decode_context_parallel_size=1),
    )


@pytest.mark.parametrize(("num_speculative_tokens", "threshold"), [(None, 1), (1, 2), (3, 4)])
def test_the_decode_threshold_follows_the_speculative_tokens(num_speculative_tokens, threshold):
    from vllm_ascend.runner.attention.mla.metadata import AscendMLAMetadataBuilder

    builder = AscendMLAMetadataBuilder(None, ["layer"], _builder_config(num_speculative_tokens), "cpu")
    assert builder.reorder_batch_threshold == threshold


@pytest.mark.parametrize(("kv_lora", "rope"), LATENTS, ids=lambda v: str(v))
def test_speculative_verification_batch_decodes_on_the_latent_cache_equals_the_equations(kv_lora, rope):
    """A verification batch (1 + k query tokens per request, k = 2; one request with a shorter query) and
    a prefill after it, built by the metadata builder: the verification rows take the absorbed latent path
    (causal within each request's new tokens, over its paged context, prefix blocks shared), the prefill
    the decompressed one; every row equals the equations."""
    from vllm.v1.attention.backend import CommonAttentionMetadata

    from vllm_ascend.runner.attention.mla.metadata import AscendMLAMetadataBuilder

    scale = (NOPE + rope) ** -0.5
    ctx_lens, q_lens = [9, 14, 10, 5], [3, 3, 2, 7]
    table, seq_lens, kv_c, k_pe, q, weight, cache = _case(
        kv_lora, rope, torch.float32, q_lens, ctx_lens, 2, 3
    )
    impl = _impl(kv_lora, rope, weight, scale)
    _write(impl, cache, table, kv_c, k_pe, seq_lens, ctx_lens)
    starts = _starts(q_lens).to(torch.int32)
    common = CommonAttentionMetadata(
        query_start_loc=starts,
        query_start_loc_cpu=starts,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        num_reqs=4,
        num_actual_tokens=sum(q_lens),
        max_query_len=max(q_lens),
        max_seq_len=max(seq_lens),
        block_table_tensor=table.to(torch.int32),
        slot_mapping=torch.zeros(sum(q_lens), dtype=torch.int64),
    )
    builder = AscendMLAMetadataBuilder(None, ["layer"], _builder_config(2), "cpu")
    meta = builder.build(0, common)
    assert (meta.num_decodes, meta.num_decode_tokens, meta.num_prefills) == (3, 8, 1)
    assert meta.decode is not None and meta.decode.query_start_loc_cpu.tolist() == [0, 3, 6, 8]
    num_decode_tokens = meta.num_decode_tokens
    queries = torch.cat(q)
    got_d = _absorbed_decode(impl, queries[:num_decode_tokens], cache, weight, meta, kv_lora)
    out_p = torch.zeros(sum(q_lens) - num_decode_tokens, HEADS * V)
    impl.forward_mha(queries[num_decode_tokens:], None, None, cache, meta, torch.tensor(1.0), out_p)
    got = torch.cat([got_d, out_p.view(-1, HEADS, V)])
    expected = torch.cat(
        [_equations(q[b], kv_c[b], k_pe[b], weight, scale, q_lens[b]) for b in range(len(q_lens))]
    )
    torch.testing.assert_close(got.double(), expected, rtol=0, atol=1e-5)


def test_mixed_batch_in_bfloat16_stays_close_to_the_equations():
    kv_lora, rope = 32, 16
    scale = (NOPE + rope) ** -0.5
    ctx_lens, q_lens = [7, 5], [1, 6]
    table, seq_lens, kv_c, k_pe, q, weight, cache = _case(
        kv_lora, rope, torch.bfloat16, q_lens, ctx_lens, 0, 2
    )
    impl = _impl(kv_lora, rope, weight, scale)
    _write(impl, cache, table, kv_c, k_pe, seq_lens, ctx_lens)
    assert cache.dtype == torch.bfloat16
    decode = AscendMLAMetadata(
        num_reqs=1,
        num_actual_tokens=1,
        num_decodes=1,
        num_decode_tokens=1,
        num_prefills=0,
        slot_mapping=torch.empty(0),
        decode=AscendMLADecodeMetadata(table[:1], _starts([1]), torch.tensor(seq_lens[:1])),
    )
    prefill = AscendMLAMetadata(
        num_reqs=1,
        num_actual_tokens=6,
        num_decodes=0,
        num_decode_tokens=0,
        num_prefills=1,
        slot_mapping=torch.empty(0),
        prefill=AscendMLAPrefillMetadata(table[1:], _starts([6]), torch.tensor(seq_lens[1:]), 6),
    )
    got_d = _absorbed_decode(impl, q[0], cache, weight, decode, kv_lora)
    out_p = torch.zeros(6, HEADS * V, dtype=torch.bfloat16)
    impl.forward_mha(q[1], None, None, cache, prefill, torch.tensor(1.0), out_p)
    assert got_d.dtype == out_p.dtype == torch.bfloat16
    torch.testing.assert_close(
        got_d.double(), _equations(q[0], kv_c[0], k_pe[0], weight, scale, 1), rtol=0.05, atol=0.05
    )
    torch.testing.assert_close(
        out_p.view(6, HEADS, V).double(),
        _equations(q[1], kv_c[1], k_pe[1], weight, scale, 6),
        rtol=0.05,
        atol=0.05,
    )


def test_unsupported_options_are_refused_by_name():
    weight = torch.zeros(HEADS * (NOPE + V), 32)
    with pytest.raises(
        AttentionConfigError, match="sliding_window is not supported by the Ascend MLA backend"
    ):
        AscendMLAImpl(
            num_heads=HEADS, head_size=48, scale=1.0, num_kv_heads=1, alibi_slopes=None, sliding_window=8,
            kv_cache_dtype="auto", logits_soft_cap=None, attn_type="decoder", kv_sharing_target_layer_name=None,
            q_lora_rank=None, kv_lora_rank=32, qk_nope_head_dim=NOPE, qk_rope_head_dim=16,
            qk_head_dim=NOPE + 16, v_head_dim=V, kv_b_proj=_KvBProj(weight),
        )  # fmt: skip
    with pytest.raises(AttentionConfigError, match=r"kv_cache_dtype='fp8' is not supported .* allowed: auto"):
        AscendMLAImpl(
            num_heads=HEADS, head_size=48, scale=1.0, num_kv_heads=1, alibi_slopes=None, sliding_window=None,
            kv_cache_dtype="fp8", logits_soft_cap=None, attn_type="decoder", kv_sharing_target_layer_name=None,
            q_lora_rank=None, kv_lora_rank=32, qk_nope_head_dim=NOPE, qk_rope_head_dim=16,
            qk_head_dim=NOPE + 16, v_head_dim=V, kv_b_proj=_KvBProj(weight),
        )  # fmt: skip
    with pytest.raises(
        AttentionConfigError, match="topk_indices_buffer is not supported by the Ascend MLA backend"
    ):
        AscendMLAImpl(
            num_heads=HEADS, head_size=48, scale=1.0, num_kv_heads=1, alibi_slopes=None, sliding_window=None,
            kv_cache_dtype="auto", logits_soft_cap=None, attn_type="decoder", kv_sharing_target_layer_name=None,
            q_lora_rank=None, kv_lora_rank=32, qk_nope_head_dim=NOPE, qk_rope_head_dim=16,
            qk_head_dim=NOPE + 16, v_head_dim=V, kv_b_proj=_KvBProj(weight), topk_indices_buffer=torch.zeros(1),
        )  # fmt: skip


def test_the_platform_names_the_mla_and_sparse_mla_backends_from_the_worker():
    from vllm.v1.attention.selector import AttentionSelectorConfig

    from vllm_ascend.core.platform import ReferencePlatform
    from vllm_ascend.runner.attention.mla.backend import AscendMLABackend

    selector = AttentionSelectorConfig(
        head_size=48, dtype=None, kv_cache_dtype=None, block_size=16, use_mla=True
    )
    assert (
        ReferencePlatform.get_attn_backend_cls(None, selector)
        == f"{AscendMLABackend.__module__}.AscendMLABackend"
    )
    assert AscendMLABackend.is_mla() and AscendMLABackend.supports_head_size(48)
    assert ReferencePlatform.get_attn_backend_cls(None, selector._replace(use_sparse=True)) == (
        "vllm_ascend.runner.attention.mla.sparse.AscendSFABackend"
    )
    with pytest.raises(
        ValueError, match=r"use_sparse=True is not supported .* \(use_mla=True with use_sparse"
    ):
        ReferencePlatform.get_attn_backend_cls(None, selector._replace(use_mla=False, use_sparse=True))
    prefill_cls = ReferencePlatform.get_mla_prefill_backend_cls(None)
    assert prefill_cls.__name__ == "CPUSDPAMLAPrefillBackend"
