"""AscendKVBlockZeroer: zero newly allocated KV cache blocks of every attention layer in one call.

vLLM asks for this when a block may be read before it is fully written (Mamba state, mixed
precision pools). The per-layer caches are collected once (deduplicated by storage address,
each viewed block-major with the rest of a block contiguous) and every call zeroes the given
blocks of all of them through :func:`vllm_ascend.kernels.zero_kv_blocks` — one Triton launch
where Triton runs, ``index_fill_`` otherwise.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from vllm.v1.kv_cache_interface import AttentionSpec

import vllm_ascend.kernels as kernels


def block_major_view(kv: torch.Tensor) -> torch.Tensor:
    """``kv`` with dim 0 (blocks) first and the other dims in memory order (outermost first)."""
    inner = sorted(range(1, kv.dim()), key=lambda d: -kv.stride(d))
    return kv.permute(0, *inner)


class AscendKVBlockZeroer:
    """Same constructor as vLLM's ``KVBlockZeroer``; :meth:`zero_block_ids` zeroes allocation blocks."""

    def __init__(
        self,
        device: torch.device,
        attn_groups_iter: Iterable[Any],
        kernel_block_sizes: list[int],
        static_forward_context: dict[str, Any],
        num_blocks: int,
        runner_only_attn_layers: set[str] | None = None,
    ) -> None:
        self.device = device
        self.num_blocks = num_blocks
        skip = runner_only_attn_layers or set()
        seen: set[int] = set()
        self.caches: list[torch.Tensor] = []
        #: Kernel blocks per allocation block, per entry of ``caches``.
        self.ratios: list[int] = []
        for group in attn_groups_iter:
            if not isinstance(group.kv_cache_spec, AttentionSpec):
                continue
            if group.kv_cache_group_id >= len(kernel_block_sizes):
                continue
            for layer_name in group.layer_names:
                if layer_name in skip:
                    continue
                layer = static_forward_context[layer_name]
                kv = layer.kv_cache
                if not isinstance(kv, torch.Tensor) or kv.device.type != device.type:
                    continue
                if getattr(group, "kernel_block_stride", 0):
                    kv = group.map_kv_cache_to_manager_blocks(kv, num_blocks)
                if kv.data_ptr() in seen:
                    continue
                seen.add(kv.data_ptr())
                # A layer whose blocks live in several regions of its allocation (the MLA latent cache's
                # c_kv and k_pe regions) names them; each region is block-major.
                split = getattr(getattr(layer, "impl", None), "cache_block_views", None)
                for part in split(kv) if split is not None else [kv]:
                    if part.shape[0] % num_blocks:
                        raise ValueError(
                            f"{layer_name}: {part.shape[0]} cache blocks is not a multiple of "
                            f"{num_blocks} allocation blocks"
                        )
                    self.caches.append(block_major_view(part))
                    self.ratios.append(part.shape[0] // num_blocks)

    def zero_block_ids(self, block_ids: list[int]) -> None:
        """Zero allocation blocks ``block_ids`` (each possibly several kernel blocks) in every layer."""
        if not block_ids or not self.caches:
            return
        ids = torch.tensor(block_ids, dtype=torch.int64)
        if min(block_ids) < 0 or max(block_ids) >= self.num_blocks:
            raise ValueError(f"block ids must lie in [0, {self.num_blocks}); got {block_ids}")
        for ratio in sorted(set(self.ratios)):
            caches = [c for c, r in zip(self.caches, self.ratios, strict=False) if r == ratio]
            kernel_ids = (ids[:, None] * ratio + torch.arange(ratio)[None, :]).reshape(-1)
            kernels.zero_kv_blocks(caches, kernel_ids.to(self.device), 0)

    def warmup(self, num_kv_blocks: int) -> None:
        """Run the zeroing path once (compiles the Triton kernel where one is used)."""
        if num_kv_blocks > 0:
            self.zero_block_ids([0])
