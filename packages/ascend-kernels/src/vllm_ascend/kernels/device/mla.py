"""The MLA device ops' implementations: the plain-PyTorch reference (the executable spec, fp32 accumulation)
and the torch_npu mapping, mixins of the family adaptors (before ``BaseDeviceAdaptor`` in the bases). The
declarations and the latent-cache layout are core's (``vllm_ascend.core.device.adaptor.mla``).
"""

from __future__ import annotations

from typing import Any

import torch

from vllm_ascend.core.sdk import DeviceOpError, MLADeviceOps, check_latent_cache, latent_cache_parts

#: The latent geometry ``npu_fused_infer_attention_score`` takes in its MLA mode (query/key D, rope D).
NPU_MLA_KV_LORA_RANK = 512
NPU_MLA_ROPE_DIM = 64
#: Size of the compressed causal mask ``npu_fused_infer_attention_score`` takes with ``sparse_mode=3``.
NPU_CAUSAL_MASK_SIZE = 2048


def _require(cond: bool, message: str) -> None:
    if not cond:
        raise DeviceOpError(message)


def paged_rows(
    cache: torch.Tensor, block_table_row: torch.Tensor, seq_len: int, what: str = "seq_len"
) -> torch.Tensor:
    """The first ``seq_len`` rows ``[seq_len, *row]`` of one request's paged cache ``[num_blocks, block_size,
    *row]`` through its block table (``what`` names the length in errors)."""
    block_size = cache.shape[1]
    num_blocks = -(-seq_len // block_size)
    _require(
        num_blocks <= block_table_row.shape[0],
        f"{what}={seq_len} needs {num_blocks} blocks of {block_size} but block_table has "
        f"{block_table_row.shape[0]} columns",
    )
    return cache[block_table_row[:num_blocks].long()].flatten(0, 1)[:seq_len]


def latent_rows(
    kv_cache: torch.Tensor,
    kv_lora_rank: int,
    block_table_row: torch.Tensor,
    seq_len: int,
    what: str = "seq_len",
) -> torch.Tensor:
    """One request's first ``seq_len`` latent rows ``[seq_len, L + R]`` (``[c_kv | k_pe]``)."""
    return torch.cat(
        [
            paged_rows(part, block_table_row, seq_len, what)
            for part in latent_cache_parts(kv_cache, kv_lora_rank)
        ],
        dim=-1,
    )


def _lengths(query_start_loc: torch.Tensor, seq_lens: torch.Tensor) -> tuple[list[int], list[int]]:
    starts = [int(v) for v in query_start_loc.tolist()]
    lens = [int(v) for v in seq_lens.tolist()]
    _require(
        len(starts) == len(lens) + 1,
        f"query_start_loc has {len(starts)} entries, expected len(seq_lens) + 1 = {len(lens) + 1}",
    )
    for b, (start, end, seq_len) in enumerate(zip(starts, starts[1:], lens, strict=False)):
        _require(
            0 <= end - start <= seq_len,
            f"request {b}: query length {end - start} must be within [0, seq_len={seq_len}]",
        )
    return starts, lens


def _causal_scores_mask(q_len: int, kv_len: int, device: torch.device) -> torch.Tensor:
    """``[q_len, kv_len]``: query ``j`` sees keys ``0 .. kv_len - q_len + j`` (bottom-right aligned)."""
    rows = torch.arange(q_len, device=device).unsqueeze(1) + (kv_len - q_len)
    return torch.arange(kv_len, device=device).unsqueeze(0) <= rows


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool) -> torch.Tensor:
    """``q [Q, N, D]``, ``k [S, N|1, D]``, ``v [S, N|1, Dv]`` -> ``[Q, N, Dv]`` in fp32 (full softmax)."""
    scores = torch.einsum("qnd,snd->nqs", q.float(), k.float().expand(-1, q.shape[1], -1)) * scale
    if causal:
        keep = _causal_scores_mask(q.shape[0], k.shape[0], q.device)
        scores = scores.masked_fill(~keep, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.einsum("nqs,snd->qnd", probs, v.float().expand(-1, q.shape[1], -1))


class MLAReferenceOps(MLADeviceOps):
    """The MLA ops in plain PyTorch: the semantics the NPU mapping is held to."""

    def mla_cache_write(self, kv_c, k_pe, kv_cache, slot_mapping):
        _require(kv_c.dim() == 2 and k_pe.dim() == 2, "kv_c must be [T, L] and k_pe [T, R]")
        check_latent_cache(kv_cache, kv_c.shape[1])
        _require(
            kv_c.shape[1] + k_pe.shape[1] == kv_cache.shape[2],
            f"kv_c ({kv_c.shape[1]}) + k_pe ({k_pe.shape[1]}) columns != cache row {kv_cache.shape[2]}",
        )
        _require(slot_mapping.dim() == 1, f"slot_mapping must be 1-D, got shape {tuple(slot_mapping.shape)}")
        n = slot_mapping.shape[0]
        _require(n <= kv_c.shape[0] and n <= k_pe.shape[0], f"{n} slots but {kv_c.shape[0]} tokens")
        slots = slot_mapping.long()
        keep = slots >= 0
        slots = slots[keep]
        if slots.numel() == 0:
            return
        num_blocks, block_size = kv_cache.shape[:2]
        _require(
            int(slots.max()) < num_blocks * block_size,
            f"slot {int(slots.max())} is out of range for a cache of {num_blocks} blocks x {block_size}",
        )
        c_cache, pe_cache = latent_cache_parts(kv_cache, kv_c.shape[1])
        c_cache[slots // block_size, slots % block_size] = kv_c[:n][keep].to(kv_cache.dtype)
        pe_cache[slots // block_size, slots % block_size] = k_pe[:n][keep].to(kv_cache.dtype)

    def mla_latent_attention(
        self,
        q_nope,
        q_pe,
        kv_cache,
        block_table,
        query_start_loc,
        seq_lens,
        scale,
        *,
        causal=True,
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
        starts, lens = _lengths(query_start_loc, seq_lens)
        num_tokens, num_heads = q_nope.shape[:2]
        if output is None:
            output = q_nope.new_zeros(num_tokens, num_heads, kv_lora_rank)
        _require(
            output.shape[0] >= num_tokens and tuple(output.shape[1:]) == (num_heads, kv_lora_rank),
            f"output must be [>= {num_tokens}, {num_heads}, {kv_lora_rank}], got {tuple(output.shape)}",
        )
        query = torch.cat([q_nope, q_pe], dim=-1)
        for b, seq_len in enumerate(lens):
            start, end = starts[b], starts[b + 1]
            if end == start:
                continue
            rows = latent_rows(kv_cache, kv_lora_rank, block_table[b], seq_len, f"seq_lens[{b}]").unsqueeze(1)
            out = _attend(query[start:end], rows, rows[..., :kv_lora_rank], scale, causal)
            output[start:end] = out.to(output.dtype)
        return output[:num_tokens]

    def mla_prefill_attention(self, query, key, value, query_start_loc, kv_start_loc, scale, *, output=None):
        _require(
            query.dim() == 3 and key.dim() == 3 and value.dim() == 3,
            "query [T, N, D], key [S, N, D] and value [S, N, Dv] must be 3-D",
        )
        _require(
            key.shape[:2] == value.shape[:2] and key.shape[1:] == query.shape[1:],
            f"key {tuple(key.shape)} / value {tuple(value.shape)} do not match query {tuple(query.shape)}",
        )
        q_starts = [int(v) for v in query_start_loc.tolist()]
        kv_starts = [int(v) for v in kv_start_loc.tolist()]
        _require(
            len(q_starts) == len(kv_starts),
            f"query_start_loc ({len(q_starts)}) and kv_start_loc ({len(kv_starts)}) must have one entry per request + 1",
        )
        num_tokens, num_heads = query.shape[:2]
        if output is None:
            output = query.new_zeros(num_tokens, num_heads, value.shape[2])
        _require(
            output.shape[0] >= num_tokens and tuple(output.shape[1:]) == (num_heads, value.shape[2]),
            f"output must be [>= {num_tokens}, {num_heads}, {value.shape[2]}], got {tuple(output.shape)}",
        )
        for b in range(len(q_starts) - 1):
            qs, qe, ks, ke = q_starts[b], q_starts[b + 1], kv_starts[b], kv_starts[b + 1]
            _require(
                0 <= qe - qs <= ke - ks,
                f"request {b}: query length {qe - qs} must be within [0, kv length {ke - ks}]",
            )
            if qe > qs:
                out = _attend(query[qs:qe], key[ks:ke], value[ks:ke], scale, causal=True)
                output[qs:qe] = out.to(output.dtype)
        return output[:num_tokens]


def torch_npu_module() -> Any:
    """``import torch_npu`` with a clear error where it is missing (npu.py imports this module, so it
    cannot import npu.py's helper)."""
    try:
        import torch_npu
    except ImportError as exc:
        raise DeviceOpError(
            f"the NPU MLA ops need torch_npu ({exc}); install vllm-ascend[npu] on an Ascend host, "
            "or set VLLM_ASCEND_DEVICE=reference to run on the CPU"
        ) from exc
    return torch_npu


class MLANPUOps(MLADeviceOps):
    """The MLA ops on torch_npu (Atlas A2/A3): ``npu_scatter_nd_update_`` writes the latent rows and
    ``npu_fused_infer_attention_score`` attends (its MLA mode with ``query_rope``/``key_rope`` for the
    latent decode, its TND mode for the decompressed prefill)."""

    def _npu_causal_mask(self, device: torch.device) -> torch.Tensor:
        """The compressed 2048 x 2048 upper-triangular mask the ops take with ``sparse_mode=3``."""
        masks: dict[torch.device, torch.Tensor] = self.__dict__.setdefault("_mla_causal_masks", {})
        mask = masks.get(device)
        if mask is None:
            ones = torch.ones(NPU_CAUSAL_MASK_SIZE, NPU_CAUSAL_MASK_SIZE, dtype=torch.int8, device=device)
            mask = masks[device] = torch.triu(ones, diagonal=1)
        return mask

    def mla_cache_write(self, kv_c, k_pe, kv_cache, slot_mapping):
        n = slot_mapping.shape[0]
        keep = slot_mapping >= 0
        slots = slot_mapping[keep].view(-1, 1).long()
        c_cache, pe_cache = latent_cache_parts(kv_cache, kv_c.shape[1])
        npu = torch_npu_module()
        npu.npu_scatter_nd_update_(
            c_cache.view(-1, c_cache.shape[-1]), slots, kv_c[:n][keep].to(kv_cache.dtype)
        )
        npu.npu_scatter_nd_update_(
            pe_cache.view(-1, pe_cache.shape[-1]), slots, k_pe[:n][keep].to(kv_cache.dtype)
        )

    def mla_latent_attention(
        self,
        q_nope,
        q_pe,
        kv_cache,
        block_table,
        query_start_loc,
        seq_lens,
        scale,
        *,
        causal=True,
        output=None,
    ):
        kv_lora_rank, rope_dim = q_nope.shape[2], q_pe.shape[2]
        if (kv_lora_rank, rope_dim) != (NPU_MLA_KV_LORA_RANK, NPU_MLA_ROPE_DIM):
            raise DeviceOpError(
                f"kv_lora_rank={kv_lora_rank}, rope_dim={rope_dim} is not supported by the NPU latent "
                f"attention; allowed: kv_lora_rank={NPU_MLA_KV_LORA_RANK}, rope_dim={NPU_MLA_ROPE_DIM}"
            )
        block_size = kv_cache.shape[1]
        ends = [int(v) for v in query_start_loc[1:].tolist()]
        used = ends[-1] if ends else 0
        c_kv, k_pe = latent_cache_parts(kv_cache, kv_lora_rank)
        out, _ = torch_npu_module().npu_fused_infer_attention_score(
            q_nope[:used].contiguous(),
            c_kv,
            c_kv,
            query_rope=q_pe[:used].contiguous(),
            key_rope=k_pe,
            atten_mask=self._npu_causal_mask(q_nope.device) if causal else None,
            actual_seq_lengths=ends,
            actual_seq_lengths_kv=[int(v) for v in seq_lens.tolist()],
            block_table=block_table,
            num_heads=q_nope.shape[1],
            num_key_value_heads=1,
            scale=scale,
            input_layout="TND",
            sparse_mode=3 if causal else 0,
            block_size=block_size,
        )
        if output is None:
            output = q_nope.new_zeros(q_nope.shape[0], q_nope.shape[1], kv_lora_rank)
        output[:used] = out.view(used, q_nope.shape[1], kv_lora_rank)
        return output[: q_nope.shape[0]]

    def mla_prefill_attention(self, query, key, value, query_start_loc, kv_start_loc, scale, *, output=None):
        q_ends = [int(v) for v in query_start_loc[1:].tolist()]
        kv_ends = [int(v) for v in kv_start_loc[1:].tolist()]
        used = q_ends[-1] if q_ends else 0
        out, _ = torch_npu_module().npu_fused_infer_attention_score(
            query[:used].contiguous(),
            key.contiguous(),
            value.contiguous(),
            atten_mask=self._npu_causal_mask(query.device),
            actual_seq_lengths=q_ends,
            actual_seq_lengths_kv=kv_ends,
            num_heads=query.shape[1],
            num_key_value_heads=key.shape[1],
            scale=scale,
            input_layout="TND",
            sparse_mode=3,
        )
        if output is None:
            output = query.new_zeros(query.shape[0], query.shape[1], value.shape[2])
        output[:used] = out.view(used, query.shape[1], value.shape[2])
        return output[: query.shape[0]]
