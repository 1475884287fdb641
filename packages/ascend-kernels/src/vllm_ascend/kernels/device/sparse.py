"""DeepSeek sparse attention's device ops implemented: the plain-PyTorch reference (the executable spec, fp32
accumulation) and the torch_npu mapping, mixins of the family adaptors. The declarations are core's
(``vllm_ascend.core.device.adaptor.sparse``).
"""

from __future__ import annotations

import torch

from vllm_ascend.core.sdk import (
    DeviceOpError,
    SparseAttentionDeviceOps,
    check_latent_cache,
    latent_cache_parts,
)
from vllm_ascend.kernels.device.mla import (
    NPU_MLA_KV_LORA_RANK,
    NPU_MLA_ROPE_DIM,
    _lengths,
    _require,
    latent_rows,
    paged_rows,
    torch_npu_module,
)

#: ``npu_lightning_indexer``'s documented ``sparse_count`` values: 1..2048 and these.
NPU_INDEXER_LARGE_TOPK = (3072, 4096, 5120, 6144, 7168, 8192)
#: The index head dim ``npu_lightning_indexer`` takes.
NPU_INDEXER_HEAD_DIM = 128
#: The dtypes the NPU sparse-attention ops take.
NPU_SPARSE_DTYPES = (torch.bfloat16, torch.float16)


def _visible(q_len: int, seq_len: int, device: torch.device) -> torch.Tensor:
    """``[q_len, seq_len]``: query ``j`` sees keys ``0 .. seq_len - q_len + j`` (causal, right-aligned)."""
    last = torch.arange(q_len, device=device).unsqueeze(1) + (seq_len - q_len)
    return torch.arange(seq_len, device=device).unsqueeze(0) <= last


class SparseAttentionReferenceOps(SparseAttentionDeviceOps):
    """The sparse-attention ops in plain PyTorch: the semantics the NPU mapping is held to."""

    def indexer_cache_write(self, key, key_cache, slot_mapping):
        _require(key.dim() == 2, f"key must be [T, D], got shape {tuple(key.shape)}")
        _require(
            key_cache.dim() == 3 and key_cache.shape[2] == key.shape[1],
            f"key_cache must be [num_blocks, block_size, {key.shape[1]}], got shape {tuple(key_cache.shape)}",
        )
        _require(slot_mapping.dim() == 1, f"slot_mapping must be 1-D, got shape {tuple(slot_mapping.shape)}")
        n = slot_mapping.shape[0]
        _require(n <= key.shape[0], f"{n} slots but {key.shape[0]} tokens")
        slots = slot_mapping.long()
        keep = slots >= 0
        slots = slots[keep]
        if slots.numel() == 0:
            return
        num_blocks, block_size = key_cache.shape[:2]
        _require(
            int(slots.max()) < num_blocks * block_size,
            f"slot {int(slots.max())} is out of range for a cache of {num_blocks} blocks x {block_size}",
        )
        key_cache[slots // block_size, slots % block_size] = key[:n][keep].to(key_cache.dtype)

    def lightning_indexer(self, query, key_cache, weights, block_table, query_start_loc, seq_lens, topk):
        _require(query.dim() == 3, f"query must be [T, H, D], got shape {tuple(query.shape)}")
        _require(
            tuple(weights.shape) == tuple(query.shape[:2]),
            f"weights must be [T, H] = {tuple(query.shape[:2])}, got {tuple(weights.shape)}",
        )
        _require(
            key_cache.dim() == 3 and key_cache.shape[2] == query.shape[2],
            f"key_cache must be [num_blocks, block_size, {query.shape[2]}], got shape {tuple(key_cache.shape)}",
        )
        _require(topk >= 1, f"topk must be >= 1, got {topk}")
        starts, lens = _lengths(query_start_loc, seq_lens)
        out = torch.full((query.shape[0], topk), -1, dtype=torch.int32, device=query.device)
        for b, seq_len in enumerate(lens):
            start, end = starts[b], starts[b + 1]
            if end == start:
                continue
            keys = paged_rows(key_cache, block_table[b], seq_len, f"request {b}: seq_len").float()
            per_head = torch.relu(torch.einsum("qhd,sd->qhs", query[start:end].float(), keys))
            scores = torch.einsum("qh,qhs->qs", weights[start:end].float(), per_head)
            scores = scores.masked_fill(~_visible(end - start, seq_len, query.device), float("-inf"))
            values, positions = scores.topk(min(topk, seq_len), dim=-1)
            positions = positions.masked_fill(values == float("-inf"), -1)
            out[start:end, : positions.shape[1]] = positions.to(torch.int32)
        return out

    def sparse_flash_attention(
        self,
        q_nope,
        q_pe,
        kv_cache,
        topk_indices,
        block_table,
        query_start_loc,
        seq_lens,
        scale,
        *,
        output=None,
    ):
        _require(
            q_nope.dim() == 3 and q_pe.dim() == 3 and q_nope.shape[:2] == q_pe.shape[:2],
            f"q_nope [T, N, L] and q_pe [T, N, R] must agree, got {tuple(q_nope.shape)} and {tuple(q_pe.shape)}",
        )
        kv_lora_rank = q_nope.shape[2]
        check_latent_cache(kv_cache, kv_lora_rank)
        _require(
            kv_lora_rank + q_pe.shape[2] == kv_cache.shape[2],
            f"q_nope ({kv_lora_rank}) + q_pe ({q_pe.shape[2]}) dims != cache row {kv_cache.shape[2]}",
        )
        num_tokens, num_heads = q_nope.shape[:2]
        _require(
            topk_indices.dim() == 2 and topk_indices.shape[0] >= num_tokens,
            f"topk_indices must be [>= {num_tokens}, topk], got {tuple(topk_indices.shape)}",
        )
        starts, lens = _lengths(query_start_loc, seq_lens)
        if output is None:
            output = q_nope.new_zeros(num_tokens, num_heads, kv_lora_rank)
        _require(
            output.shape[0] >= num_tokens and tuple(output.shape[1:]) == (num_heads, kv_lora_rank),
            f"output must be [>= {num_tokens}, {num_heads}, {kv_lora_rank}], got {tuple(output.shape)}",
        )
        query = torch.cat([q_nope, q_pe], dim=-1).float()
        for b, seq_len in enumerate(lens):
            start, end = starts[b], starts[b + 1]
            if end == start:
                continue
            rows = latent_rows(
                kv_cache, kv_lora_rank, block_table[b], seq_len, f"request {b}: seq_len"
            ).float()
            selected = topk_indices[start:end].long()
            _require(
                int(selected.max()) < seq_len,
                f"request {b}: topk index {int(selected.max())} is beyond its {seq_len} keys",
            )
            last = torch.arange(end - start, device=rows.device).unsqueeze(1) + (seq_len - (end - start))
            keep = (selected >= 0) & (selected <= last)
            keys = rows[selected.clamp(min=0)]  # [q, K, L + R]
            scores = torch.einsum("qnd,qkd->qnk", query[start:end], keys) * scale
            scores = scores.masked_fill(~keep.unsqueeze(1), float("-inf"))
            probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
            out = torch.einsum("qnk,qkl->qnl", probs, keys[..., :kv_lora_rank])
            output[start:end] = out.to(output.dtype)
        return output[:num_tokens]


def _require_npu_dtype(op: str, *tensors: torch.Tensor) -> None:
    for tensor in tensors:
        if tensor.dtype not in NPU_SPARSE_DTYPES:
            raise DeviceOpError(
                f"dtype={tensor.dtype} is not supported by {op}; allowed: "
                + ", ".join(str(d).removeprefix("torch.") for d in NPU_SPARSE_DTYPES)
            )


class SparseAttentionNPUOps(SparseAttentionDeviceOps):
    """The sparse-attention ops on torch_npu (Atlas A2/A3): ``npu_scatter_nd_update_`` writes indexer keys,
    ``npu_lightning_indexer`` selects (TND query, ``PA_BSND`` paged keys, ``sparse_mode=3``) and
    ``npu_sparse_flash_attention`` attends the latent cache at the selected positions (one per block:
    ``sparse_block_size=1``)."""

    def indexer_cache_write(self, key, key_cache, slot_mapping):
        n = slot_mapping.shape[0]
        keep = slot_mapping >= 0
        torch_npu_module().npu_scatter_nd_update_(
            key_cache.view(-1, key_cache.shape[-1]),
            slot_mapping[keep].view(-1, 1).long(),
            key[:n][keep].to(key_cache.dtype),
        )

    def lightning_indexer(self, query, key_cache, weights, block_table, query_start_loc, seq_lens, topk):
        if not (1 <= topk <= 2048 or topk in NPU_INDEXER_LARGE_TOPK):
            raise DeviceOpError(
                f"topk={topk} is not supported by npu_lightning_indexer; allowed: 1..2048, "
                + ", ".join(str(v) for v in NPU_INDEXER_LARGE_TOPK)
            )
        _require_npu_dtype("npu_lightning_indexer", query, key_cache)  # weights are cast to the query dtype
        if query.shape[-1] != NPU_INDEXER_HEAD_DIM:
            raise DeviceOpError(
                f"head_dim={query.shape[-1]} is not supported by npu_lightning_indexer; allowed: {NPU_INDEXER_HEAD_DIM}"
            )
        out = torch.full((query.shape[0], topk), -1, dtype=torch.int32, device=query.device)
        used = int(query_start_loc[-1])
        if used == 0:
            return out
        ends = query_start_loc[1:].to(device=query.device, dtype=torch.int32)
        indices, _ = torch_npu_module().npu_lightning_indexer(
            query[:used].contiguous(),
            key_cache.unsqueeze(2),
            weights[:used].to(query.dtype).contiguous(),
            actual_seq_lengths_query=ends,
            actual_seq_lengths_key=seq_lens.to(device=query.device, dtype=torch.int32),
            block_table=block_table.to(torch.int32),
            layout_query="TND",
            layout_key="PA_BSND",
            sparse_count=topk,
            sparse_mode=3,
        )
        out[:used] = indices.view(used, topk)
        return out

    def sparse_flash_attention(
        self,
        q_nope,
        q_pe,
        kv_cache,
        topk_indices,
        block_table,
        query_start_loc,
        seq_lens,
        scale,
        *,
        output=None,
    ):
        _require_npu_dtype("npu_sparse_flash_attention", q_nope, q_pe, kv_cache)
        kv_lora_rank = q_nope.shape[2]
        if (kv_lora_rank, q_pe.shape[2]) != (NPU_MLA_KV_LORA_RANK, NPU_MLA_ROPE_DIM):
            raise DeviceOpError(
                f"kv_lora_rank={kv_lora_rank}, rope_dim={q_pe.shape[2]} is not supported by "
                f"npu_sparse_flash_attention; allowed: kv_lora_rank={NPU_MLA_KV_LORA_RANK}, "
                f"rope_dim={NPU_MLA_ROPE_DIM}"
            )
        if output is None:
            output = q_nope.new_zeros(q_nope.shape[0], q_nope.shape[1], kv_lora_rank)
        used = int(query_start_loc[-1])
        if used == 0:
            return output[: q_nope.shape[0]]
        c_kv, k_pe = (part.unsqueeze(2) for part in latent_cache_parts(kv_cache, kv_lora_rank))
        out, _, _ = torch_npu_module().npu_sparse_flash_attention(
            q_nope[:used].contiguous(),
            c_kv,
            c_kv,
            topk_indices[:used].unsqueeze(1).to(torch.int32).contiguous(),
            scale,
            block_table=block_table.to(torch.int32),
            actual_seq_lengths_query=query_start_loc[1:].to(device=q_nope.device, dtype=torch.int32),
            actual_seq_lengths_kv=seq_lens.to(device=q_nope.device, dtype=torch.int32),
            query_rope=q_pe[:used].contiguous(),
            key_rope=k_pe,
            sparse_block_size=1,
            layout_query="TND",
            layout_kv="PA_BSND",
            sparse_mode=3,
            attention_mode=2,  # MLA-absorb: the kernel's only mode with query_rope/key_rope
        )
        output[:used] = out.view(used, q_nope.shape[1], kv_lora_rank)
        return output[: q_nope.shape[0]]
