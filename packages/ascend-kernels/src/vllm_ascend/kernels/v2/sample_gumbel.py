"""Overrides of the kernels of vLLM's ``vllm/v1/worker/gpu/sample/gumbel.py`` (temperature scaling and
seeded Gumbel-max sampling), with torch versions of its murmur3 noise stream.

The noise is a counter-based hash: the uniform of vocabulary entry ``k`` of token position ``pos`` of a
request seeded ``seed`` is a function of ``(seed, pos, k)`` only, so seeded requests draw the same
tokens as on vLLM's GPUs. :func:`murmur3_hash32_torch` reproduces vLLM's ``murmur3_hash32`` bit for
bit (uint32 arithmetic emulated in int64), :func:`murmur3_uniform32_torch` /
:func:`murmur3_uniform64_torch` its uniforms exactly, :func:`gumbel_noise_torch` the noise to float
rounding (``log``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from vllm_ascend.kernels.v2._launch import Grid, dispatch_v2, grid_dim

_VLLM = "vllm.v1.worker.gpu.sample.gumbel"

_U32 = 0xFFFFFFFF
#: Added to the position of draft tokens (vLLM's ``_DRAFT_NOISE_SALT``): disjoint draft noise.
DRAFT_NOISE_SALT = 1 << 30
#: The domain of the high word of the 64-bit uniform.
UNIFORM64_HIGH_DOMAIN = 0x9E3779B9


def _mul32(a: torch.Tensor, b: int) -> torch.Tensor:
    """``a * b mod 2**32`` for ``a`` in ``[0, 2**32)`` (int64) without int64 overflow."""
    lo = a * (b & 0xFFFF)
    hi = ((a * (b >> 16)) & 0xFFFF) << 16
    return (lo + hi) & _U32


def _mul32_(a: torch.Tensor, b: int) -> torch.Tensor:
    """:func:`_mul32` in place (the noise's full-size intermediates: no fresh buffers per step)."""
    hi = a * (b >> 16)
    hi.bitwise_and_(0xFFFF).bitwise_left_shift_(16)
    return a.mul_(b & 0xFFFF).add_(hi).bitwise_and_(_U32)


def _rotl32(a: torch.Tensor, shift: int) -> torch.Tensor:
    return ((a << shift) & _U32) | (a >> (32 - shift))


def _rotl32_(a: torch.Tensor, shift: int) -> torch.Tensor:
    low = a >> (32 - shift)
    return a.bitwise_left_shift_(shift).bitwise_and_(_U32).bitwise_or_(low)


def _mix(h: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    key = _rotl32(_mul32(key, 0xCC9E2D51), 15)
    key = _mul32(key, 0x1B873593)
    h = _rotl32_(h ^ key, 13)
    return h.mul_(5).add_(0xE6546B64).bitwise_and_(_U32)


def _fmix_(h: torch.Tensor) -> torch.Tensor:
    """murmur3's finaliser, in place."""
    h ^= h >> 16
    _mul32_(h, 0x85EBCA6B)
    h ^= h >> 13
    _mul32_(h, 0xC2B2AE35)
    h ^= h >> 16
    return h


def murmur3_hash32_torch(
    seed: torch.Tensor, pos: torch.Tensor, offset: torch.Tensor, domain: int = 0
) -> torch.Tensor:
    """vLLM's ``murmur3_hash32(seed, pos, offset, domain)`` as int64 values in ``[0, 2**32)``
    (broadcasting): murmur3 of the words ``seed`` low, ``seed`` high, ``pos`` low, ``offset`` (as
    uint32), starting from ``domain``."""
    seed = seed.to(torch.int64)
    pos = pos.to(torch.int64)
    offset = offset.to(torch.int64) & _U32
    h = torch.full_like(seed, domain & _U32)
    h = _mix(h, seed & _U32)
    h = _mix(h, (seed >> 32) & _U32)
    h = _mix(h, pos & _U32)
    h = _mix(h, offset)
    return _fmix_(h ^ 16)


def murmur3_uniform32_torch(seed: torch.Tensor, pos: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """vLLM's ``murmur3_uniform32``: ``fp32((hash + 0.5) * 2**-32)``, in ``(0, 1)``, bit-exact."""
    r = murmur3_hash32_torch(seed, pos, offset)
    # Both halves and their scaled sum are exact in float64; one rounding to float32, as vLLM's.
    high = (r >> 16).double().mul_(2.0**-16)
    return high.add_((r & 0xFFFF).double().add_(0.5).mul_(2.0**-32)).float()


def murmur3_uniform64_torch(seed: torch.Tensor, pos: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """vLLM's ``murmur3_uniform64``: 53 bits from two hash domains, ``(r + 0.5) * 2**-53`` (fp64),
    never 1.0."""
    lo = murmur3_hash32_torch(seed, pos, offset)
    hi = murmur3_hash32_torch(seed, pos, offset, domain=UNIFORM64_HIGH_DOMAIN)
    random53 = (hi << 21) | (lo >> 11)
    uniform = (random53.double() + 0.5) * 2.0**-53
    return torch.where(uniform == 1.0, uniform - 2.0**-53, uniform)


def _log1p_neg_stable(value: torch.Tensor) -> torch.Tensor:
    """``log(1 - value)`` in float32 as vLLM computes it (degree-8 series below 0.25)."""

    def c(x: float) -> torch.Tensor:
        return torch.tensor(x, dtype=torch.float32)

    polynomial = value * c(1.0 / 8.0)  # Horner's scheme, in place: p = 1/k + value * p
    for k in (7.0, 6.0, 5.0, 4.0, 3.0, 2.0):
        polynomial.add_(c(1.0 / k)).mul_(value)
    series = polynomial.add_(c(1.0)).mul_(-value)
    direct = torch.log(torch.clamp_min(c(1.0) - value, 5.960464477539063e-08))
    return torch.where(value < 0.25, series, direct)


def gumbel_noise_torch(
    seed: torch.Tensor, pos: torch.Tensor, offset: torch.Tensor, use_fp64: bool = False
) -> torch.Tensor:
    """vLLM's Gumbel noise of ``(seed, pos, offset)`` (the part of ``gumbel_noised_argmax`` after the
    draft salt): float32 ``-log(-log1p(-u))`` of the 32-bit uniform, or float64 ``-log(-log(u))`` of
    the 64-bit one."""
    if use_fp64:
        return murmur3_uniform64_torch(seed, pos, offset).log_().neg_().log_().neg_()
    return _log1p_neg_stable(murmur3_uniform32_torch(seed, pos, offset)).neg_().log_().neg_()


def _rows(t: torch.Tensor, rows: int, stride: int, width: int) -> torch.Tensor:
    """The ``[rows, width]`` view a kernel addresses as ``ptr + row * stride + col``."""
    return t.as_strided((rows, width), (stride, 1), t.storage_offset())


def temperature_torch(
    grid: Grid,
    logits_ptr: torch.Tensor,
    logits_stride: int,
    expanded_idx_mapping_ptr: torch.Tensor,
    temperature_ptr: torch.Tensor,
    vocab_size: int,
    BLOCK_SIZE: int,
) -> None:
    """Reference of :func:`temperature`."""
    num_tokens = grid_dim(grid, 0)
    width = min(vocab_size, grid_dim(grid, 1) * BLOCK_SIZE)
    if num_tokens == 0 or width <= 0:
        return
    logits = _rows(logits_ptr, num_tokens, logits_stride, width)
    temp = temperature_ptr[expanded_idx_mapping_ptr[:num_tokens].long()].float()
    scaled = ((temp != 0.0) & (temp != 1.0)).nonzero().flatten()
    if scaled.numel():
        rows = logits[scaled].float() / temp[scaled, None]
        logits[scaled] = rows.to(logits.dtype)


def temperature(
    grid: Grid,
    logits_ptr: torch.Tensor,
    logits_stride: int,
    expanded_idx_mapping_ptr: torch.Tensor,
    temperature_ptr: torch.Tensor,
    vocab_size: int,
    BLOCK_SIZE: int,
) -> None:
    """Divides, in place, the logits of each token ``t < grid[0]`` by its request's temperature
    (``temperature_ptr[expanded_idx_mapping_ptr[t]]``, in float32), the first
    ``min(vocab_size, grid[1] * BLOCK_SIZE)`` columns; rows at temperature 0 (greedy) or 1 untouched."""
    impl = dispatch_v2("sample_gumbel", "temperature", temperature_torch, logits_ptr.device)
    impl(
        grid,
        logits_ptr,
        logits_stride,
        expanded_idx_mapping_ptr,
        temperature_ptr,
        vocab_size,
        BLOCK_SIZE,
    )


def _greedy_block_max(
    logits: torch.Tensor, local_argmax: torch.Tensor, local_max: torch.Tensor, block_size: int
) -> bool:
    """The blockwise leftmost maximum of plain logits ``[T, covered]`` into ``local_argmax`` / ``local_max``
    ``[T, blocks]`` (blocks past ``covered`` read as -inf: value -inf, their first token), without copying the
    logits: the greedy-only batch's whole work. False, writing nothing, where a maximum is NaN (the general
    path then reads NaN as -inf)."""
    covered, num_blocks = logits.shape[1], local_argmax.shape[1]
    full, tail = divmod(covered, block_size)
    values, index = (
        torch.max(logits[:, : full * block_size].unflatten(1, (full, block_size)), dim=-1)
        if full
        else (local_max[:, :0], local_argmax[:, :0])
    )
    if tail:
        last, last_index = torch.max(logits[:, full * block_size :], dim=-1, keepdim=True)
        values, index = torch.cat([values, last.to(values.dtype)], 1), torch.cat([index, last_index], 1)
    if values.isnan().any():
        return False
    done = values.shape[1]
    local_max[:, :done] = values
    offsets = torch.arange(0, done * block_size, block_size, device=index.device)
    local_argmax[:, :done] = index + offsets if done > 1 else index
    if done < num_blocks:
        local_max[:, done:] = float("-inf")
        local_argmax[:, done:] = torch.arange(
            done * block_size, num_blocks * block_size, block_size, device=index.device
        )
    return True


def gumbel_sample_torch(
    grid: Grid,
    local_argmax_ptr: torch.Tensor,
    local_argmax_stride: int,
    local_max_ptr: torch.Tensor,
    local_max_stride: int,
    logits_cache_ptr: torch.Tensor | None,
    logits_cache_stride_0: int,
    logits_cache_stride_1: int,
    logits_cache_col_ptr: torch.Tensor | None,
    logits_cache_source_ptr: torch.Tensor | None,
    logits_cache_source_stride: int,
    logits_ptr: torch.Tensor,
    logits_stride: int,
    expanded_idx_mapping_ptr: torch.Tensor,
    seeds_ptr: torch.Tensor,
    pos_ptr: torch.Tensor,
    temp_ptr: torch.Tensor,
    vocab_size: int,
    BLOCK_SIZE: int,
    IS_DRAFTING: bool,
    APPLY_TEMPERATURE: bool,
    USE_FP64: bool,
    PER_TOKEN_COL: bool,
) -> None:
    """Reference of :func:`gumbel_sample`: per token, ``logits / temp + gumbel(seed, pos, column)`` over
    the vocabulary (plain logits where ``temp == 0``: no noise computed for those rows), ``-inf`` past it,
    then the leftmost maximum of each ``BLOCK_SIZE`` block."""
    num_tokens, num_blocks = grid_dim(grid, 0), grid_dim(grid, 1)
    if num_tokens == 0 or num_blocks == 0:
        return
    width = num_blocks * BLOCK_SIZE
    covered = max(0, min(vocab_size, width))
    device = logits_ptr.device
    req = expanded_idx_mapping_ptr[:num_tokens].long()
    valid = req >= 0
    safe_req = req.clamp_min(0)

    if logits_cache_ptr is not None and covered:
        assert logits_cache_col_ptr is not None and logits_cache_source_ptr is not None
        col = logits_cache_col_ptr[:num_tokens] if PER_TOKEN_COL else logits_cache_col_ptr.reshape(-1)[:1]
        col = col.long().expand(num_tokens)
        source = _rows(logits_cache_source_ptr, num_tokens, logits_cache_source_stride, covered)
        cache = logits_cache_ptr.as_strided(
            (logits_cache_ptr.shape[0], logits_cache_ptr.shape[1], covered),
            (logits_cache_stride_0, logits_cache_stride_1, 1),
            logits_cache_ptr.storage_offset(),
        )
        cache[req[valid], col[valid]] = source[valid].to(cache.dtype)

    temp = torch.where(valid, temp_ptr[safe_req].float(), torch.zeros((), device=device))
    # Gumbel noise only for the sampled rows (temperature != 0), over the vocabulary; greedy rows keep
    # their plain logits (an all-greedy batch computes no noise).
    sampled = (temp != 0.0).nonzero().flatten()
    if not sampled.numel() and _greedy_block_max(
        _rows(logits_ptr, num_tokens, logits_stride, covered),
        _rows(local_argmax_ptr, num_tokens, local_argmax_stride, num_blocks),
        _rows(local_max_ptr, num_tokens, local_max_stride, num_blocks),
        BLOCK_SIZE,
    ):
        return
    logits = _rows(logits_ptr, num_tokens, logits_stride, covered).to(torch.float32, copy=True)
    if APPLY_TEMPERATURE and sampled.numel():
        logits[sampled] = logits[sampled] / temp[sampled, None]
    if USE_FP64:
        logits = logits.double()
    if sampled.numel() and covered:
        seed = seeds_ptr[req[sampled]].long()
        pos = pos_ptr[:num_tokens].long()[sampled]
        if IS_DRAFTING:
            pos = pos + DRAFT_NOISE_SALT
        keys = torch.arange(covered, device=device, dtype=torch.int64)
        noise = gumbel_noise_torch(seed[:, None], pos[:, None], keys[None, :], use_fp64=USE_FP64)
        logits.index_add_(0, sampled, noise)
    if covered < width:  # columns past the vocabulary (or past the logits) read as -inf
        logits = torch.cat([logits, logits.new_full((num_tokens, width - covered), float("-inf"))], dim=1)

    # Triton's max(return_indices=True): the leftmost maximum (NaN compares as nothing: taken as -inf).
    blocks = logits.view(num_tokens, num_blocks, BLOCK_SIZE)
    blocks.masked_fill_(blocks.isnan(), float("-inf"))
    value, first = blocks.amax(dim=-1), blocks.argmax(dim=-1)
    token = first + torch.arange(num_blocks, device=device)[None, :] * BLOCK_SIZE
    _rows(local_argmax_ptr, num_tokens, local_argmax_stride, num_blocks).copy_(token)
    _rows(local_max_ptr, num_tokens, local_max_stride, num_blocks).copy_(value)


_gumbel_sample_grid = gumbel_sample_torch  # the torch form, for the host form's other launches

#: Logits dtypes the host form reads through numpy (numpy has no bfloat16).
_HOST_DTYPES = (torch.float32, torch.float64, torch.float16)


def _host_greedy_block_max(
    logits: np.ndarray, local_argmax: np.ndarray, local_max: np.ndarray, block_size: int
) -> bool:
    """:func:`_greedy_block_max` on numpy views."""
    rows, covered = logits.shape
    num_blocks = local_argmax.shape[1]
    full, tail = divmod(covered, block_size)
    done = full + bool(tail)
    index = np.empty((rows, done), np.int64)
    values = np.empty((rows, done), logits.dtype)
    if full:
        blocks = logits[:, : full * block_size].reshape(rows, full, block_size)
        index[:, :full] = blocks.argmax(-1)
        values[:, :full] = np.take_along_axis(blocks, index[:, :full, None], -1)[..., 0]
    if tail:
        last = logits[:, full * block_size :]
        index[:, full] = last.argmax(-1)
        values[:, full] = last[np.arange(rows), index[:, full]]
    if np.isnan(values).any():
        return False
    local_max[:, :done] = values
    local_argmax[:, :done] = index + np.arange(0, done * block_size, block_size)
    local_max[:, done:] = -np.inf
    local_argmax[:, done:] = np.arange(done * block_size, num_blocks * block_size, block_size)
    return True


def gumbel_sample_host(
    grid: Grid,
    local_argmax_ptr: torch.Tensor,
    local_argmax_stride: int,
    local_max_ptr: torch.Tensor,
    local_max_stride: int,
    logits_cache_ptr: torch.Tensor | None,
    logits_cache_stride_0: int,
    logits_cache_stride_1: int,
    logits_cache_col_ptr: torch.Tensor | None,
    logits_cache_source_ptr: torch.Tensor | None,
    logits_cache_source_stride: int,
    logits_ptr: torch.Tensor,
    logits_stride: int,
    expanded_idx_mapping_ptr: torch.Tensor,
    seeds_ptr: torch.Tensor,
    pos_ptr: torch.Tensor,
    temp_ptr: torch.Tensor,
    vocab_size: int,
    BLOCK_SIZE: int,
    IS_DRAFTING: bool,
    APPLY_TEMPERATURE: bool,
    USE_FP64: bool,
    PER_TOKEN_COL: bool,
) -> None:
    """:func:`gumbel_sample_torch` on numpy views of host tensors for an all-greedy batch without a logits
    cache (one max per block, as the torch form's greedy path); every other launch takes the torch form."""
    num_tokens, num_blocks = grid_dim(grid, 0), grid_dim(grid, 1)
    host_dtypes = logits_ptr.dtype in _HOST_DTYPES and temp_ptr.dtype in _HOST_DTYPES
    if logits_cache_ptr is None and num_tokens and num_blocks and host_dtypes:
        req = expanded_idx_mapping_ptr.numpy()[:num_tokens]
        if not temp_ptr.numpy()[req[req >= 0]].any():  # no sampled row (a NaN temperature counts as one)
            covered = max(0, min(vocab_size, num_blocks * BLOCK_SIZE))
            if _host_greedy_block_max(
                _rows(logits_ptr, num_tokens, logits_stride, covered).numpy(),
                _rows(local_argmax_ptr, num_tokens, local_argmax_stride, num_blocks).numpy(),
                _rows(local_max_ptr, num_tokens, local_max_stride, num_blocks).numpy(),
                BLOCK_SIZE,
            ):
                return
    _gumbel_sample_grid(
        grid, local_argmax_ptr, local_argmax_stride, local_max_ptr, local_max_stride, logits_cache_ptr,
        logits_cache_stride_0, logits_cache_stride_1, logits_cache_col_ptr, logits_cache_source_ptr,
        logits_cache_source_stride, logits_ptr, logits_stride, expanded_idx_mapping_ptr, seeds_ptr, pos_ptr,
        temp_ptr, vocab_size, BLOCK_SIZE, IS_DRAFTING, APPLY_TEMPERATURE, USE_FP64, PER_TOKEN_COL,
    )  # fmt: skip


def gumbel_sample(
    grid: Grid,
    local_argmax_ptr: torch.Tensor,
    local_argmax_stride: int,
    local_max_ptr: torch.Tensor,
    local_max_stride: int,
    logits_cache_ptr: torch.Tensor | None,
    logits_cache_stride_0: int,
    logits_cache_stride_1: int,
    logits_cache_col_ptr: torch.Tensor | None,
    logits_cache_source_ptr: torch.Tensor | None,
    logits_cache_source_stride: int,
    logits_ptr: torch.Tensor,
    logits_stride: int,
    expanded_idx_mapping_ptr: torch.Tensor,
    seeds_ptr: torch.Tensor,
    pos_ptr: torch.Tensor,
    temp_ptr: torch.Tensor,
    vocab_size: int,
    BLOCK_SIZE: int,
    IS_DRAFTING: bool,
    APPLY_TEMPERATURE: bool,
    USE_FP64: bool,
    PER_TOKEN_COL: bool,
) -> None:
    """Per-block Gumbel-max candidates: for token ``t < grid[0]`` and vocabulary block ``b < grid[1]``
    (``BLOCK_SIZE`` columns), ``local_argmax[t, b]`` / ``local_max[t, b]`` = the argmax (token id) and
    max of ``logits / temp + gumbel(seed, pos, token id)`` over the block (float32, or float64 with
    ``USE_FP64``; plain logits for temperature 0 and for rows whose ``expanded_idx_mapping`` is
    negative; no division without ``APPLY_TEMPERATURE``; ``pos + 2**30`` when ``IS_DRAFTING``).
    With a logits cache, the raw source logits of ``t`` are also copied to
    ``logits_cache[req, col]`` (``col`` per token with ``PER_TOKEN_COL``)."""
    device = logits_ptr.device
    impl = dispatch_v2(
        "sample_gumbel",
        "gumbel_sample",
        gumbel_sample_torch,
        device,
    )
    impl(
        grid,
        local_argmax_ptr,
        local_argmax_stride,
        local_max_ptr,
        local_max_stride,
        logits_cache_ptr,
        logits_cache_stride_0,
        logits_cache_stride_1,
        logits_cache_col_ptr,
        logits_cache_source_ptr,
        logits_cache_source_stride,
        logits_ptr,
        logits_stride,
        expanded_idx_mapping_ptr,
        seeds_ptr,
        pos_ptr,
        temp_ptr,
        vocab_size,
        BLOCK_SIZE,
        IS_DRAFTING,
        APPLY_TEMPERATURE,
        USE_FP64,
        PER_TOKEN_COL,
    )


OVERRIDES: dict[str, Callable[..., Any]] = {
    f"{_VLLM}._temperature_kernel": temperature,
    f"{_VLLM}._gumbel_sample_kernel": gumbel_sample,
}
