"""Ascend Triton kernels of :mod:`vllm_ascend.kernels.v2.sample_penalties`.

Work items ``(row, column chunk)`` (penalties) or ``(request, chunk of its prefill tokens)`` (bincount),
columns and tokens being independent, are walked grid-stride by the device's grid (``_geometry``: one
program per vector core on Ascend, whole rows once the rows fill the cores; one per tile on CUDA, as
vLLM's per-block launch), each swept in UB-sized tiles. A penalties tile of ``WORDS * 32`` columns is a
``[WORDS, 32]`` block (word ``w``, bit ``b``: column ``32 w + b``), so each prompt-bitmask word is loaded
once and its bits tested in place, with no reshape to 1-D (vLLM reshapes its ``[BLOCK / 32, 32]``
expansion; the kernels here keep reshapes of tiles out, for triton-ascend). Tiles are 8192 columns on CUDA (vLLM's block), 4096 on Ascend (then
bounded by the UB). Penalties run on a 2-D grid, ``program_id(0)`` over tokens and ``program_id(1)`` over
column chunks: on CUDA vLLM's ``(num_tokens, tiles)``, a program per tile with no loop (``PER_ITEM``),
on Ascend at most the vector cores, walking both axes grid-stride.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_ascend.kernels import _geometry
from vllm_ascend.kernels._triton.common import IS_INTERPRETED, ub_cap
from vllm_ascend.kernels.v2._launch import Grid, grid_dim, next_power_of_2


@triton.jit
def _bincount_kernel(
    idx_mapping_ptr,
    all_token_ids_ptr,
    all_token_ids_stride,
    prompt_len_ptr,
    prefill_len_ptr,
    prompt_bin_mask_ptr,
    prompt_bin_mask_stride,
    output_bin_counts_ptr,
    output_bin_counts_stride,
    num_tokens,
    covered,
    chunks,
    chunk,
    BLOCK_SIZE: tl.constexpr,
    TILE: tl.constexpr,
):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    for item in range(pid, num_tokens * chunks, programs):
        token = item // chunks
        begin = (item - token * chunks) * chunk
        state = tl.load(idx_mapping_ptr + token).to(tl.int64)
        prompt_len = tl.load(prompt_len_ptr + state)
        prefill_len = tl.load(prefill_len_ptr + state)
        # vLLM's blocks starting at or past prefill_len read nothing (also no prompt tokens).
        live = tl.minimum(covered, tl.cdiv(prefill_len, BLOCK_SIZE) * BLOCK_SIZE)
        end = tl.minimum(tl.minimum(live, tl.maximum(prompt_len, prefill_len)), begin + chunk)
        tokens_row = all_token_ids_ptr + state * all_token_ids_stride
        mask_row = prompt_bin_mask_ptr + state * prompt_bin_mask_stride
        counts_row = output_bin_counts_ptr + state * output_bin_counts_stride
        for start in range(begin, end, TILE):
            pos = start + tl.arange(0, TILE)
            in_prompt = pos < tl.minimum(prompt_len, end)
            in_output = (pos >= prompt_len) & (pos < tl.minimum(prefill_len, end))
            tok = tl.load(tokens_row + pos, mask=in_prompt | in_output, other=0)
            one = tl.full([TILE], 1, tl.int32)
            tl.atomic_or(mask_row + tok // 32, one << (tok % 32), mask=in_prompt)
            tl.atomic_add(counts_row + tok, one, mask=in_output)


def bincount(
    grid: Grid,
    expanded_idx_mapping_ptr: torch.Tensor,
    all_token_ids_ptr: torch.Tensor,
    all_token_ids_stride: int,
    prompt_len_ptr: torch.Tensor,
    prefill_len_ptr: torch.Tensor,
    prompt_bin_mask_ptr: torch.Tensor,
    prompt_bin_mask_stride: int,
    output_bin_counts_ptr: torch.Tensor,
    output_bin_counts_stride: int,
    BLOCK_SIZE: int,
) -> None:
    num_tokens, num_blocks = grid_dim(grid, 0), grid_dim(grid, 1)
    if num_tokens == 0 or num_blocks == 0:
        return
    device = all_token_ids_ptr.device
    geometry = _geometry.geometry(device)
    covered = num_blocks * BLOCK_SIZE
    tile = min(BLOCK_SIZE, ub_cap(device, 16 if IS_INTERPRETED else 2048, 4))
    chunks, chunk = geometry.column_split(num_tokens, covered, tile)
    _bincount_kernel[(geometry.programs(num_tokens * chunks),)](
        expanded_idx_mapping_ptr,
        all_token_ids_ptr,
        all_token_ids_stride,
        prompt_len_ptr,
        prefill_len_ptr,
        prompt_bin_mask_ptr,
        prompt_bin_mask_stride,
        output_bin_counts_ptr,
        output_bin_counts_stride,
        num_tokens,
        covered,
        chunks,
        chunk,
        BLOCK_SIZE=BLOCK_SIZE,
        TILE=tile,
    )


@triton.jit
def _penalize_tile(
    row,
    counts_row,
    mask_row,
    first_draft,
    pos,
    first_word,
    end,
    rep,
    freq,
    pres,
    use_rep,
    WORDS: tl.constexpr,
):
    """Columns ``[32 first_word, 32 (first_word + WORDS))`` below ``end`` of one row, as a
    ``[WORDS, 32]`` block: column ``32 w + b`` is bit ``b`` of prompt-bitmask word ``w``."""
    words = first_word + tl.arange(0, WORDS)
    bits = tl.arange(0, 32)
    cols = words[:, None] * 32 + bits[None, :]
    valid = cols < end
    x = tl.load(row + cols, mask=valid, other=0.0).to(tl.float32)
    counts = tl.load(counts_row + cols, mask=valid, other=0)
    for k in range(0, pos):
        counts += (cols == tl.load(first_draft + k)).to(tl.int32)
    seen = counts > 0
    if use_rep:
        packed = tl.load(mask_row + words, mask=words * 32 < end, other=0)
        in_prompt = ((packed[:, None] >> bits[None, :]) & 1) != 0
        scale = tl.where(in_prompt | seen, rep, 1.0)
        x = x * tl.where(x > 0, 1.0 / scale, scale)
    x = x - freq * counts.to(tl.float32)
    x = x - pres * seen.to(tl.float32)
    tl.store(row + cols, x.to(row.dtype.element_ty), mask=valid)


@triton.jit
def _penalize_chunk(
    token,
    part,
    logits_ptr,
    logits_stride,
    idx_mapping_ptr,
    token_ids_ptr,
    local_pos_ptr,
    repetition_penalty_ptr,
    frequency_penalty_ptr,
    presence_penalty_ptr,
    prompt_bin_mask_ptr,
    prompt_bin_mask_stride,
    output_bin_counts_ptr,
    output_bin_counts_stride,
    width,
    chunk,
    WORDS: tl.constexpr,
    ONE_TILE: tl.constexpr,
):
    """Chunk ``part`` (``chunk`` columns, a multiple of the tile) of a token's row."""
    state = tl.load(idx_mapping_ptr + token).to(tl.int64)
    rep = tl.load(repetition_penalty_ptr + state).to(tl.float32)
    freq = tl.load(frequency_penalty_ptr + state).to(tl.float32)
    pres = tl.load(presence_penalty_ptr + state).to(tl.float32)
    use_rep = rep != 1.0
    if use_rep | (freq != 0.0) | (pres != 0.0):
        begin = part * chunk
        end = tl.minimum(begin + chunk, width)
        pos = tl.load(local_pos_ptr + token)
        first_draft = token_ids_ptr + tl.cast(token, tl.int64) - pos + 1
        row = logits_ptr + tl.cast(token, tl.int64) * logits_stride
        counts_row = output_bin_counts_ptr + state * output_bin_counts_stride
        mask_row = prompt_bin_mask_ptr + state * prompt_bin_mask_stride
        # begin is a multiple of the tile (WORDS * 32 columns): the tiles start on a word.
        if ONE_TILE:
            _penalize_tile(
                row, counts_row, mask_row, first_draft, pos, begin // 32, end, rep, freq, pres, use_rep, WORDS
            )
        else:
            for first_word in range(begin // 32, tl.cdiv(end, 32), WORDS):
                _penalize_tile(
                    row,
                    counts_row,
                    mask_row,
                    first_draft,
                    pos,
                    first_word,
                    end,
                    rep,
                    freq,
                    pres,
                    use_rep,
                    WORDS,
                )


@triton.jit
def _penalties_kernel(
    logits_ptr,
    logits_stride,
    idx_mapping_ptr,
    token_ids_ptr,
    local_pos_ptr,
    repetition_penalty_ptr,
    frequency_penalty_ptr,
    presence_penalty_ptr,
    prompt_bin_mask_ptr,
    prompt_bin_mask_stride,
    output_bin_counts_ptr,
    output_bin_counts_stride,
    num_tokens,
    width,
    chunks,
    chunk,
    WORDS: tl.constexpr,
    PER_ITEM: tl.constexpr,
):
    if PER_ITEM:  # the grid is (num_tokens, chunks) and a chunk one tile: program (token, tile), vLLM's
        _penalize_chunk(
            tl.program_id(0),
            tl.program_id(1),
            logits_ptr,
            logits_stride,
            idx_mapping_ptr,
            token_ids_ptr,
            local_pos_ptr,
            repetition_penalty_ptr,
            frequency_penalty_ptr,
            presence_penalty_ptr,
            prompt_bin_mask_ptr,
            prompt_bin_mask_stride,
            output_bin_counts_ptr,
            output_bin_counts_stride,
            width,
            chunk,
            WORDS,
            True,
        )
    else:  # 2-D grid-stride: tokens along axis 0, each token's chunks along axis 1
        for token in range(tl.program_id(0), num_tokens, tl.num_programs(0)):
            for part in range(tl.program_id(1), chunks, tl.num_programs(1)):
                _penalize_chunk(
                    token,
                    part,
                    logits_ptr,
                    logits_stride,
                    idx_mapping_ptr,
                    token_ids_ptr,
                    local_pos_ptr,
                    repetition_penalty_ptr,
                    frequency_penalty_ptr,
                    presence_penalty_ptr,
                    prompt_bin_mask_ptr,
                    prompt_bin_mask_stride,
                    output_bin_counts_ptr,
                    output_bin_counts_stride,
                    width,
                    chunk,
                    WORDS,
                    False,
                )


#: Penalties tile caps (columns) per launch backend: vLLM's 8192-column block on CUDA; Ascend's 4096,
#: then bounded by the UB; a few words under the interpreter, so the test shapes take several tiles.
PENALTIES_TILE = {"cuda": 8192, "npu": 4096, "interpreter": 32}
#: Warps of a penalties program on CUDA (vLLM launches its own with Triton's default, 4).
PENALTIES_WARPS = 4


def penalties(
    grid: Grid,
    logits_ptr: torch.Tensor,
    logits_stride: int,
    expanded_idx_mapping_ptr: torch.Tensor,
    token_ids_ptr: torch.Tensor,
    expanded_local_pos_ptr: torch.Tensor,
    repetition_penalty_ptr: torch.Tensor,
    frequency_penalty_ptr: torch.Tensor,
    presence_penalty_ptr: torch.Tensor,
    prompt_bin_mask_ptr: torch.Tensor,
    prompt_bin_mask_stride: int,
    output_bin_counts_ptr: torch.Tensor,
    output_bin_counts_stride: int,
    vocab_size: int,
    BLOCK_SIZE: int,
) -> None:
    num_tokens = grid_dim(grid, 0)
    width = min(vocab_size, grid_dim(grid, 1) * BLOCK_SIZE)
    if num_tokens == 0 or width <= 0:
        return
    device = logits_ptr.device
    geometry = _geometry.geometry(device)
    cap = PENALTIES_TILE["interpreter" if IS_INTERPRETED else geometry.backend]
    tile = max(32, min(next_power_of_2(width), ub_cap(device, cap, 6)))
    chunks, chunk = geometry.column_split(num_tokens, width, tile)
    programs = geometry.programs_2d(num_tokens, chunks)
    _penalties_kernel[programs](
        logits_ptr,
        logits_stride,
        expanded_idx_mapping_ptr,
        token_ids_ptr,
        expanded_local_pos_ptr,
        repetition_penalty_ptr,
        frequency_penalty_ptr,
        presence_penalty_ptr,
        prompt_bin_mask_ptr,
        prompt_bin_mask_stride,
        output_bin_counts_ptr,
        output_bin_counts_stride,
        num_tokens,
        width,
        chunks,
        chunk,
        WORDS=tile // 32,
        PER_ITEM=programs == (num_tokens, chunks) and chunk == tile,
        **geometry.launch(PENALTIES_WARPS),
    )
