"""DeepSeek sparse attention (DSA / SFA, DeepSeek-V3.2) device ops: their declarations (the op contract).

DSA adds a *lightning indexer* to MLA: a small multi-head scorer whose keys live in their own paged cache
``[num_blocks, block_size, D]``. For each query token it scores every visible key and keeps the ``topk``
best positions; the MLA attention then attends only those positions of the latent cache. Three ops serve it:

- :meth:`SparseAttentionDeviceOps.indexer_cache_write`: scatter the indexer's key rows into their slots;
- :meth:`SparseAttentionDeviceOps.lightning_indexer`: ``score[t, s] = sum_h weights[t, h] * relu(q[t, h] . k[s])``
  over the visible (causal) keys, the top-k positions per query (what ``npu_lightning_indexer`` returns);
- :meth:`SparseAttentionDeviceOps.sparse_flash_attention`: the absorbed MLA attention restricted to each
  query's selected positions (what ``npu_sparse_flash_attention`` computes with ``query_rope``/``key_rope``).

The implementations (the plain-PyTorch reference and the torch_npu mapping) are mixins of the family
adaptors in ``vllm_ascend.kernels.device.sparse``, counted in ``adaptor.call_counts`` like the base ops.
"""

from __future__ import annotations

import abc
from typing import Any

import torch

from vllm_ascend.core.device.adaptor.base import count_overrides

#: The sparse-attention ops every adaptor mixing in :class:`SparseAttentionDeviceOps` implements.
SPARSE_OPS: tuple[str, ...] = ("indexer_cache_write", "lightning_indexer", "sparse_flash_attention")


class SparseAttentionDeviceOps(abc.ABC):
    """The sparse-attention op interface; subclasses' overrides are counted in ``call_counts``."""

    call_counts: Any
    _active_ops: set[str]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        count_overrides(cls, SPARSE_OPS)

    @abc.abstractmethod
    def indexer_cache_write(
        self, key: torch.Tensor, key_cache: torch.Tensor, slot_mapping: torch.Tensor
    ) -> None:
        """Write ``key [T, D]`` into ``key_cache [blocks, block_size, D]`` in place.

        Slot ``s`` is block ``s // block_size``, offset ``s % block_size``; only the first
        ``len(slot_mapping)`` tokens are written and slots ``< 0`` (padding) are skipped.
        """

    @abc.abstractmethod
    def lightning_indexer(
        self,
        query: torch.Tensor,
        key_cache: torch.Tensor,
        weights: torch.Tensor,
        block_table: torch.Tensor,
        query_start_loc: torch.Tensor,
        seq_lens: torch.Tensor,
        topk: int,
    ) -> torch.Tensor:
        """The top-``topk`` key positions per query token; returns ``[T, topk]`` int32.

        ``query [T, H, D]`` and ``weights [T, H]`` (the per-head weights, scales folded in); request ``b`` owns
        query rows ``query_start_loc[b]:query_start_loc[b+1]`` and its first ``seq_lens[b]`` keys in
        ``key_cache`` (through ``block_table[b]``). Query ``j`` of ``q_len`` sees keys
        ``0 .. seq_len - q_len + j``; ``score[s] = sum_h weights[h] * relu(q[h] . k[s])`` (fp32). Row ``t``
        holds the positions (within the request's sequence) of its ``min(topk, visible)`` highest scores, in
        descending score order (ties in unspecified order), then ``-1`` padding.
        """

    @abc.abstractmethod
    def sparse_flash_attention(
        self,
        q_nope: torch.Tensor,
        q_pe: torch.Tensor,
        kv_cache: torch.Tensor,
        topk_indices: torch.Tensor,
        block_table: torch.Tensor,
        query_start_loc: torch.Tensor,
        seq_lens: torch.Tensor,
        scale: float,
        *,
        output: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Absorbed MLA attention over each query's selected positions of the latent cache; ``[T, N, L]``.

        As :meth:`MLADeviceOps.mla_latent_attention` (``q_nope [T, N, L]`` in latent space, ``q_pe [T, N, R]``,
        key ``[c_kv | k_pe]``, value ``c_kv``, one latent head), but query ``t`` attends only the positions
        ``topk_indices[t] >= 0`` that are also causally visible to it; a row with none is zero. Rows hold their
        valid positions first and ``-1`` after (as :meth:`lightning_indexer` writes them; the NPU kernel
        requires it). Computed in
        fp32, returned in the query dtype; written into ``output[:T]`` when given.
        """
