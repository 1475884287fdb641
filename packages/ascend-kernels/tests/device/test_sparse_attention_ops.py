"""The DSA / SFA (DeepSeek-V3.2 sparse attention) device ops against their equations, and their NPU mapping.

The reference ops (fp32) are held to float64 equations written here independently: the lightning
indexer's ``score[t, s] = sum_h w[t, h] * relu(q[t, h] . k[s])`` top-k over the causally visible keys
(query ``j`` of ``q_len`` sees keys ``0 .. seq_len - q_len + j``), and the absorbed MLA attention (key
``[c_kv | k_pe]``, value ``c_kv``) restricted to the selected positions. Batches mix a decode row (q_len 1),
a multi-token verification request, a request with no query tokens, a chunked prefill over context and a
full prefill, on paged caches with shuffled block ids. The NPU adaptor runs against a stand-in ``torch_npu``
whose three ops follow the torch-npu 2.13.0 documentation and the kernels' argument checks (TND cumulative
query lengths, PA_BSND caches, int32 metadata, valid-first sparse indices) and must agree with the
reference in bf16.
"""

from __future__ import annotations

import math
import sys
import types
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from vllm_ascend.core.device.adaptor.base import DeviceOpError
from vllm_ascend.core.device.adaptor.sparse import SPARSE_OPS, SparseAttentionDeviceOps
from vllm_ascend.kernels.device.npu import A2A3DeviceAdaptor
from vllm_ascend.kernels.device.reference import ReferenceDeviceAdaptor

# (q_len, seq_len) per request: decode, verification (1 + 2 drafts), no query tokens, chunked prefill over
# context, full prefill (its first rows see fewer keys than the top-k keeps).
REQUESTS = ((1, 9), (3, 12), (0, 5), (5, 11), (6, 6))
# The same mix at the NPU kernels' geometry (block size a multiple of 16).
NPU_REQUESTS = ((1, 20), (3, 35), (0, 9), (6, 40), (5, 5))
NO_LIMIT = 2**63 - 1  # the kernels' only accepted pre_tokens / next_tokens
HALF_DTYPES = (torch.bfloat16, torch.float16)


# -- batches and inputs --------------------------------------------------------------------------------------
@dataclass
class PagedBatch:
    """Requests laid out on a paged cache: int32 metadata as the runner hands it to the ops."""

    q_lens: list[int]
    seq_lens: list[int]
    block_table: torch.Tensor  # [B, max_blocks + 1], shuffled block ids, padded with 0
    query_start_loc: torch.Tensor  # [B + 1]
    seq_lens_t: torch.Tensor  # [B]
    slots: list[torch.Tensor]  # per request: the cache slot of each of its positions

    @property
    def num_tokens(self) -> int:
        return sum(self.q_lens)

    def meta(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.block_table, self.query_start_loc, self.seq_lens_t

    def rows(self) -> list[tuple[int, int, int]]:
        """``(t, b, last)`` per query row: its request and the last key position it sees."""
        out, t = [], 0
        for b, (q_len, seq_len) in enumerate(zip(self.q_lens, self.seq_lens, strict=True)):
            for j in range(q_len):
                out.append((t, b, seq_len - q_len + j))
                t += 1
        return out


def _paged_batch(gen: torch.Generator, requests, block_size: int, num_blocks: int) -> PagedBatch:
    need = [-(-seq_len // block_size) for _, seq_len in requests]
    assert sum(need) <= num_blocks
    free = torch.randperm(num_blocks, generator=gen).tolist()
    table = torch.zeros(len(requests), max(need) + 1, dtype=torch.int32)
    slots = []
    for b, (_, seq_len) in enumerate(requests):
        blocks = [free.pop() for _ in range(need[b])]
        table[b, : len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
        slots.append(
            torch.tensor([blocks[p // block_size] * block_size + p % block_size for p in range(seq_len)])
        )
    q_lens = [q for q, _ in requests]
    starts = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    seq_lens = [s for _, s in requests]
    return PagedBatch(q_lens, seq_lens, table, starts, torch.tensor(seq_lens, dtype=torch.int32), slots)


def _fill(cache: torch.Tensor, batch: PagedBatch, per_request: list[torch.Tensor]) -> None:
    """Put each request's indexer keys at their slots of ``cache [blocks, block_size, D]`` (row ``s`` is block
    ``s // block_size``, offset ``s % block_size``), independently of ``indexer_cache_write``."""
    flat = cache.view(-1, cache.shape[-1])
    for slots, rows in zip(batch.slots, per_request, strict=True):
        flat[slots] = rows.to(cache.dtype)


def _write_latent(cache: torch.Tensor, batch: PagedBatch, per_request: list[torch.Tensor], lora: int) -> None:
    """Put each request's ``[c_kv | k_pe]`` rows at their slots through ``mla_cache_write``, the op that owns
    the latent cache's layout (a fresh adaptor: the tested one's call counts stay untouched)."""
    rows, slots = torch.cat(per_request), torch.cat(batch.slots)
    ReferenceDeviceAdaptor().mla_cache_write(rows[:, :lora], rows[:, lora:], cache, slots)


def _index_keys(gen: torch.Generator, seq_len: int, dim: int) -> torch.Tensor:
    return torch.rand(seq_len, dim, generator=gen) + 0.05


def _index_queries(gen: torch.Generator, tokens: int, heads: int, dim: int):
    """Indexer queries and weights whose scores do not tie: head 0 has positive queries and weights (the
    keys are positive), so every score carries a continuous positive term; the other heads exercise relu and
    signs."""
    q = torch.randn(tokens, heads, dim, generator=gen)
    q[:, 0] = torch.rand(tokens, dim, generator=gen) + 0.1
    w = torch.randn(tokens, heads, generator=gen)
    w[:, 0] = torch.rand(tokens, generator=gen) + 1.0
    return q, w


def _all_tokens(gen: torch.Generator, batch: PagedBatch, per_request: list[torch.Tensor], pad: int = 2):
    """Every position of every request in shuffled order, then ``pad`` padding tokens (slot -1)."""
    rows = torch.cat(per_request)
    order = torch.randperm(rows.shape[0], generator=gen)
    slots = torch.cat([torch.cat(batch.slots)[order], torch.full((pad,), -1)])
    return torch.cat([rows[order], torch.full((pad, rows.shape[1]), 1e3, dtype=rows.dtype)]), slots


# -- the equations (float64) ---------------------------------------------------------------------------------
def _index_scores(q_t: torch.Tensor, w_t: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """``score[s] = sum_h w[h] * relu(q[h] . k[s])`` for ``q_t [H, D]``, ``w_t [H]``, ``keys [S, D]``."""
    return (w_t.double().unsqueeze(1) * torch.relu(q_t.double() @ keys.double().T)).sum(0)


def _assert_tie_free(scores: torch.Tensor, count: int) -> None:
    """The ``count + 1`` best scores are far enough apart that fp32 and float64 order them alike."""
    best = scores.sort(descending=True).values[: count + 1]
    gap = 1e-5 * max(1.0, float(best.abs().max()))
    assert bool((best[:-1] - best[1:] > gap).all()), f"near-tied index scores {best.tolist()}"


def _sparse_attention(q_nope_t, q_pe_t, rows, positions, scale, lora) -> torch.Tensor:
    """``[N, L]``: softmax over ``positions`` of ``scale * (q_nope . c_kv + q_pe . k_pe)`` on ``c_kv``; zero
    when no position is left."""
    if not positions:
        return torch.zeros(q_nope_t.shape[0], lora, dtype=torch.float64)
    sel = rows[positions].double()
    scores = (q_nope_t.double() @ sel[:, :lora].T + q_pe_t.double() @ sel[:, lora:].T) * scale
    return torch.softmax(scores, dim=-1) @ sel[:, :lora]


# -- the op set ----------------------------------------------------------------------------------------------
def test_both_family_adaptors_provide_the_sparse_ops():
    assert issubclass(ReferenceDeviceAdaptor, SparseAttentionDeviceOps)
    assert issubclass(A2A3DeviceAdaptor, SparseAttentionDeviceOps)
    assert SPARSE_OPS == ("indexer_cache_write", "lightning_indexer", "sparse_flash_attention")
    for name in SPARSE_OPS:
        ref_op, npu_op = getattr(ReferenceDeviceAdaptor, name), getattr(A2A3DeviceAdaptor, name)
        assert ref_op is not npu_op
        assert getattr(ref_op, "__counted__", False) and getattr(npu_op, "__counted__", False)
    assert not ReferenceDeviceAdaptor.__abstractmethods__ and not A2A3DeviceAdaptor.__abstractmethods__


# -- indexer_cache_write -------------------------------------------------------------------------------------
def test_indexer_cache_write_scatters_rows_skips_padding_and_counts():
    adaptor = ReferenceDeviceAdaptor()
    cache = torch.zeros(3, 4, 4)
    key = torch.arange(16.0).view(4, 4) + 1
    adaptor.indexer_cache_write(key, cache, torch.tensor([9, -1, 2]))  # 3 slots: token 3 is not written
    assert torch.equal(cache[2, 1], key[0]) and torch.equal(cache[0, 2], key[2])  # slot = block * 4 + offset
    assert int((cache.view(-1, 4).abs().sum(-1) > 0).sum()) == 2
    adaptor.indexer_cache_write(key, cache, torch.full((4,), -1))  # all padding: nothing written
    assert int((cache.view(-1, 4).abs().sum(-1) > 0).sum()) == 2
    half = torch.zeros(2, 4, 4, dtype=torch.bfloat16)
    adaptor.indexer_cache_write(key / 3, half, torch.tensor([7, 0], dtype=torch.int32))
    assert torch.equal(half[1, 3], (key[0] / 3).bfloat16())  # stored in the cache dtype
    assert torch.equal(half[0, 0], (key[1] / 3).bfloat16())
    assert adaptor.call_counts["indexer_cache_write"] == 3

    with pytest.raises(DeviceOpError, match="slot 12 is out of range for a cache of 3 blocks x 4"):
        adaptor.indexer_cache_write(key, cache, torch.tensor([12, -1]))
    with pytest.raises(DeviceOpError, match=r"key must be \[T, D\], got shape \(4, 2, 2\)"):
        adaptor.indexer_cache_write(key.view(4, 2, 2), cache, torch.tensor([0]))
    with pytest.raises(
        DeviceOpError, match=r"key_cache must be \[num_blocks, block_size, 4\], got shape \(3, 4, 5\)"
    ):
        adaptor.indexer_cache_write(key, torch.zeros(3, 4, 5), torch.tensor([0]))
    with pytest.raises(DeviceOpError, match=r"slot_mapping must be 1-D, got shape \(2, 1\)"):
        adaptor.indexer_cache_write(key, cache, torch.tensor([[0], [1]]))
    with pytest.raises(DeviceOpError, match="5 slots but 4 tokens"):
        adaptor.indexer_cache_write(key, cache, torch.arange(5))


# -- lightning_indexer ---------------------------------------------------------------------------------------
def test_lightning_indexer_keeps_the_top_scores_of_the_visible_keys():
    gen = torch.Generator().manual_seed(1)
    adaptor = ReferenceDeviceAdaptor()
    heads, dim, topk = 4, 8, 5
    batch = _paged_batch(gen, REQUESTS, block_size=4, num_blocks=16)
    keys = [_index_keys(gen, s, dim) for s in batch.seq_lens]
    cache = torch.zeros(16, 4, dim)
    _fill(cache, batch, keys)
    tokens = batch.num_tokens
    # two padding query rows past the batch: they belong to no request
    q, w = _index_queries(gen, tokens + 2, heads, dim)
    out = adaptor.lightning_indexer(q, cache, w, *batch.meta(), topk)
    assert out.dtype == torch.int32 and out.shape == (tokens + 2, topk)
    padded_rows = 0
    for t, b, last in batch.rows():
        scores = _index_scores(q[t], w[t], keys[b][: last + 1])
        keep = min(topk, last + 1)
        _assert_tie_free(scores, keep)
        best = scores.argsort(descending=True)[:keep].tolist()  # descending score order
        row = out[t].tolist()
        assert set(row[:keep]) == set(best), f"row {t}"
        assert row[:keep] == best, f"row {t}: not in descending score order"
        assert row[keep:] == [-1] * (topk - keep)
        padded_rows += keep < topk
    assert padded_rows == 4  # the full prefill's rows 0..3 see 1..4 keys
    assert bool((out[tokens:] == -1).all())
    assert adaptor.call_counts["lightning_indexer"] == 1

    table, starts, seq_lens = batch.meta()
    with pytest.raises(DeviceOpError, match=r"weights must be \[T, H\] = \(17, 4\), got \(17, 3\)"):
        adaptor.lightning_indexer(q, cache, w[:, :3], table, starts, seq_lens, topk)
    with pytest.raises(DeviceOpError, match="topk must be >= 1, got 0"):
        adaptor.lightning_indexer(q, cache, w, table, starts, seq_lens, 0)
    with pytest.raises(
        DeviceOpError, match="request 0: seq_len=9 needs 3 blocks of 4 but block_table has 2 columns"
    ):
        adaptor.lightning_indexer(q, cache, w, table[:, :2], starts, seq_lens, topk)
    with pytest.raises(DeviceOpError, match=r"query must be \[T, H, D\], got shape \(17, 32\)"):
        adaptor.lightning_indexer(q.flatten(1), cache, w, table, starts, seq_lens, topk)
    with pytest.raises(
        DeviceOpError, match=r"key_cache must be \[num_blocks, block_size, 8\], got shape \(16, 4, 7\)"
    ):
        adaptor.lightning_indexer(q, cache[..., :7], w, table, starts, seq_lens, topk)
    short = seq_lens.clone()
    short[1] = 2
    with pytest.raises(DeviceOpError, match=r"request 1: query length 3 must be within \[0, seq_len=2\]"):
        adaptor.lightning_indexer(q, cache, w, table, starts, short, topk)


# -- sparse_flash_attention ----------------------------------------------------------------------------------
def _latent_case(
    gen: torch.Generator, requests, heads: int, lora: int, rope: int, block_size: int, num_blocks: int
):
    batch = _paged_batch(gen, requests, block_size, num_blocks)
    latent = [torch.randn(s, lora + rope, generator=gen) for s in batch.seq_lens]
    kv_cache = torch.zeros(num_blocks, block_size, lora + rope)
    _write_latent(kv_cache, batch, latent, lora)
    q_nope = torch.randn(batch.num_tokens, heads, lora, generator=gen)
    q_pe = torch.randn(batch.num_tokens, heads, rope, generator=gen)
    return batch, latent, kv_cache, q_nope, q_pe


def _mixed_selection(gen: torch.Generator, batch: PagedBatch, width: int) -> torch.Tensor:
    """Per row, distinct random positions of its request (causally visible or not) with ``-1`` entries in
    between; row 0 of the chunked prefill selects nothing, row 0 of the full prefill only keys it cannot
    see."""
    sel = torch.full((batch.num_tokens, width), -1, dtype=torch.int32)
    for t, b, _ in batch.rows():
        chosen = torch.randperm(batch.seq_lens[b], generator=gen)[: width - 2]
        row = torch.cat([chosen, torch.tensor([-1, -1])])
        sel[t] = row[torch.randperm(width, generator=gen)].to(torch.int32)
    chunk_start, prefill_start = int(batch.query_start_loc[3]), int(batch.query_start_loc[4])
    sel[chunk_start] = -1
    sel[prefill_start] = torch.tensor([3, -1, 5, 1, -1, 4], dtype=torch.int32)[:width]
    return sel


def test_sparse_attention_is_the_latent_attention_over_the_selected_visible_keys():
    gen = torch.Generator().manual_seed(2)
    adaptor = ReferenceDeviceAdaptor()
    heads, lora, rope, scale = 2, 16, 4, 0.3
    batch, latent, kv_cache, q_nope, q_pe = _latent_case(gen, REQUESTS, heads, lora, rope, 4, 16)
    tokens = batch.num_tokens
    sel = _mixed_selection(gen, batch, width=6)
    # rows past the batch are not read, whatever they hold
    padded_sel = torch.cat([sel, torch.full((3, 6), 10**6, dtype=torch.int32)])
    out = adaptor.sparse_flash_attention(q_nope, q_pe, kv_cache, padded_sel, *batch.meta(), scale)
    assert out.shape == (tokens, heads, lora) and out.dtype == torch.float32
    masked_rows = empty_rows = 0
    for t, b, last in batch.rows():
        picked = [i for i in sel[t].tolist() if i >= 0]
        visible = [i for i in picked if i <= last]
        expected = _sparse_attention(q_nope[t], q_pe[t], latent[b], visible, scale, lora)
        torch.testing.assert_close(out[t].double(), expected, rtol=0, atol=1e-5)
        masked_rows += len(visible) < len(picked)
        empty_rows += not visible
    assert masked_rows >= 3 and empty_rows == 2  # beyond-causal picks were dropped; two rows attend nothing
    assert bool((out[int(batch.query_start_loc[3])] == 0).all())

    buffer = torch.full((tokens + 2, heads, lora), 7.0)
    written = adaptor.sparse_flash_attention(q_nope, q_pe, kv_cache, sel, *batch.meta(), scale, output=buffer)
    assert written.data_ptr() == buffer.data_ptr() and written.shape == (tokens, heads, lora)
    assert torch.equal(buffer[:tokens], out) and bool((buffer[tokens:] == 7.0).all())
    assert adaptor.call_counts["sparse_flash_attention"] == 2


def test_sparse_attention_selecting_every_visible_key_is_the_dense_latent_attention():
    gen = torch.Generator().manual_seed(3)
    adaptor = ReferenceDeviceAdaptor()
    heads, lora, rope, scale = 2, 16, 4, 0.25
    batch, _, kv_cache, q_nope, q_pe = _latent_case(gen, REQUESTS, heads, lora, rope, 4, 16)
    keys = [_index_keys(gen, s, 8) for s in batch.seq_lens]
    index_cache = torch.zeros(16, 4, 8)
    _fill(index_cache, batch, keys)
    q, w = _index_queries(gen, batch.num_tokens, 4, 8)
    topk = max(batch.seq_lens) + 1
    sel = adaptor.lightning_indexer(q, index_cache, w, *batch.meta(), topk)
    for t, _, last in batch.rows():
        assert sorted(i for i in sel[t].tolist() if i >= 0) == list(range(last + 1))
    sparse = adaptor.sparse_flash_attention(q_nope, q_pe, kv_cache, sel, *batch.meta(), scale)
    dense = adaptor.mla_latent_attention(q_nope, q_pe, kv_cache, *batch.meta(), scale)
    torch.testing.assert_close(sparse, dense, rtol=0, atol=1e-5)


def test_sparse_attention_refuses_bad_arguments_by_name():
    gen = torch.Generator().manual_seed(4)
    adaptor = ReferenceDeviceAdaptor()
    batch, _, kv_cache, q_nope, q_pe = _latent_case(gen, REQUESTS, 2, 16, 4, 4, 16)
    table, starts, seq_lens = batch.meta()
    sel = torch.zeros(batch.num_tokens, 3, dtype=torch.int32)
    call = adaptor.sparse_flash_attention
    beyond = sel.clone()
    beyond[2, 1] = 12  # request 1 holds 12 keys: positions 0..11
    with pytest.raises(DeviceOpError, match="request 1: topk index 12 is beyond its 12 keys"):
        call(q_nope, q_pe, kv_cache, beyond, table, starts, seq_lens, 1.0)
    with pytest.raises(DeviceOpError, match=r"q_nope \[T, N, L\] and q_pe \[T, N, R\] must agree"):
        call(q_nope, q_pe[:, :1], kv_cache, sel, table, starts, seq_lens, 1.0)
    with pytest.raises(DeviceOpError, match=r"q_nope \(16\) \+ q_pe \(3\) dims != cache row 20"):
        call(q_nope, q_pe[..., :3], kv_cache, sel, table, starts, seq_lens, 1.0)
    with pytest.raises(DeviceOpError, match=r"topk_indices must be \[>= 15, topk\], got \(14, 3\)"):
        call(q_nope, q_pe, kv_cache, sel[:14], table, starts, seq_lens, 1.0)
    with pytest.raises(DeviceOpError, match=r"output must be \[>= 15, 2, 16\], got \(15, 2, 8\)"):
        call(q_nope, q_pe, kv_cache, sel, table, starts, seq_lens, 1.0, output=torch.zeros(15, 2, 8))
    with pytest.raises(
        DeviceOpError, match="request 0: seq_len=9 needs 3 blocks of 4 but block_table has 2 columns"
    ):
        call(q_nope, q_pe, kv_cache, sel, table[:, :2], starts, seq_lens, 1.0)
    with pytest.raises(
        DeviceOpError, match=r"kv_cache must be \[num_blocks, block_size, kv_lora_rank \+ rope_dim\]"
    ):
        call(q_nope, q_pe, kv_cache.flatten(0, 1), sel, table, starts, seq_lens, 1.0)


# -- the composition -----------------------------------------------------------------------------------------
def test_indexer_then_sparse_attention_is_dense_attention_masked_to_the_top_k():
    """The layer's path: keys written through the cache ops, top-k from the indexer, SFA on the latent
    cache == float64 dense attention whose scores outside each row's top-k (HF's index mask) and causal mask
    are -inf."""
    gen = torch.Generator().manual_seed(6)
    adaptor = ReferenceDeviceAdaptor()
    index_heads, index_dim, heads, lora, rope, topk, scale = 4, 8, 2, 16, 4, 4, 0.3
    batch = _paged_batch(gen, REQUESTS, block_size=4, num_blocks=16)
    keys = [_index_keys(gen, s, index_dim) for s in batch.seq_lens]
    latent = [torch.randn(s, lora + rope, generator=gen) for s in batch.seq_lens]
    index_cache, kv_cache = torch.zeros(16, 4, index_dim), torch.zeros(16, 4, lora + rope)
    key_rows, slots = _all_tokens(gen, batch, keys)
    adaptor.indexer_cache_write(key_rows, index_cache, slots)
    latent_rows, slots = _all_tokens(gen, batch, latent)
    adaptor.mla_cache_write(latent_rows[:, :lora], latent_rows[:, lora:], kv_cache, slots)

    q, w = _index_queries(gen, batch.num_tokens, index_heads, index_dim)
    q_nope = torch.randn(batch.num_tokens, heads, lora, generator=gen)
    q_pe = torch.randn(batch.num_tokens, heads, rope, generator=gen)
    selected = adaptor.lightning_indexer(q, index_cache, w, *batch.meta(), topk)
    out = adaptor.sparse_flash_attention(q_nope, q_pe, kv_cache, selected, *batch.meta(), scale)

    sparsity_effect = 0.0
    starts = batch.query_start_loc.tolist()
    for b, (q_len, seq_len) in enumerate(zip(batch.q_lens, batch.seq_lens, strict=True)):
        if q_len == 0:
            continue
        rows = slice(starts[b], starts[b + 1])
        causal = torch.full((q_len, seq_len), -math.inf, dtype=torch.float64).triu(seq_len - q_len + 1)
        index_scores = torch.einsum(
            "qh,qhs->qs", w[rows].double(), torch.relu(q[rows].double() @ keys[b].double().T)
        )
        index_scores = index_scores + causal
        for j in range(q_len):
            _assert_tie_free(index_scores[j][causal[j] == 0], min(topk, seq_len - q_len + j + 1))
        top = index_scores.topk(min(topk, seq_len), dim=-1).indices
        index_mask = torch.full((q_len, seq_len), -math.inf, dtype=torch.float64).scatter(-1, top, 0.0)
        c_kv, k_pe = latent[b][:, :lora].double(), latent[b][:, lora:].double()
        scores = (q_nope[rows].double() @ c_kv.T + q_pe[rows].double() @ k_pe.T) * scale  # [q, N, S]
        expected = torch.softmax(scores + (index_mask + causal).unsqueeze(1), dim=-1) @ c_kv
        torch.testing.assert_close(out[rows].double(), expected, rtol=0, atol=1e-5)
        dense = torch.softmax(scores + causal.unsqueeze(1), dim=-1) @ c_kv
        sparsity_effect = max(sparsity_effect, float((expected - dense).abs().max()))
    assert sparsity_effect > 0.05  # the top-k restriction changes the result: the test can tell them apart


# -- the NPU mapping against emulated torch_npu ops ----------------------------------------------------------
def _paged(cache: torch.Tensor, block_table_row: torch.Tensor, length: int) -> torch.Tensor:
    """The first ``length`` rows of one request in a PA_BSND cache ``[blocks, block_size, 1, D]``, float64."""
    num_blocks = -(-length // cache.shape[1])
    return cache[block_table_row[:num_blocks].long(), :, 0].reshape(-1, cache.shape[-1])[:length].double()


class FakeSparseTorchNpu(types.ModuleType):
    """The three torch_npu ops the sparse mapping calls, as torch-npu 2.13.0 documents them (float64 math),
    asserting the argument layouts, dtypes and values the kernels accept; keyword arguments are recorded."""

    def __init__(self) -> None:
        super().__init__("torch_npu")
        self.calls: Counter[str] = Counter()
        self.kwargs: dict[str, dict[str, Any]] = {}

    def __getattribute__(self, name: str):
        if name.startswith("npu_"):
            object.__getattribute__(self, "calls")[name] += 1
        return object.__getattribute__(self, name)

    def npu_scatter_nd_update_(self, input, indices, updates):
        # Documented: indices [N, 1] int32/int64 within range, updates [N, *input[1:]] of input's dtype.
        assert indices.dtype in (torch.int32, torch.int64) and indices.dim() == 2 and indices.shape[1] == 1
        assert updates.dtype == input.dtype and tuple(updates.shape) == (indices.shape[0], *input.shape[1:])
        assert bool(((indices >= 0) & (indices < input.shape[0])).all())
        for row, update in zip(indices[:, 0].tolist(), updates, strict=True):
            input[row] = update
        return input

    @staticmethod
    def _requests(q_ends, kv_lens, block_table, tokens: int, block_size: int) -> list[tuple[int, int, int]]:
        """``(start, end, kv_len)`` per request from TND's cumulative query lengths and per-request key
        lengths."""
        assert q_ends.dtype == kv_lens.dtype == block_table.dtype == torch.int32
        assert q_ends.dim() == kv_lens.dim() == 1 and block_table.dim() == 2
        ends, lens = q_ends.tolist(), kv_lens.tolist()
        assert len(ends) == len(lens) == block_table.shape[0] and ends[-1] == tokens
        assert block_table.shape[1] * block_size >= max(lens)
        spans, start = [], 0
        for end, kv_len in zip(ends, lens, strict=True):
            assert start <= end and end - start <= kv_len  # cumulative, causal within the request's keys
            spans.append((start, end, kv_len))
            start = end
        return spans

    @staticmethod
    def _check_paged(key: torch.Tensor, head_dim: int) -> None:
        assert key.dim() == 4 and key.shape[2] == 1 and key.shape[3] == head_dim and key.is_contiguous()
        assert key.shape[1] % 16 == 0 and 0 < key.shape[1] <= 1024  # the kernels' block sizes

    def npu_lightning_indexer(
        self,
        query,
        key,
        weights,
        *,
        actual_seq_lengths_query=None,
        actual_seq_lengths_key=None,
        block_table=None,
        layout_query="BSND",
        layout_key="BSND",
        sparse_count=2048,
        sparse_mode=3,
        pre_tokens=NO_LIMIT,
        next_tokens=NO_LIMIT,
        return_value=False,
    ):
        self.kwargs["npu_lightning_indexer"] = {"sparse_count": sparse_count, "sparse_mode": sparse_mode}
        assert layout_query == "TND" and layout_key == "PA_BSND" and sparse_mode == 3
        assert pre_tokens == next_tokens == NO_LIMIT
        assert 1 <= sparse_count <= 2048 or sparse_count in (3072, 4096, 5120, 6144, 7168, 8192)
        assert query.dtype in HALF_DTYPES and key.dtype == weights.dtype == query.dtype
        assert query.dim() == 3 and query.shape[1] <= 64 and query.shape[2] == 128 and query.is_contiguous()
        assert tuple(weights.shape) == tuple(query.shape[:2]) and weights.is_contiguous()
        self._check_paged(key, query.shape[2])
        tokens = query.shape[0]
        spans = self._requests(
            actual_seq_lengths_query, actual_seq_lengths_key, block_table, tokens, key.shape[1]
        )
        indices = torch.full((tokens, 1, sparse_count), -1, dtype=torch.int32)
        values = torch.full((tokens, 1, sparse_count), -math.inf, dtype=query.dtype)
        for b, (start, end, kv_len) in enumerate(spans):
            keys = _paged(key, block_table[b], kv_len)
            for j, t in enumerate(range(start, end)):
                visible = kv_len - (end - start) + j + 1  # sparse_mode 3: right-down causal
                score = (
                    weights[t].double().unsqueeze(1) * torch.relu(query[t].double() @ keys[:visible].T)
                ).sum(0)
                ranked = score.sort(descending=True)
                n = min(sparse_count, visible)
                indices[t, 0, :n] = ranked.indices[:n].to(torch.int32)
                values[t, 0, :n] = ranked.values[:n].to(query.dtype)
        return indices, values

    def npu_sparse_flash_attention(
        self,
        query,
        key,
        value,
        sparse_indices,
        scale_value,
        *,
        block_table=None,
        actual_seq_lengths_query=None,
        actual_seq_lengths_kv=None,
        query_rope=None,
        key_rope=None,
        sparse_block_size=1,
        layout_query="BSND",
        layout_kv="BSND",
        sparse_mode=3,
        pre_tokens=NO_LIMIT,
        next_tokens=NO_LIMIT,
        attention_mode=0,
        return_softmax_lse=False,
        sinks=None,
    ):
        self.kwargs["npu_sparse_flash_attention"] = {
            "attention_mode": attention_mode,
            "scale_value": scale_value,
        }
        assert (
            layout_query == "TND" and layout_kv == "PA_BSND" and sparse_mode == 3 and sparse_block_size == 1
        )
        assert pre_tokens == next_tokens == NO_LIMIT and not return_softmax_lse and sinks is None
        assert isinstance(scale_value, float)
        assert query_rope is not None and key_rope is not None
        tensors = (query, key, value, query_rope, key_rope)
        assert query.dtype in HALF_DTYPES and all(
            x.dtype == query.dtype and x.is_contiguous() for x in tensors
        )
        tokens, heads, lora = query.shape
        assert lora == 512 and heads in (1, 2, 4, 8, 16, 32, 64, 128)
        assert tuple(query_rope.shape) == (tokens, heads, 64)
        self._check_paged(key, lora)
        assert value.shape == key.shape and tuple(key_rope.shape) == (*key.shape[:3], 64)
        assert sparse_indices.dtype == torch.int32 and sparse_indices.is_contiguous()
        assert sparse_indices.dim() == 3 and tuple(sparse_indices.shape[:2]) == (tokens, 1)
        spans = self._requests(
            actual_seq_lengths_query, actual_seq_lengths_kv, block_table, tokens, key.shape[1]
        )
        out = torch.zeros(tokens, heads, lora, dtype=torch.float64)
        for b, (start, end, kv_len) in enumerate(spans):
            k = torch.cat(
                [_paged(key, block_table[b], kv_len), _paged(key_rope, block_table[b], kv_len)], dim=-1
            )
            v = _paged(value, block_table[b], kv_len)
            for j, t in enumerate(range(start, end)):
                row = sparse_indices[t, 0].tolist()
                valid = next((n for n, i in enumerate(row) if i == -1), len(row))
                assert all(i == -1 for i in row[valid:]), "sparse_indices: valid entries first, then -1"
                assert all(0 <= i < kv_len for i in row[:valid])
                last = kv_len - (end - start) + j  # sparse_mode 3: the selected keys past it are masked
                keep = [i for i in row[:valid] if i <= last]
                if keep:
                    q = torch.cat([query[t], query_rope[t]], dim=-1).double()
                    out[t] = torch.softmax(q @ k[keep].T * scale_value, dim=-1) @ v[keep]
        return out.to(query.dtype), torch.empty(0), torch.empty(0)


@pytest.fixture
def fake_npu(monkeypatch) -> FakeSparseTorchNpu:
    fake = FakeSparseTorchNpu()
    monkeypatch.setitem(sys.modules, "torch_npu", fake)
    return fake


def _npu_case(seed: int):
    """bf16 inputs at the kernels' geometry: indexer 64 heads x 128, latent 512 + rope 64, 2 heads,
    block 16."""
    gen = torch.Generator().manual_seed(seed)
    batch = _paged_batch(gen, NPU_REQUESTS, block_size=16, num_blocks=14)
    keys = [_index_keys(gen, s, 128).bfloat16() for s in batch.seq_lens]
    latent = [torch.randn(s, 576, generator=gen) for s in batch.seq_lens]
    kv_cache = torch.zeros(14, 16, 576, dtype=torch.bfloat16)
    _write_latent(kv_cache, batch, latent, 512)
    q, w = (x.bfloat16() for x in _index_queries(gen, batch.num_tokens, 64, 128))
    q_nope = torch.randn(batch.num_tokens, 2, 512, generator=gen).bfloat16()
    q_pe = torch.randn(batch.num_tokens, 2, 64, generator=gen).bfloat16()
    return gen, batch, keys, kv_cache, q, w, q_nope, q_pe


def _valid_first_selection(gen: torch.Generator, batch: PagedBatch, width: int) -> torch.Tensor:
    """Per row: its last visible key, random other positions (some past the causal bound), then -1 padding."""
    sel = torch.full((batch.num_tokens, width), -1, dtype=torch.int32)
    for t, b, last in batch.rows():
        others = [i for i in torch.randperm(batch.seq_lens[b], generator=gen).tolist() if i != last]
        picks = [last, *others[: min(width - 2, len(others))]]
        sel[t, : len(picks)] = torch.tensor(picks, dtype=torch.int32)[
            torch.randperm(len(picks), generator=gen)
        ]
    return sel


def test_npu_sparse_ops_match_the_reference_in_bf16(fake_npu):
    gen, batch, keys, kv_cache, q, w, q_nope, q_pe = _npu_case(seed=7)
    ref, npu = ReferenceDeviceAdaptor(), A2A3DeviceAdaptor()
    tokens, topk, scale = batch.num_tokens, 8, 1 / math.sqrt(192)

    key_rows, slots = _all_tokens(gen, batch, keys)
    ref_cache = torch.zeros(14, 16, 128, dtype=torch.bfloat16)
    npu_cache = torch.zeros(14, 16, 128, dtype=torch.bfloat16)
    ref.indexer_cache_write(key_rows, ref_cache, slots)
    npu.indexer_cache_write(key_rows, npu_cache, slots)
    assert torch.equal(npu_cache, ref_cache) and int((ref_cache.abs().sum(-1) > 0).sum()) == sum(
        batch.seq_lens
    )

    expected_sel = ref.lightning_indexer(q, ref_cache, w, *batch.meta(), topk)
    selected = npu.lightning_indexer(q, npu_cache, w, *batch.meta(), topk)
    assert selected.dtype == torch.int32 and selected.shape == (tokens, topk)
    assert torch.equal(selected, expected_sel)
    assert bool((selected == -1).any())  # the full prefill's first rows see fewer than topk keys

    buffer = torch.full((tokens + 1, 2, 512), 3.0, dtype=torch.bfloat16)
    out = npu.sparse_flash_attention(q_nope, q_pe, kv_cache, selected, *batch.meta(), scale, output=buffer)
    expected = ref.sparse_flash_attention(q_nope, q_pe, kv_cache, expected_sel, *batch.meta(), scale)
    assert (
        out.dtype == torch.bfloat16 and out.shape == (tokens, 2, 512) and out.data_ptr() == buffer.data_ptr()
    )
    torch.testing.assert_close(out, expected, rtol=1e-2, atol=1e-2)
    assert bool((buffer[tokens:] == 3.0).all())

    # selections reaching past the causal bound: the kernel masks them as the reference ignores them
    mixed = _valid_first_selection(gen, batch, width=6)
    out = npu.sparse_flash_attention(q_nope, q_pe, kv_cache, mixed, *batch.meta(), scale)
    expected = ref.sparse_flash_attention(q_nope, q_pe, kv_cache, mixed, *batch.meta(), scale)
    torch.testing.assert_close(out, expected, rtol=1e-2, atol=1e-2)

    assert dict(npu.call_counts) == {
        "indexer_cache_write": 1,
        "lightning_indexer": 1,
        "sparse_flash_attention": 2,
    }
    assert fake_npu.calls == Counter(
        {"npu_scatter_nd_update_": 1, "npu_lightning_indexer": 1, "npu_sparse_flash_attention": 2}
    )


def _tiny_indexer_args(dtype: torch.dtype, heads: int = 64, dim: int = 128):
    """Two query tokens over two keys (one request) on a one-block PA cache."""
    gen = torch.Generator().manual_seed(8)
    q, w = _index_queries(gen, 2, heads, dim)
    cache = torch.zeros(1, 16, dim)
    cache[0, :2] = _index_keys(gen, 2, dim)
    table = torch.zeros(1, 1, dtype=torch.int32)
    return q.to(dtype), cache.to(dtype), w.to(dtype), table, torch.tensor([0, 2]), torch.tensor([2])


def _tiny_latent_args(dtype: torch.dtype, lora: int = 512, rope: int = 64):
    gen = torch.Generator().manual_seed(9)
    q_nope = torch.randn(2, 2, lora, generator=gen).to(dtype)
    q_pe = torch.randn(2, 2, rope, generator=gen).to(dtype)
    cache = torch.randn(1, 16, lora + rope, generator=gen).to(dtype)
    sel = torch.tensor([[0, -1], [1, 0]], dtype=torch.int32)
    return (
        q_nope,
        q_pe,
        cache,
        sel,
        torch.zeros(1, 1, dtype=torch.int32),
        torch.tensor([0, 2]),
        torch.tensor([2]),
    )


def test_npu_sparse_ops_refuse_what_the_kernels_do_not_take_by_name(fake_npu):
    npu = A2A3DeviceAdaptor()
    with pytest.raises(
        DeviceOpError,
        match=r"dtype=torch.float32 is not supported by npu_lightning_indexer; allowed: bfloat16, float16",
    ):
        npu.lightning_indexer(*_tiny_indexer_args(torch.float32), 8)
    allowed = r"allowed: 1\.\.2048, 3072, 4096, 5120, 6144, 7168, 8192"
    for topk in (3000, 0, 9000):
        with pytest.raises(
            DeviceOpError, match=rf"topk={topk} is not supported by npu_lightning_indexer; {allowed}"
        ):
            npu.lightning_indexer(*_tiny_indexer_args(torch.bfloat16), topk)
    with pytest.raises(
        DeviceOpError,
        match=r"dtype=torch.float32 is not supported by npu_sparse_flash_attention; allowed: bfloat16, float16",
    ):
        npu.sparse_flash_attention(*_tiny_latent_args(torch.float32), 1.0)
    assert not any(fake_npu.calls.values())  # refused before any kernel runs

    wide = npu.lightning_indexer(*_tiny_indexer_args(torch.float16), 4096)  # a documented large top-k
    assert wide.shape == (2, 4096) and fake_npu.kwargs["npu_lightning_indexer"]["sparse_count"] == 4096
    assert sorted(wide[1, :2].tolist()) == [0, 1] and wide[0, 0] == 0 and bool((wide[:, 2:] == -1).all())
    assert wide[0, 1] == -1  # the first query sees one key


def test_npu_sparse_attention_asks_for_the_mla_absorb_mode(fake_npu):
    A2A3DeviceAdaptor().sparse_flash_attention(*_tiny_latent_args(torch.bfloat16), 0.1)
    assert fake_npu.kwargs["npu_sparse_flash_attention"]["attention_mode"] == 2


def test_npu_lightning_indexer_takes_fp32_weights_as_the_runner_passes_them(fake_npu):
    q, cache, w, *meta = _tiny_indexer_args(torch.bfloat16)
    got = A2A3DeviceAdaptor().lightning_indexer(q, cache, w.float(), *meta, 2)
    assert torch.equal(got, ReferenceDeviceAdaptor().lightning_indexer(q, cache, w, *meta, 2))


@pytest.mark.parametrize("op", ["lightning_indexer", "sparse_flash_attention"])
def test_npu_sparse_ops_refuse_other_geometries_by_name(fake_npu, op):
    npu = A2A3DeviceAdaptor()
    with pytest.raises(DeviceOpError, match=r"is not supported by npu_\w+; allowed: (128|kv_lora_rank=512)"):
        if op == "lightning_indexer":
            npu.lightning_indexer(*_tiny_indexer_args(torch.bfloat16, heads=4, dim=8), 2)
        else:
            npu.sparse_flash_attention(*_tiny_latent_args(torch.bfloat16, lora=32, rope=16), 0.1)
