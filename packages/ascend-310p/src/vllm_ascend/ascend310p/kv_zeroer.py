"""AscendKVBlockZeroer310: zero newly allocated KV cache blocks without Triton (310P has none).

The runner's zeroer collects the per-layer caches (deduplicated, block-major); this one precomputes,
once (:meth:`AscendKVBlockZeroer310.init_meta`), a ``[kernel blocks, rest]`` view of each cache and
the kernel-block offsets of each allocation-to-kernel block ratio, then zeroes the given blocks of every
cache with one ``index_fill_`` per cache.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from vllm_ascend.runner.kv_zeroer import AscendKVBlockZeroer


def _flat_blocks(cache: torch.Tensor) -> torch.Tensor:
    """``[blocks, -1]`` view of a block-major cache when its layout allows one, else the cache itself
    (``index_fill_`` on dim 0 handles any strides)."""
    try:
        return cache.view(cache.shape[0], -1)
    except RuntimeError:
        return cache


class AscendKVBlockZeroer310(AscendKVBlockZeroer):
    """Same constructor as the runner's :class:`AscendKVBlockZeroer` (vLLM's ``KVBlockZeroer``)."""

    def __init__(
        self,
        device: torch.device,
        attn_groups_iter: Iterable[Any],
        kernel_block_sizes: list[int],
        static_forward_context: dict[str, Any],
        num_blocks: int,
        runner_only_attn_layers: set[str] | None = None,
    ) -> None:
        super().__init__(
            device,
            attn_groups_iter,
            kernel_block_sizes,
            static_forward_context,
            num_blocks,
            runner_only_attn_layers,
        )
        self.init_meta()

    def init_meta(self) -> None:
        """Precompute the zeroing metadata: per ratio (kernel blocks per allocation block), the flat views
        of the caches with that ratio and the ``[ratio]`` kernel-block offsets on the device."""
        groups: dict[int, list[torch.Tensor]] = {}
        for cache, ratio in zip(self.caches, self.ratios, strict=True):
            groups.setdefault(ratio, []).append(_flat_blocks(cache))
        self.meta: list[tuple[int, list[torch.Tensor], torch.Tensor]] = [
            (ratio, views, torch.arange(ratio, dtype=torch.int64, device=self.device))
            for ratio, views in sorted(groups.items())
        ]

    def zero_block_ids(self, block_ids: list[int]) -> None:
        """Zero allocation blocks ``block_ids`` (each ``ratio`` kernel blocks) in every layer's cache."""
        if not block_ids or not self.meta:
            return
        if min(block_ids) < 0 or max(block_ids) >= self.num_blocks:
            raise ValueError(f"block ids must lie in [0, {self.num_blocks}); got {block_ids}")
        ids = torch.tensor(block_ids, dtype=torch.int64).to(self.device)
        for ratio, views, offsets in self.meta:
            kernel_ids = (ids[:, None] * ratio + offsets[None, :]).reshape(-1)
            for view in views:
                view.index_fill_(0, kernel_ids, 0)
