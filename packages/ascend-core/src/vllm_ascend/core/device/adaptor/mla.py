"""The MLA (multi-head latent attention, DeepSeek-V2/V3) device ops: their declarations (the op contract).

An MLA layer caches one latent row per token: ``c_kv`` (kv_lora_rank L) and ``k_pe`` (rope dim R), in the
layer's paged allocation ``[num_blocks, block_size, L + R]`` laid out as two contiguous regions (see
:func:`latent_cache_parts`): all blocks' ``c_kv`` rows ``[num_blocks, block_size, L]``, then all blocks' ``k_pe``
rows ``[num_blocks, block_size, R]`` — the separate paged caches the NPU kernels take, without a copy per
call. Three ops serve it:

- :meth:`MLADeviceOps.mla_cache_write`: scatter ``[c_kv | k_pe]`` rows into their slots;
- :meth:`MLADeviceOps.mla_latent_attention`: the absorbed (decode) attention on the latent cache, one KV
  head: key ``[c_kv | k_pe]``, value ``c_kv`` (what ``npu_fused_infer_attention_score`` computes with
  ``query_rope``/``key_rope``);
- :meth:`MLADeviceOps.mla_prefill_attention`: attention over decompressed per-head K/V packed per request
  (ragged), causal aligned to the end of each request's keys (``sparse_mode=3``).

The implementations (the plain-PyTorch reference and the torch_npu mapping) are mixins of the family
adaptors in ``vllm_ascend.kernels.device.mla``; each op call is counted in ``adaptor.call_counts`` like the
base ops.
"""

from __future__ import annotations

import abc
from typing import Any

import torch

from vllm_ascend.core.device.adaptor.base import DeviceOpError, count_overrides

#: The MLA ops every adaptor mixing in :class:`MLADeviceOps` implements (counted like ``OPS``).
MLA_OPS: tuple[str, ...] = ("mla_cache_write", "mla_latent_attention", "mla_prefill_attention")


def _require(cond: bool, message: str) -> None:
    if not cond:
        raise DeviceOpError(message)


def check_latent_cache(kv_cache: torch.Tensor, kv_lora_rank: int) -> None:
    _require(
        kv_cache.dim() == 3,
        f"kv_cache must be [num_blocks, block_size, kv_lora_rank + rope_dim], got shape {tuple(kv_cache.shape)}",
    )
    _require(
        0 < kv_lora_rank < kv_cache.shape[2],
        f"kv_lora_rank={kv_lora_rank} must be within (0, {kv_cache.shape[2]}) for a cache row of {kv_cache.shape[2]}",
    )


def latent_cache_parts(kv_cache: torch.Tensor, kv_lora_rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``c_kv [num_blocks, block_size, L]`` and ``k_pe [num_blocks, block_size, R]`` caches inside a layer's
    contiguous latent allocation ``[num_blocks, block_size, L + R]``: its first ``num_blocks * block_size * L``
    elements and the rest, each a contiguous view (writes through either land in the allocation)."""
    check_latent_cache(kv_cache, kv_lora_rank)
    _require(
        kv_cache.is_contiguous(),
        f"the latent cache must be one contiguous allocation, got strides {tuple(kv_cache.stride())}",
    )
    num_blocks, block_size, width = kv_cache.shape
    flat = kv_cache.view(-1)
    split = num_blocks * block_size * kv_lora_rank
    return (
        flat[:split].view(num_blocks, block_size, kv_lora_rank),
        flat[split:].view(num_blocks, block_size, width - kv_lora_rank),
    )


class MLADeviceOps(abc.ABC):
    """The MLA op interface; subclasses' overrides are counted in ``call_counts`` like ``OPS``."""

    call_counts: Any
    _active_ops: set[str]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        count_overrides(cls, MLA_OPS)

    @abc.abstractmethod
    def mla_cache_write(
        self, kv_c: torch.Tensor, k_pe: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor
    ) -> None:
        """Write ``[kv_c [T, L] | k_pe [T, R]]`` into ``kv_cache [blocks, block_size, L + R]`` in place.

        Slot ``s`` is block ``s // block_size``, offset ``s % block_size``; only the first
        ``len(slot_mapping)`` tokens are written and slots ``< 0`` (padding) are skipped.
        """

    @abc.abstractmethod
    def mla_latent_attention(
        self,
        q_nope: torch.Tensor,
        q_pe: torch.Tensor,
        kv_cache: torch.Tensor,
        block_table: torch.Tensor,
        query_start_loc: torch.Tensor,
        seq_lens: torch.Tensor,
        scale: float,
        *,
        causal: bool = True,
        output: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Absorbed MLA attention on the paged latent cache; returns ``[T, N, L]``.

        ``q_nope [T, N, L]`` is the query already in latent space (``q_nope @ W_UK``), ``q_pe [T, N, R]`` its
        rotary part. Request ``b`` owns query rows ``query_start_loc[b]:query_start_loc[b+1]`` and its first
        ``seq_lens[b]`` cached tokens (through ``block_table[b]``). Every head attends the one latent head:
        ``softmax(scale * (q_nope . c_kv + q_pe . k_pe)) @ c_kv``, causal aligned to the end of the keys
        (query ``j`` of ``q_len`` sees keys ``0 .. seq_len - q_len + j``). Computed in fp32, returned in the
        query dtype; written into ``output[:T]`` when given.
        """

    @abc.abstractmethod
    def mla_prefill_attention(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        query_start_loc: torch.Tensor,
        kv_start_loc: torch.Tensor,
        scale: float,
        *,
        output: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Causal attention over packed (ragged) decompressed K/V; returns ``[T, N, Dv]``.

        Request ``b`` owns query rows ``query_start_loc[b]:query_start_loc[b+1]`` of ``query [T, N, D]`` and
        key/value rows ``kv_start_loc[b]:kv_start_loc[b+1]`` of ``key [S, N, D]`` / ``value [S, N, Dv]``
        (its context followed by its new tokens); query ``j`` of ``q_len`` sees keys ``0 .. kv_len - q_len + j``.
        Computed in fp32, returned in the query dtype; written into ``output[:T]`` when given.
        """
