"""Overrides of the kernels of vLLM's ``vllm/v1/worker/gpu/sample/watermark.py`` (Gumbel watermarking:
the repeated-context mask and the Philox4x32-10 keyed Gumbel-max sampling), with a torch Philox stream.

The watermark noise of token ``k`` after context ``c`` under key ``K`` is a counter-based function of
``(K, c, k)``: :func:`philox4x32_10_torch` reproduces vLLM's Philox4x32-10 bit for bit (uint32
arithmetic emulated in int64), :func:`philox_context_state_torch` / :func:`philox_token_words_torch`
the context absorption and the per-token words, :func:`philox_uniform_torch` the kernel's uniform
(exact), so a detector keyed like vLLM's sees the same watermark.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from vllm_ascend.kernels.v2._launch import Grid, dispatch_v2, grid_dim
from vllm_ascend.kernels.v2.sample_gumbel import DRAFT_NOISE_SALT, gumbel_noise_torch

_VLLM = "vllm.v1.worker.gpu.sample.watermark"

U32 = 0xFFFFFFFF
PHILOX_M0 = 0xD2511F53
PHILOX_M1 = 0xCD9E8D57
PHILOX_W0 = 0x9E3779B9
PHILOX_W1 = 0xBB67AE85
#: Domain words of the context absorption and of the per-token draw (vLLM's ``_CONTEXT_DOMAIN`` /
#: ``_TOKEN_DOMAIN``).
CONTEXT_DOMAIN = 0x574D4358
TOKEN_DOMAIN = 0x574D544B


def _flat(t: torch.Tensor) -> torch.Tensor:
    """A 1-D view from ``t``'s first element to the end of its storage: what ``ptr + offset`` addresses."""
    offset = t.storage_offset()
    return t.as_strided((t.untyped_storage().nbytes() // t.element_size() - offset,), (1,), offset)


def _mulhilo32(multiplier: int, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """High and low words of ``multiplier * value`` (``value`` in ``[0, 2**32)`` as int64), through
    16-bit halves so that no int64 product overflows."""
    m_lo, m_hi = multiplier & 0xFFFF, multiplier >> 16
    v_lo, v_hi = value & 0xFFFF, value >> 16
    low = v_lo * m_lo
    middle = v_hi * m_lo + v_lo * m_hi
    low_sum = low + ((middle & 0xFFFF) << 16)
    high = (v_hi * m_hi + (middle >> 16) + (low_sum >> 32)) & U32
    return high, low_sum & U32


def philox4x32_10_torch(
    counter: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    key: tuple[torch.Tensor, torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Philox4x32-10 of ``counter`` under ``key`` (words as int64 in ``[0, 2**32)``, broadcasting)."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for round_index in range(10):
        hi0, lo0 = _mulhilo32(PHILOX_M0, c0)
        hi1, lo1 = _mulhilo32(PHILOX_M1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        if round_index != 9:
            k0 = (k0 + PHILOX_W0) & U32
            k1 = (k1 + PHILOX_W1) & U32
    return c0, c1, c2, c3


def philox_context_state_torch(
    contexts: torch.Tensor, key_0: int, key_1: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The Philox state after absorbing each row of ``contexts`` (``[rows, width]`` token ids, -1 for
    padding, taken as uint32) four words at a time, missing words ``2**32 - 1 - i``."""
    rows, width = contexts.shape
    words = contexts.to(torch.int64) & U32

    def full(value: int) -> torch.Tensor:
        return torch.full((rows,), value, dtype=torch.int64, device=contexts.device)

    state = (full(CONTEXT_DOMAIN), full(width & U32), full(0), full(0))
    k1 = full(key_1 & U32)
    for offset in range(0, width, 4):
        block = [words[:, offset + i] if offset + i < width else full(U32 - i) for i in range(4)]
        counter = (state[0] ^ block[0], state[1] ^ block[1], state[2] ^ block[2], state[3] ^ block[3])
        state = philox4x32_10_torch(counter, (full((key_0 ^ offset) & U32), k1))
    return state


def philox_token_words_torch(
    state: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    key_0: int,
    key_1: int,
    tokens: torch.Tensor,
) -> torch.Tensor:
    """The Philox word of each token id (``[rows, n]``) after the per-row context ``state``: word
    ``token % 4`` of the draw at counter ``(token // 4, state[0], state[1], state[2])``."""
    s0, s1, s2, s3 = (word[:, None] for word in state)
    groups = (tokens.to(torch.int64) & U32) >> 2
    out = philox4x32_10_torch(
        (groups, s0, s1, s2), ((s3 ^ key_0) & U32, (s3 * 0) + ((key_1 ^ TOKEN_DOMAIN) & U32))
    )
    lane = tokens.to(torch.int64) & 3
    word = out[0]
    for i in range(1, 4):
        word = torch.where(lane == i, out[i], word)
    return word


def philox_uniform_torch(words: torch.Tensor) -> torch.Tensor:
    """The kernel's uniform of a Philox word: the float32 just below ``((word >> 8) + 1) * 2**-24``."""
    scaled = (((words & U32) >> 8) + 1).to(torch.float32) * 2.0**-24
    return (scaled.view(torch.int32) - 1).view(torch.float32)


def _leftmost_block_max(
    values: torch.Tensor, num_blocks: int, block: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per block of ``block`` columns: the max and the token id of its leftmost occurrence."""
    blocks = values.reshape(values.shape[0], num_blocks, block)
    value = blocks.amax(dim=-1)
    first = (blocks == value[..., None]).to(torch.int8).argmax(dim=-1)
    return value, first + torch.arange(num_blocks, device=values.device)[None, :] * block


def philox_gumbel_torch(
    grid: Grid,
    local_argmax_ptr: torch.Tensor,
    local_argmax_stride: int,
    local_max_ptr: torch.Tensor,
    local_max_stride: int,
    logits_ptr: torch.Tensor,
    logits_stride: int,
    contexts_ptr: torch.Tensor,
    context_stride: int,
    skip_mask_ptr: torch.Tensor | None,
    expanded_idx_mapping_ptr: torch.Tensor | None,
    seeds_ptr: torch.Tensor | None,
    pos_ptr: torch.Tensor | None,
    temp_ptr: torch.Tensor | None,
    logits_cache_ptr: torch.Tensor | None,
    logits_cache_stride_0: int,
    logits_cache_stride_1: int,
    logits_cache_col_ptr: torch.Tensor | None,
    logits_cache_source_ptr: torch.Tensor | None,
    logits_cache_source_stride: int,
    key_0_value: int,
    key_1_value: int,
    vocab_size: int,
    CONTEXT_WIDTH: int,
    BLOCK_SIZE: int,
    USE_FP64: bool,
    IS_DRAFTING: bool,
    PER_TOKEN_COL: bool,
) -> None:
    """Reference of :func:`philox_gumbel`."""
    rows, num_blocks = grid_dim(grid, 0), grid_dim(grid, 1)
    if rows == 0 or num_blocks == 0:
        return
    device = logits_ptr.device
    width = num_blocks * BLOCK_SIZE
    covered = max(0, min(vocab_size, width))
    row_ids = torch.arange(rows, device=device)
    if expanded_idx_mapping_ptr is not None:
        req = expanded_idx_mapping_ptr[:rows].long()
    else:
        req = row_ids
    valid = req >= 0

    if logits_cache_ptr is not None and covered:
        assert logits_cache_col_ptr is not None and logits_cache_source_ptr is not None
        col = (
            logits_cache_col_ptr.reshape(-1)[:rows] if PER_TOKEN_COL else logits_cache_col_ptr.reshape(-1)[:1]
        )
        col = col.long().expand(rows)
        source = _flat(logits_cache_source_ptr)[
            row_ids[:, None] * logits_cache_source_stride + torch.arange(covered, device=device)[None, :]
        ]
        cache = _flat(logits_cache_ptr)
        index = (
            req[valid, None] * logits_cache_stride_0
            + col[valid, None] * logits_cache_stride_1
            + torch.arange(covered, device=device)[None, :]
        )
        cache[index] = source[valid].to(cache.dtype)

    tokens = torch.arange(width, device=device)
    logits = torch.full((rows, width), float("-inf"), dtype=torch.float32, device=device)
    if covered:
        logits[:, :covered] = _flat(logits_ptr)[
            row_ids[:, None] * logits_stride + torch.arange(covered, device=device)[None, :]
        ].float()
    out_dtype = local_max_ptr.dtype
    values = torch.empty((rows, width), dtype=torch.float64 if USE_FP64 else torch.float32, device=device)
    skip = torch.zeros(rows, dtype=torch.bool, device=device)
    if skip_mask_ptr is not None:
        skip = skip_mask_ptr[:rows].to(torch.bool)

    keyed = (~skip).nonzero().flatten()
    if keyed.numel():
        contexts = _flat(contexts_ptr)[
            keyed[:, None] * context_stride + torch.arange(CONTEXT_WIDTH, device=device)[None, :]
        ]
        key_0, key_1 = key_0_value & U32, key_1_value & U32
        state = philox_context_state_torch(contexts, key_0, key_1)
        words = philox_token_words_torch(state, key_0, key_1, tokens[None, :].expand(keyed.numel(), width))
        uniform = philox_uniform_torch(words)
        keyed_logits = torch.where(torch.isnan(logits[keyed]), float("-inf"), logits[keyed])
        values[keyed] = (keyed_logits - torch.log(-torch.log(uniform))).to(values.dtype)

    sampled = skip.nonzero().flatten()
    if sampled.numel():
        assert seeds_ptr is not None and pos_ptr is not None and temp_ptr is not None
        live = valid[sampled]
        safe = req[sampled].clamp_min(0)
        temp = torch.where(live, temp_ptr[safe].float(), torch.zeros((), device=device))
        seed = torch.where(live, seeds_ptr[safe].long(), torch.zeros((), dtype=torch.int64, device=device))
        pos = pos_ptr[sampled].long() + (DRAFT_NOISE_SALT if IS_DRAFTING else 0)
        plain = logits[sampled].to(values.dtype)
        noise = gumbel_noise_torch(seed[:, None], pos[:, None], tokens[None, :], use_fp64=USE_FP64)
        noised = torch.where((tokens < vocab_size)[None, :], plain + noise, float("-inf"))
        values[sampled] = torch.where((temp != 0.0)[:, None], noised, plain)

    # Both paths keep the leftmost (lowest token id) maximum of each block.
    value, token = _leftmost_block_max(values.nan_to_num(nan=float("-inf")), num_blocks, BLOCK_SIZE)
    argmax_rows = _flat(local_argmax_ptr)
    max_rows = _flat(local_max_ptr)
    cells = row_ids[:, None] * local_argmax_stride + torch.arange(num_blocks, device=device)[None, :]
    argmax_rows[cells] = token.to(local_argmax_ptr.dtype)
    cells = row_ids[:, None] * local_max_stride + torch.arange(num_blocks, device=device)[None, :]
    max_rows[cells] = value.to(out_dtype)


def philox_gumbel(
    grid: Grid,
    local_argmax_ptr: torch.Tensor,
    local_argmax_stride: int,
    local_max_ptr: torch.Tensor,
    local_max_stride: int,
    logits_ptr: torch.Tensor,
    logits_stride: int,
    contexts_ptr: torch.Tensor,
    context_stride: int,
    skip_mask_ptr: torch.Tensor | None,
    expanded_idx_mapping_ptr: torch.Tensor | None,
    seeds_ptr: torch.Tensor | None,
    pos_ptr: torch.Tensor | None,
    temp_ptr: torch.Tensor | None,
    logits_cache_ptr: torch.Tensor | None,
    logits_cache_stride_0: int,
    logits_cache_stride_1: int,
    logits_cache_col_ptr: torch.Tensor | None,
    logits_cache_source_ptr: torch.Tensor | None,
    logits_cache_source_stride: int,
    key_0_value: int,
    key_1_value: int,
    vocab_size: int,
    CONTEXT_WIDTH: int,
    BLOCK_SIZE: int,
    USE_FP64: bool,
    IS_DRAFTING: bool,
    PER_TOKEN_COL: bool,
) -> None:
    """Per-block candidates of watermarked Gumbel-max sampling: for row ``t < grid[0]`` and vocabulary
    block ``b < grid[1]`` (``BLOCK_SIZE`` ids), ``local_argmax[t, b]`` / ``local_max[t, b]`` = the
    leftmost argmax and max of ``logits - log(-log(u))`` (NaN logits as ``-inf``), ``u`` the Philox
    uniform of (key, the row's ``CONTEXT_WIDTH`` context ids, token id). Rows flagged in ``skip_mask``
    take vLLM's ordinary seeded Gumbel draw instead (no temperature division; plain argmax at
    temperature 0). With a logits cache, the row's source logits are also copied to
    ``logits_cache[req, col]`` (rows with a negative request skipped)."""
    impl = dispatch_v2("sample_watermark", "philox_gumbel", philox_gumbel_torch, logits_ptr.device)
    impl(
        grid,
        local_argmax_ptr,
        local_argmax_stride,
        local_max_ptr,
        local_max_stride,
        logits_ptr,
        logits_stride,
        contexts_ptr,
        context_stride,
        skip_mask_ptr,
        expanded_idx_mapping_ptr,
        seeds_ptr,
        pos_ptr,
        temp_ptr,
        logits_cache_ptr,
        logits_cache_stride_0,
        logits_cache_stride_1,
        logits_cache_col_ptr,
        logits_cache_source_ptr,
        logits_cache_source_stride,
        key_0_value,
        key_1_value,
        vocab_size,
        CONTEXT_WIDTH,
        BLOCK_SIZE,
        USE_FP64,
        IS_DRAFTING,
        PER_TOKEN_COL,
    )


def repeated_context_mask_torch(
    grid: Grid,
    output_ptr: torch.Tensor,
    all_token_ids_ptr: torch.Tensor,
    all_token_ids_stride: int,
    req_indices_ptr: torch.Tensor,
    prompt_lens_ptr: torch.Tensor,
    total_lens_ptr: torch.Tensor,
    history_offsets_ptr: torch.Tensor | None,
    history_offsets_stride: int,
    contexts_ptr: torch.Tensor,
    context_stride: int,
    local_positions_ptr: torch.Tensor | None,
    prior_contexts_ptr: torch.Tensor | None,
    prior_contexts_stride_0: int,
    prior_contexts_stride_1: int,
    steps_ptr: torch.Tensor | None,
    steps_stride: int,
    enabled_ptr: torch.Tensor | None,
    CONTEXT_WIDTH: int,
    NUM_SPECULATIVE_STEPS: int,
    MAX_HISTORY: int,
    INCLUDE_PROMPT: bool,
    SKIP_PARTIAL_CONTEXT: bool,
    HAS_HISTORY_OFFSETS: bool,
    SPECULATIVE_CONTEXTS: bool,
    DRAFT_CONTEXTS: bool,
    BLOCK: int,
) -> None:
    """Reference of :func:`repeated_context_mask`."""
    rows = grid_dim(grid, 0)
    if rows == 0:
        return
    device = contexts_ptr.device
    width = CONTEXT_WIDTH
    row_ids = torch.arange(rows, device=device)
    contexts = _flat(contexts_ptr)[
        row_ids[:, None] * context_stride + torch.arange(width, device=device)[None, :]
    ]
    contexts = contexts.long()
    req = req_indices_ptr[:rows].long()
    live = req >= 0
    safe = req.clamp_min(0)
    prompt_len = prompt_lens_ptr[safe].long()
    total_len = total_lens_ptr[safe].long()
    partial_skip = live & (total_len - prompt_len < width) if SKIP_PARTIAL_CONTEXT else torch.zeros_like(live)
    scanned = live & ~partial_skip
    sequence_start = torch.zeros_like(prompt_len) if INCLUDE_PROMPT else prompt_len
    history_len = total_len - sequence_start
    if HAS_HISTORY_OFFSETS:
        assert history_offsets_ptr is not None
        history_offset = _flat(history_offsets_ptr)[row_ids * history_offsets_stride].long()
    else:
        history_offset = torch.zeros_like(req)
    scan_start = torch.zeros_like(req)
    if MAX_HISTORY > 0:
        scan_start = (history_len - (MAX_HISTORY - history_offset).clamp_min(0)).clamp_min(0)

    # History: position p matches when the ``width`` tokens before it (-1 before the history start)
    # equal the row's context.
    tokens = _flat(all_token_ids_ptr)
    repeated = torch.zeros(rows, dtype=torch.bool, device=device)
    for row in scanned.nonzero().flatten().tolist():
        length = int(history_len[row])
        lo = int(scan_start[row])
        if length <= lo:
            continue
        begin = int(req[row]) * all_token_ids_stride + int(sequence_start[row])
        padded = torch.cat(
            [
                torch.full((width,), -1, dtype=torch.int64, device=device),
                tokens[begin : begin + length].long(),
            ]
        )
        windows = padded.unfold(0, width, 1)[lo:length] if width else padded.new_zeros((length - lo, 0))
        repeated[row] = bool((windows == contexts[row][None, :]).all(dim=1).any())

    partial_context = (contexts < 0).any(dim=1)
    if SPECULATIVE_CONTEXTS:
        assert local_positions_ptr is not None
        local_pos = local_positions_ptr[:rows].long()
        if INCLUDE_PROMPT:
            repeated |= partial_context
        for offset in range(1, NUM_SPECULATIVE_STEPS + 1):
            if MAX_HISTORY > 0 and offset > MAX_HISTORY:
                break
            prior = row_ids - offset
            in_history = (prior >= 0) & (local_pos >= offset)
            prior = prior.clamp_min(0)
            repeated |= (
                in_history
                & (req == req[prior])
                & (local_pos == local_pos[prior] + offset)
                & (contexts == contexts[prior]).all(dim=1)
            )

    if DRAFT_CONTEXTS:
        assert prior_contexts_ptr is not None and steps_ptr is not None and enabled_ptr is not None
        step = _flat(steps_ptr)[row_ids * steps_stride].long()
        if INCLUDE_PROMPT:
            repeated |= partial_context
        prior_flat = _flat(prior_contexts_ptr)
        columns = torch.arange(width, device=device)[None, :]
        for prior_step in range(NUM_SPECULATIVE_STEPS):
            in_history = prior_step < step
            if MAX_HISTORY > 0:
                in_history &= prior_step >= step - MAX_HISTORY
            prior = prior_flat[
                row_ids[:, None] * prior_contexts_stride_0 + prior_step * prior_contexts_stride_1 + columns
            ]
            repeated |= in_history & (contexts == prior.long()).all(dim=1)
        written = scanned.nonzero().flatten()
        prior_flat[
            written[:, None] * prior_contexts_stride_0
            + step[written, None] * prior_contexts_stride_1
            + columns
        ] = contexts[written].to(prior_flat.dtype)
        repeated = enabled_ptr[:rows].to(torch.bool) & ~repeated

    result = torch.where(partial_skip, True, repeated) & live
    output_ptr[:rows] = result.to(output_ptr.dtype)


def repeated_context_mask(
    grid: Grid,
    output_ptr: torch.Tensor,
    all_token_ids_ptr: torch.Tensor,
    all_token_ids_stride: int,
    req_indices_ptr: torch.Tensor,
    prompt_lens_ptr: torch.Tensor,
    total_lens_ptr: torch.Tensor,
    history_offsets_ptr: torch.Tensor | None,
    history_offsets_stride: int,
    contexts_ptr: torch.Tensor,
    context_stride: int,
    local_positions_ptr: torch.Tensor | None,
    prior_contexts_ptr: torch.Tensor | None,
    prior_contexts_stride_0: int,
    prior_contexts_stride_1: int,
    steps_ptr: torch.Tensor | None,
    steps_stride: int,
    enabled_ptr: torch.Tensor | None,
    CONTEXT_WIDTH: int,
    NUM_SPECULATIVE_STEPS: int,
    MAX_HISTORY: int,
    INCLUDE_PROMPT: bool,
    SKIP_PARTIAL_CONTEXT: bool,
    HAS_HISTORY_OFFSETS: bool,
    SPECULATIVE_CONTEXTS: bool,
    DRAFT_CONTEXTS: bool,
    BLOCK: int,
) -> None:
    """Per row ``t < grid[0]`` (request ``req_indices[t]``; negative: ``output[t] = 0``): whether its
    ``CONTEXT_WIDTH``-token context already occurred in the request's history (the generated tokens, or
    all with ``INCLUDE_PROMPT``; the last ``MAX_HISTORY - history_offset`` positions when
    ``MAX_HISTORY > 0``), 1 for too-short outputs with ``SKIP_PARTIAL_CONTEXT``. With
    ``SPECULATIVE_CONTEXTS``, also when an earlier row of the same speculative block had the same
    context (or, with ``INCLUDE_PROMPT``, the context holds padding). With ``DRAFT_CONTEXTS``, also when
    one of the row's earlier draft steps (``prior_contexts``) had it; the row's context is then saved
    at its ``step`` and the output is ``enabled & not repeated``."""
    impl = dispatch_v2(
        "sample_watermark", "repeated_context_mask", repeated_context_mask_torch, contexts_ptr.device
    )
    impl(
        grid,
        output_ptr,
        all_token_ids_ptr,
        all_token_ids_stride,
        req_indices_ptr,
        prompt_lens_ptr,
        total_lens_ptr,
        history_offsets_ptr,
        history_offsets_stride,
        contexts_ptr,
        context_stride,
        local_positions_ptr,
        prior_contexts_ptr,
        prior_contexts_stride_0,
        prior_contexts_stride_1,
        steps_ptr,
        steps_stride,
        enabled_ptr,
        CONTEXT_WIDTH,
        NUM_SPECULATIVE_STEPS,
        MAX_HISTORY,
        INCLUDE_PROMPT,
        SKIP_PARTIAL_CONTEXT,
        HAS_HISTORY_OFFSETS,
        SPECULATIVE_CONTEXTS,
        DRAFT_CONTEXTS,
        BLOCK,
    )


OVERRIDES: dict[str, Callable[..., Any]] = {
    f"{_VLLM}._repeated_context_mask_kernel": repeated_context_mask,
    f"{_VLLM}._philox_gumbel_kernel": philox_gumbel,
}
