"""Attention masks of the 310P attention paths, additive and float16-safe.

Every mask here is *additive*: ``0`` where a query attends a key, :data:`MASK_VALUE` where it does not,
added to the scaled scores before the softmax (``softmax(scale * QK^T + mask) V``, the formula of
``npu_prompt_flash_attention``'s docs).

:data:`MASK_VALUE` is ``-10000``, not ``torch.finfo(float16).min``: it is exact in float16, adding it to
any float16 score of magnitude below 55504 stays finite (``finfo.min`` plus a negative score overflows
to ``-inf``, and a row of ``-inf`` softmaxes to NaN in float16 kernels), and ``exp(-10000 + gap)``
is exactly 0 in float16 and float32 for any realistic score gap, so it masks as a boolean mask does.

Three forms:

- causal ``[S, S]`` (prefill without context): row ``i`` sees keys ``0..i``;
- splitfuse, normal ``[T, max_seq_len]`` (chunked prefill / mixed batches): one row per scheduled token,
  stacked in batch order; the row of a token at position ``p`` sees keys ``0..p``, so a request's rows
  ``[q_start:q_end, :seq_len]`` are its ``[q_len, seq_len]`` mask (queries at positions
  ``seq_len - q_len .. seq_len - 1``);
- splitfuse, compressed ``[C, C]``: one causal tile the kernel offsets per request (see
  :func:`expand_compressed_mask`), independent of the batch. Used only where the device adaptor says its
  kernel takes it (``compressed_splitfuse_mask``); 310P's prompt flash attention takes full masks only.
"""

from __future__ import annotations

import torch

#: The additive value of a masked (query, key) pair (see the module docstring for the choice).
MASK_VALUE = -10000.0
#: Side of the compressed splitfuse tile (the fused attention ops' compressed causal mask is 2048 x 2048).
COMPRESSED_TILE = 2048


def causal_additive_mask(size: int, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """``[size, size]``: 0 on and below the diagonal, :data:`MASK_VALUE` above."""
    if size < 0:
        raise ValueError(f"mask size={size} is invalid; allowed: a non-negative integer")
    upper = torch.ones(size, size, dtype=torch.bool, device=device).triu_(diagonal=1)
    return torch.zeros(size, size, dtype=dtype, device=device).masked_fill_(upper, MASK_VALUE)


def expand_compressed_mask(tile: torch.Tensor, q_len: int, seq_len: int) -> torch.Tensor:
    """The ``[q_len, seq_len]`` mask of one request (queries at ``seq_len - q_len ..``) from a causal tile.

    What a kernel taking the compressed form computes: query rows are taken in chunks of ``C`` rows;
    for the chunk starting at query ``j0`` the tile is placed with its top-left corner at key
    ``ctx + j0`` (``ctx = seq_len - q_len``): keys left of it are attended, keys right of it masked,
    keys under it read the tile. Query ``j`` thus attends key ``k`` exactly when ``k <= ctx + j``.
    """
    size = tile.shape[0]
    if tile.dim() != 2 or tile.shape[1] != size or size == 0:
        raise ValueError(f"compressed mask must be a square [C, C] tile, got shape {tuple(tile.shape)}")
    if not 0 <= q_len <= seq_len:
        raise ValueError(f"q_len={q_len} must lie within [0, seq_len={seq_len}]")
    ctx = seq_len - q_len
    j = torch.arange(q_len, device=tile.device)
    row = j % size  # tile row of each query
    col = torch.arange(seq_len, device=tile.device).unsqueeze(0) - (ctx + j - row).unsqueeze(1)  # [Q, S]
    inside = tile[row.unsqueeze(1), col.clamp(0, size - 1)]
    masked = torch.full_like(inside, MASK_VALUE)
    return torch.where(col < 0, torch.zeros_like(inside), torch.where(col >= size, masked, inside))


class AttentionMaskBuilder310:
    """Builds and caches the 310P masks; one per metadata builder.

    The causal mask is cached per ``(dtype, device)`` at the largest size asked so far (a smaller one is
    its top-left slice, a view); the compressed tile per ``(size, dtype, device)``. The normal splitfuse
    mask depends on the batch and is gathered from the cached causal mask's rows each step.
    """

    def __init__(self, compressed_tile_size: int = COMPRESSED_TILE) -> None:
        if compressed_tile_size <= 0:
            raise ValueError(
                f"compressed_tile_size={compressed_tile_size} is invalid; allowed: a positive integer"
            )
        self.compressed_tile_size = compressed_tile_size
        self._causal: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}
        self._tiles: dict[tuple[int, torch.dtype, torch.device], torch.Tensor] = {}

    @staticmethod
    def is_compressed_mask_supported() -> bool:
        """Whether the current device's splitfuse kernel takes the compressed tile (asked of its adaptor)."""
        from vllm_ascend.core.sdk import get_device_adaptor

        return bool(getattr(get_device_adaptor(), "compressed_splitfuse_mask", False))

    def gen_causal_additive_mask(
        self, max_seq_len: int, dtype: torch.dtype, device: torch.device | str
    ) -> torch.Tensor:
        """``[max_seq_len, max_seq_len]`` causal additive mask (a view of the cached, possibly larger one)."""
        device = torch.device(device)
        key = (dtype, device)
        cached = self._causal.get(key)
        if cached is None or cached.shape[0] < max_seq_len:
            size = max(max_seq_len, cached.shape[0] if cached is not None else 0)
            cached = causal_additive_mask(size, dtype, device)
            self._causal[key] = cached
        return cached[:max_seq_len, :max_seq_len]

    def gen_splitfuse_mask(
        self,
        query_lens: torch.Tensor,
        seq_lens: torch.Tensor,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> torch.Tensor:
        """Normal form ``[sum(query_lens), max(seq_lens)]`` (host ``query_lens``/``seq_lens`` ``[B]``)."""
        q_lens = query_lens.to("cpu", torch.int64)
        lens = seq_lens.to("cpu", torch.int64)
        if q_lens.shape != lens.shape or q_lens.dim() != 1:
            raise ValueError(
                f"query_lens {tuple(q_lens.shape)} and seq_lens {tuple(lens.shape)} must be matching 1-D tensors"
            )
        if bool((q_lens < 0).any()) or bool((q_lens > lens).any()):
            raise ValueError(
                f"query_lens must lie within [0, seq_lens]; got {q_lens.tolist()} / {lens.tolist()}"
            )
        max_seq_len = int(lens.max()) if lens.numel() else 0
        num_tokens = int(q_lens.sum())
        # Position of each scheduled token: its request's context length plus its index in the request.
        ctx = torch.repeat_interleave(lens - q_lens, q_lens, output_size=num_tokens)
        starts = torch.repeat_interleave(torch.cumsum(q_lens, 0) - q_lens, q_lens, output_size=num_tokens)
        positions = ctx + torch.arange(num_tokens) - starts
        causal = self.gen_causal_additive_mask(max_seq_len, dtype, device)
        return causal.index_select(0, positions.to(causal.device))

    def gen_compressed_splitfuse_mask(self, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
        """Compressed form: the cached ``[C, C]`` causal tile."""
        device = torch.device(device)
        key = (self.compressed_tile_size, dtype, device)
        tile = self._tiles.get(key)
        if tile is None:
            tile = causal_additive_mask(self.compressed_tile_size, dtype, device)
            self._tiles[key] = tile
        return tile

    def get_splitfuse_mask(
        self,
        query_lens: torch.Tensor,
        seq_lens: torch.Tensor,
        dtype: torch.dtype,
        device: torch.device | str,
        compressed: bool | None = None,
    ) -> torch.Tensor:
        """The splitfuse mask in the form the device takes (``compressed=None``: ask the adaptor)."""
        if compressed is None:
            compressed = self.is_compressed_mask_supported()
        if compressed:
            return self.gen_compressed_splitfuse_mask(dtype, device)
        return self.gen_splitfuse_mask(query_lens, seq_lens, dtype, device)
