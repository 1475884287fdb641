"""Ascend Triton kernels of :mod:`vllm_ascend.kernels.v2.sample_gumbel`.

The work items, ``(token, column chunk)`` (temperature) or ``(token, vocabulary block)`` (sampling),
are walked grid-stride by the device's grid (``_geometry``: one program per vector core on Ascend, one
per item on CUDA, as vLLM launches them). Sampling runs on a 2-D grid, ``program_id(0)`` over tokens and
``program_id(1)`` over blocks, so no program divides to find its item: vLLM's ``(num_tokens, num_blocks)``
on CUDA, each program its one item with no loop (``PER_ITEM``: vLLM's code, registers and instruction
count for sm_90), and on Ascend a grid of at most the vector cores walked grid-stride along both axes,
a token's request state read once per program and token.
A vocabulary block wider than the UB allows is swept in tiles whose argmaxes are combined
leftmost-first, so the per-block results are those of vLLM's one-program-per-block launch; a block of
one tile (CUDA's and Ascend's 1024) is reduced once, as vLLM does. The murmur3 words of the request
(seed, position) are mixed once per token, the token id per element.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_ascend.kernels import _geometry
from vllm_ascend.kernels._triton.common import IS_INTERPRETED, ub_cap
from vllm_ascend.kernels.v2 import sample_gumbel as reference
from vllm_ascend.kernels.v2._launch import Grid, grid_dim, next_power_of_2

_SALT = tl.constexpr(reference.DRAFT_NOISE_SALT)


@triton.jit
def _rotl(x, SHIFT: tl.constexpr):
    return (x << SHIFT) | (x >> (32 - SHIFT))


@triton.jit
def _mix_word(h, word):
    """One murmur3 block step: ``word`` (uint32) scrambled into the state ``h`` (uint32)."""
    word = _rotl(word * 0xCC9E2D51, 15) * 0x1B873593
    return _rotl(h ^ word, 13) * 5 + 0xE6546B64


@triton.jit
def _finalize(h):
    h = (h ^ 16) ^ ((h ^ 16) >> 16)
    h = h * 0x85EBCA6B
    h = h ^ (h >> 13)
    h = h * 0xC2B2AE35
    return h ^ (h >> 16)


@triton.jit
def murmur3_prefix(seed, pos):
    """The murmur3 state after the request's words (seed low, seed high, position low), domain 0."""
    seed = seed.to(tl.int64)
    pos = pos.to(tl.int64)
    h = (seed - seed).to(tl.uint32)
    h = _mix_word(h, seed.to(tl.uint32))
    h = _mix_word(h, (seed >> 32).to(tl.uint32))
    return _mix_word(h, pos.to(tl.uint32))


@triton.jit
def murmur3_uniform_from_prefix(prefix, token):
    """vLLM's 32-bit uniform of ``token`` (int) after ``prefix``: ``(hash + 0.5) * 2**-32`` in fp32,
    summed from the two exact 16-bit halves."""
    r = _finalize(_mix_word(prefix, token.to(tl.uint32)))
    high = (r >> 16).to(tl.int32).to(tl.float32)
    low = (r & 0xFFFF).to(tl.int32).to(tl.float32)
    return high * 1.52587890625e-05 + (low + 0.5) * 2.3283064365386963e-10


@triton.jit
def gumbel_from_uniform(u):
    """``-log(-log(1 - u))`` as vLLM evaluates it in fp32: ``log(1 - u)`` by its degree-8 series
    below ``u = 0.25`` (the tail that wins the argmax), directly above."""
    series = 0.125
    series = 0.14285714285714285 + u * series
    series = 0.16666666666666666 + u * series
    series = 0.2 + u * series
    series = 0.25 + u * series
    series = 0.3333333333333333 + u * series
    series = 0.5 + u * series
    series = 1.0 + u * series
    log1m = tl.where(u < 0.25, -u * series, tl.log(tl.maximum(1.0 - u, 5.960464477539063e-08)))
    return -tl.log(-log1m)


@triton.jit
def _uniform_kernel(seed_ptr, pos_ptr, out_ptr, n, TILE: tl.constexpr):
    prefix = murmur3_prefix(tl.load(seed_ptr), tl.load(pos_ptr))
    for start in range(0, n, TILE):
        offs = start + tl.arange(0, TILE)
        tl.store(out_ptr + offs, murmur3_uniform_from_prefix(prefix, offs), mask=offs < n)


def murmur3_uniforms(seed: torch.Tensor, pos: torch.Tensor, n: int) -> torch.Tensor:
    """The float32 uniforms of token ids ``0 .. n - 1`` at ``(seed, pos)`` (one-element int64
    tensors), as the sampling kernel draws them (vLLM's ``murmur3_uniform32`` stream)."""
    out = torch.empty(n, dtype=torch.float32, device=seed.device)
    if n:
        _uniform_kernel[(1,)](seed, pos, out, n, TILE=min(next_power_of_2(n), 1024))
    return out


@triton.jit
def _temperature_kernel(
    logits_ptr,
    logits_stride,
    idx_mapping_ptr,
    temperature_ptr,
    num_tokens,
    width,
    chunks,
    chunk,
    TILE: tl.constexpr,
    PER_ITEM: tl.constexpr,
):
    # Every column is scaled on its own (rows of temperature 0 or 1 untouched).
    if PER_ITEM:  # a program per (token, TILE columns) (CUDA, vLLM's 2-D grid), no loop
        token = tl.program_id(0)
        temp = tl.load(temperature_ptr + tl.load(idx_mapping_ptr + token)).to(tl.float32)
        if (temp != 0.0) & (temp != 1.0):
            row = logits_ptr + tl.cast(token, tl.int64) * logits_stride
            offs = tl.program_id(1) * TILE + tl.arange(0, TILE)
            mask = offs < width
            x = tl.load(row + offs, mask=mask, other=0.0).to(tl.float32)
            tl.store(row + offs, (x / temp).to(logits_ptr.dtype.element_ty), mask=mask)
    else:  # work items (token, column chunk) grid-stride (Ascend: a program per vector core)
        pid = tl.program_id(0)
        programs = tl.num_programs(0)
        for item in range(pid, num_tokens * chunks, programs):
            token = item // chunks
            begin = (item - token * chunks) * chunk
            end = tl.minimum(begin + chunk, width)
            temp = tl.load(temperature_ptr + tl.load(idx_mapping_ptr + token)).to(tl.float32)
            if (temp != 0.0) & (temp != 1.0):
                row = logits_ptr + tl.cast(token, tl.int64) * logits_stride
                for start in range(begin, end, TILE):
                    offs = start + tl.arange(0, TILE)
                    mask = offs < end
                    x = tl.load(row + offs, mask=mask, other=0.0).to(tl.float32)
                    tl.store(row + offs, (x / temp).to(logits_ptr.dtype.element_ty), mask=mask)


def temperature(
    grid: Grid,
    logits_ptr: torch.Tensor,
    logits_stride: int,
    expanded_idx_mapping_ptr: torch.Tensor,
    temperature_ptr: torch.Tensor,
    vocab_size: int,
    BLOCK_SIZE: int,
) -> None:
    num_tokens = grid_dim(grid, 0)
    width = min(vocab_size, grid_dim(grid, 1) * BLOCK_SIZE)
    if num_tokens == 0 or width <= 0:
        return
    device = logits_ptr.device
    geometry = _geometry.geometry(device)
    tile = min(next_power_of_2(width), ub_cap(device, 64 if IS_INTERPRETED else 8192, 3))
    chunks, chunk = geometry.column_split(num_tokens, width, tile)
    per_item = geometry.grid == "work"  # column_split gave a tile per chunk: grid (tokens, chunks)
    _temperature_kernel[(num_tokens, chunks) if per_item else (geometry.programs(num_tokens * chunks),)](
        logits_ptr,
        logits_stride,
        expanded_idx_mapping_ptr,
        temperature_ptr,
        num_tokens,
        width,
        chunks,
        chunk,
        TILE=tile,
        PER_ITEM=per_item,
    )


@triton.jit
def _noised_tile(
    row,
    source_row,
    cache_row,
    offs,
    vocab_size,
    valid,
    temp,
    prefix,
    HAS_CACHE: tl.constexpr,
    APPLY_TEMPERATURE: tl.constexpr,
):
    """Logits ``offs`` of a row (cached first, before temperature, for a valid request), in float32,
    scaled and Gumbel-noised where the request samples (``temp != 0``); -inf past the vocabulary."""
    mask = offs < vocab_size
    x = tl.load(row + offs, mask=mask, other=float("-inf")).to(tl.float32)
    if HAS_CACHE:
        if valid:
            tl.store(cache_row + offs, tl.load(source_row + offs, mask=mask), mask=mask)
    if temp != 0.0:
        if APPLY_TEMPERATURE:
            x = x / temp
        noise = gumbel_from_uniform(murmur3_uniform_from_prefix(prefix, offs))
        x = tl.where(mask, x + noise, float("-inf"))
    return x


#: Sampling tile cap: a whole vLLM block (1024) on CUDA, UB-bounded on Ascend; under the interpreter
#: smaller than the test blocks, so they take the tile-merge path too.
GUMBEL_TILE = 64 if IS_INTERPRETED else 4096


@triton.jit
def _token_state(
    token,
    idx_mapping_ptr,
    seeds_ptr,
    pos_ptr,
    temp_ptr,
    cache_ptr,
    cache_stride_0,
    cache_stride_1,
    cache_col_ptr,
    IS_DRAFTING: tl.constexpr,
    HAS_CACHE: tl.constexpr,
    PER_TOKEN_COL: tl.constexpr,
):
    """A token's request state: ``(valid, temp, murmur3 prefix, its logits-cache row)`` (a padded token,
    request -1, samples greedily with seed 0)."""
    req = tl.load(idx_mapping_ptr + token).to(tl.int64)
    valid = req >= 0
    state = tl.where(valid, req, 0)
    temp = tl.where(valid, tl.load(temp_ptr + state).to(tl.float32), 0.0)
    seed = tl.where(valid, tl.load(seeds_ptr + state).to(tl.int64), 0)
    pos = tl.load(pos_ptr + token).to(tl.int64)
    if IS_DRAFTING:
        pos = pos + _SALT
    cache_row = cache_ptr
    if HAS_CACHE:
        if PER_TOKEN_COL:
            col = tl.load(cache_col_ptr + token).to(tl.int64)
        else:
            col = tl.load(cache_col_ptr).to(tl.int64)
        cache_row = cache_ptr + state * cache_stride_0 + col * cache_stride_1
    return valid, temp, murmur3_prefix(seed, pos), cache_row


@triton.jit
def _sample_block(
    token,
    block,
    valid,
    temp,
    prefix,
    cache_row,
    local_argmax_ptr,
    local_argmax_stride,
    local_max_ptr,
    local_max_stride,
    source_ptr,
    source_stride,
    logits_ptr,
    logits_stride,
    vocab_size,
    BLOCK_SIZE: tl.constexpr,
    TILE: tl.constexpr,
    APPLY_TEMPERATURE: tl.constexpr,
    HAS_CACHE: tl.constexpr,
):
    """Block ``block`` of a token's row: its (noised) maximum and the token id of its leftmost argmax."""
    token64 = tl.cast(token, tl.int64)
    row = logits_ptr + token64 * logits_stride
    source_row = source_ptr + token64 * source_stride
    block_start = block * BLOCK_SIZE
    if TILE == BLOCK_SIZE:  # one tile: reduced once, as vLLM's block
        offs = block_start + tl.arange(0, TILE)
        x = _noised_tile(
            row, source_row, cache_row, offs, vocab_size, valid, temp, prefix, HAS_CACHE, APPLY_TEMPERATURE
        )
        best, index = tl.max(x, axis=0, return_indices=True)
        best_idx = index.to(tl.int32)
    else:
        best = tl.full([], float("-inf"), tl.float32)
        best_idx = tl.full([], 0, tl.int32)
        for start in range(0, BLOCK_SIZE, TILE):
            offs = block_start + start + tl.arange(0, TILE)
            x = _noised_tile(
                row,
                source_row,
                cache_row,
                offs,
                vocab_size,
                valid,
                temp,
                prefix,
                HAS_CACHE,
                APPLY_TEMPERATURE,
            )
            value, index = tl.max(x, axis=0, return_indices=True)
            better = value > best
            best_idx = tl.where(better, start + index.to(tl.int32), best_idx)
            best = tl.where(better, value, best)
    tl.store(local_argmax_ptr + token64 * local_argmax_stride + block, (block_start + best_idx).to(tl.int64))
    tl.store(local_max_ptr + token64 * local_max_stride + block, best)


@triton.jit
def _gumbel_sample_kernel(
    local_argmax_ptr,
    local_argmax_stride,
    local_max_ptr,
    local_max_stride,
    cache_ptr,
    cache_stride_0,
    cache_stride_1,
    cache_col_ptr,
    source_ptr,
    source_stride,
    logits_ptr,
    logits_stride,
    idx_mapping_ptr,
    seeds_ptr,
    pos_ptr,
    temp_ptr,
    num_tokens,
    num_blocks,
    vocab_size,
    BLOCK_SIZE: tl.constexpr,
    TILE: tl.constexpr,
    IS_DRAFTING: tl.constexpr,
    APPLY_TEMPERATURE: tl.constexpr,
    HAS_CACHE: tl.constexpr,
    PER_TOKEN_COL: tl.constexpr,
    PER_ITEM: tl.constexpr,
):
    if PER_ITEM:  # the grid is (num_tokens, num_blocks): program (token, block), vLLM's
        token = tl.program_id(0)
        valid, temp, prefix, cache_row = _token_state(
            token,
            idx_mapping_ptr,
            seeds_ptr,
            pos_ptr,
            temp_ptr,
            cache_ptr,
            cache_stride_0,
            cache_stride_1,
            cache_col_ptr,
            IS_DRAFTING,
            HAS_CACHE,
            PER_TOKEN_COL,
        )
        _sample_block(
            token,
            tl.program_id(1),
            valid,
            temp,
            prefix,
            cache_row,
            local_argmax_ptr,
            local_argmax_stride,
            local_max_ptr,
            local_max_stride,
            source_ptr,
            source_stride,
            logits_ptr,
            logits_stride,
            vocab_size,
            BLOCK_SIZE,
            TILE,
            APPLY_TEMPERATURE,
            HAS_CACHE,
        )
    else:  # 2-D grid-stride: tokens along axis 0, each token's blocks along axis 1
        for token in range(tl.program_id(0), num_tokens, tl.num_programs(0)):
            valid, temp, prefix, cache_row = _token_state(
                token,
                idx_mapping_ptr,
                seeds_ptr,
                pos_ptr,
                temp_ptr,
                cache_ptr,
                cache_stride_0,
                cache_stride_1,
                cache_col_ptr,
                IS_DRAFTING,
                HAS_CACHE,
                PER_TOKEN_COL,
            )
            for block in range(tl.program_id(1), num_blocks, tl.num_programs(1)):
                _sample_block(
                    token,
                    block,
                    valid,
                    temp,
                    prefix,
                    cache_row,
                    local_argmax_ptr,
                    local_argmax_stride,
                    local_max_ptr,
                    local_max_stride,
                    source_ptr,
                    source_stride,
                    logits_ptr,
                    logits_stride,
                    vocab_size,
                    BLOCK_SIZE,
                    TILE,
                    APPLY_TEMPERATURE,
                    HAS_CACHE,
                )


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
    args = (
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
    if USE_FP64:
        # Ascend's vector units have no fp64: the opt-in fp64 Gumbel runs as torch ops on the device.
        reference.gumbel_sample_torch(*args)
        return
    num_tokens, num_blocks = grid_dim(grid, 0), grid_dim(grid, 1)
    if num_tokens == 0 or num_blocks == 0:
        return
    device = logits_ptr.device
    has_cache = logits_cache_ptr is not None
    geometry = _geometry.geometry(device)
    programs = geometry.programs_2d(num_tokens, num_blocks)
    tile = min(BLOCK_SIZE, ub_cap(device, GUMBEL_TILE, 8))
    _gumbel_sample_kernel[programs](
        local_argmax_ptr,
        local_argmax_stride,
        local_max_ptr,
        local_max_stride,
        logits_cache_ptr if has_cache else logits_ptr,
        logits_cache_stride_0,
        logits_cache_stride_1,
        logits_cache_col_ptr if has_cache else expanded_idx_mapping_ptr,
        logits_cache_source_ptr if has_cache else logits_ptr,
        logits_cache_source_stride,
        logits_ptr,
        logits_stride,
        expanded_idx_mapping_ptr,
        seeds_ptr,
        pos_ptr,
        temp_ptr,
        num_tokens,
        num_blocks,
        vocab_size,
        BLOCK_SIZE=BLOCK_SIZE,
        TILE=tile,
        IS_DRAFTING=IS_DRAFTING,
        APPLY_TEMPERATURE=APPLY_TEMPERATURE,
        HAS_CACHE=has_cache,
        PER_TOKEN_COL=PER_TOKEN_COL,
        PER_ITEM=programs == (num_tokens, num_blocks),
    )
