"""Ascend Triton kernels of :mod:`vllm_ascend.kernels.v2.input_batch`.

The requests are walked grid-stride by the device's grid (``_geometry``: one program per vector core on
Ascend; one per request on CUDA, as vLLM launches them), copying token runs in UB-bounded tiles; kernels
whose per-request work is a scalar or two walk tiles of requests (on CUDA, ``get_num_sampled_and_rejected``
runs a program per request, as vLLM).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_ascend.kernels import _geometry
from vllm_ascend.kernels._triton.common import IS_INTERPRETED, ub_cap
from vllm_ascend.kernels.v2._launch import Grid, cdiv, grid_dim, next_power_of_2

_TILE = 4 if IS_INTERPRETED else 1024


def _tile(device: torch.device, cap: int = _TILE) -> int:
    return ub_cap(device, min(cap, _TILE), live_tiles=2)


@triton.jit
def _pos_seq_lens_kernel(
    pos_ptr,
    seq_lens_ptr,
    idx_mapping_ptr,
    query_start_loc_ptr,
    num_computed_tokens_ptr,
    num_reqs,
    max_num_reqs,
    BLOCK: tl.constexpr,
):
    # Requests grid-stride; the last program also zeroes the padded sequence lengths (on a grid of a
    # program per item, vLLM's, it has no request of its own).
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    for req in range(pid, num_reqs, programs):
        state = tl.load(idx_mapping_ptr + req)
        computed = tl.load(num_computed_tokens_ptr + state)
        start = tl.load(query_start_loc_ptr + req)
        query_len = tl.load(query_start_loc_ptr + req + 1) - start
        tl.store(seq_lens_ptr + req, computed + query_len)
        for i in range(0, query_len, BLOCK):
            offs = i + tl.arange(0, BLOCK)
            tl.store(pos_ptr + start + offs, computed + offs, mask=offs < query_len)
    if pid == programs - 1:
        for i in range(num_reqs, max_num_reqs, BLOCK):
            offs = i + tl.arange(0, BLOCK)
            tl.store(seq_lens_ptr + offs, tl.zeros([BLOCK], dtype=tl.int32), mask=offs < max_num_reqs)


def prepare_pos_seq_lens(
    grid: Grid,
    pos_ptr: torch.Tensor,
    seq_lens_ptr: torch.Tensor,
    idx_mapping_ptr: torch.Tensor,
    query_start_loc_ptr: torch.Tensor,
    num_computed_tokens_ptr: torch.Tensor,
    max_num_reqs: int,
    BLOCK_SIZE: int,
) -> None:
    num_reqs = grid_dim(grid, 0) - 1
    programs = _geometry.programs(pos_ptr.device, num_reqs + 1)
    _pos_seq_lens_kernel[(programs,)](
        pos_ptr,
        seq_lens_ptr,
        idx_mapping_ptr,
        query_start_loc_ptr,
        num_computed_tokens_ptr,
        num_reqs,
        max_num_reqs,
        BLOCK=min(BLOCK_SIZE, 256),
    )


@triton.jit
def _prefill_request(
    req,
    input_ids_ptr,
    next_prefill_tokens_ptr,
    next_prefill_tokens_stride,
    num_lookahead,
    idx_mapping_ptr,
    query_start_loc_ptr,
    all_token_ids_ptr,
    all_token_ids_stride,
    prefill_lens_ptr,
    num_computed_tokens_ptr,
    TILE: tl.constexpr,
    LOOKAHEAD_TILE: tl.constexpr,
    ONE_LOOKAHEAD_TILE: tl.constexpr,
):
    # A request still inside its prompt copies its chunk's prompt tokens and the ``num_lookahead`` prompt
    # tokens after the chunk (0 past the prompt): one tile of them where ONE_LOOKAHEAD_TILE (the host saw
    # num_lookahead <= LOOKAHEAD_TILE; vLLM's one block), else a loop of tiles.
    state = tl.load(idx_mapping_ptr + req)
    prefill_len = tl.load(prefill_lens_ptr + state)
    computed = tl.load(num_computed_tokens_ptr + state)
    if computed < prefill_len:
        start = tl.load(query_start_loc_ptr + req)
        query_len = tl.load(query_start_loc_ptr + req + 1) - start
        row = all_token_ids_ptr + state.to(tl.int64) * all_token_ids_stride
        for i in range(0, query_len, TILE):
            offs = i + tl.arange(0, TILE)
            inside = offs < query_len
            tokens = tl.load(row + computed + offs, mask=inside, other=0)
            tl.store(input_ids_ptr + start + offs, tokens, mask=inside)
        if ONE_LOOKAHEAD_TILE:
            k = tl.arange(0, LOOKAHEAD_TILE)
            wanted = k < num_lookahead
            pos = computed + query_len + k
            tokens = tl.load(row + pos, mask=wanted & (pos < prefill_len), other=0)
            tl.store(next_prefill_tokens_ptr + k * next_prefill_tokens_stride + state, tokens, mask=wanted)
        else:
            for k0 in range(0, num_lookahead, LOOKAHEAD_TILE):
                k = k0 + tl.arange(0, LOOKAHEAD_TILE)
                wanted = k < num_lookahead
                pos = computed + query_len + k
                tokens = tl.load(row + pos, mask=wanted & (pos < prefill_len), other=0)
                tl.store(
                    next_prefill_tokens_ptr + k * next_prefill_tokens_stride + state, tokens, mask=wanted
                )


@triton.jit
def _prefill_inputs_kernel(
    input_ids_ptr,
    next_prefill_tokens_ptr,
    next_prefill_tokens_stride,
    num_lookahead,
    idx_mapping_ptr,
    query_start_loc_ptr,
    all_token_ids_ptr,
    all_token_ids_stride,
    prefill_lens_ptr,
    num_computed_tokens_ptr,
    num_reqs,
    TILE: tl.constexpr,
    LOOKAHEAD_TILE: tl.constexpr,
    PER_ITEM: tl.constexpr,
    ONE_LOOKAHEAD_TILE: tl.constexpr,
):
    if PER_ITEM:  # a program per request (CUDA, vLLM's grid)
        _prefill_request(
            tl.program_id(0),
            input_ids_ptr,
            next_prefill_tokens_ptr,
            next_prefill_tokens_stride,
            num_lookahead,
            idx_mapping_ptr,
            query_start_loc_ptr,
            all_token_ids_ptr,
            all_token_ids_stride,
            prefill_lens_ptr,
            num_computed_tokens_ptr,
            TILE,
            LOOKAHEAD_TILE,
            ONE_LOOKAHEAD_TILE,
        )
    else:  # requests grid-stride (Ascend: a program per vector core)
        pid = tl.program_id(0)
        programs = tl.num_programs(0)
        for req in range(pid, num_reqs, programs):
            _prefill_request(
                req,
                input_ids_ptr,
                next_prefill_tokens_ptr,
                next_prefill_tokens_stride,
                num_lookahead,
                idx_mapping_ptr,
                query_start_loc_ptr,
                all_token_ids_ptr,
                all_token_ids_stride,
                prefill_lens_ptr,
                num_computed_tokens_ptr,
                TILE,
                LOOKAHEAD_TILE,
                False,
            )


def prepare_prefill_inputs(
    grid: Grid,
    input_ids_ptr: torch.Tensor,
    next_prefill_tokens_ptr: torch.Tensor,
    next_prefill_tokens_stride: int,
    num_lookahead: int,
    idx_mapping_ptr: torch.Tensor,
    query_start_loc_ptr: torch.Tensor,
    all_token_ids_ptr: torch.Tensor,
    all_token_ids_stride: int,
    prefill_lens_ptr: torch.Tensor,
    num_computed_tokens_ptr: torch.Tensor,
    BLOCK_SIZE: int,
    LOOKAHEAD_BLOCK: int,
) -> None:
    num_reqs = grid_dim(grid, 0)
    if num_reqs == 0:
        return
    device = input_ids_ptr.device
    per_item = _geometry.geometry(device).grid == "work"
    lookahead_tile = _tile(device, max(1, LOOKAHEAD_BLOCK))
    _prefill_inputs_kernel[(num_reqs if per_item else _geometry.programs(device, num_reqs),)](
        input_ids_ptr,
        next_prefill_tokens_ptr,
        next_prefill_tokens_stride,
        num_lookahead,
        idx_mapping_ptr,
        query_start_loc_ptr,
        all_token_ids_ptr,
        all_token_ids_stride,
        prefill_lens_ptr,
        num_computed_tokens_ptr,
        num_reqs,
        TILE=_tile(device, BLOCK_SIZE),
        LOOKAHEAD_TILE=lookahead_tile,
        PER_ITEM=per_item,
        ONE_LOOKAHEAD_TILE=per_item and num_lookahead <= lookahead_tile,
    )


@triton.jit
def _combine_request(
    req,
    input_ids_ptr,
    idx_mapping_ptr,
    last_sampled_tokens_ptr,
    query_start_loc_ptr,
    seq_lens_ptr,
    prefill_len_ptr,
    draft_tokens_ptr,
    draft_tokens_stride,
    cu_num_logits_ptr,
    logits_indices_ptr,
    MAX_SPAN: tl.constexpr,
    NEW_SAMPLED: tl.constexpr,
    TILE: tl.constexpr,
    ONE_TILE: tl.constexpr,
):
    # A request's logits are its last ``num_logits`` query tokens (at most MAX_SPAN written, as vLLM's
    # one-block kernel); past its prompt, the token before its drafts is the last sampled one (unless that
    # slot is still a prompt token) and its drafts follow. ONE_TILE (TILE >= MAX_SPAN): one tile each,
    # vLLM's code; else loops of tiles.
    state = tl.load(idx_mapping_ptr + req)
    logits_begin = tl.load(cu_num_logits_ptr + req)
    num_logits = tl.load(cu_num_logits_ptr + req + 1) - logits_begin
    query_end = tl.load(query_start_loc_ptr + req + 1)
    first_logit = query_end - num_logits
    if ONE_TILE:
        offs = tl.arange(0, TILE)
        inside = offs < num_logits
        if MAX_SPAN < TILE:
            inside = inside & (offs < MAX_SPAN)
        tl.store(logits_indices_ptr + logits_begin + offs, (first_logit + offs).to(tl.int64), mask=inside)
    else:
        written = tl.minimum(num_logits, MAX_SPAN)
        for i in range(0, written, TILE):
            offs = i + tl.arange(0, TILE)
            tl.store(
                logits_indices_ptr + logits_begin + offs,
                (first_logit + offs).to(tl.int64),
                mask=offs < written,
            )
    seq_len = tl.load(seq_lens_ptr + req)
    prefill_len = tl.load(prefill_len_ptr + state)
    if seq_len > prefill_len:
        if NEW_SAMPLED > 0:
            if seq_len - num_logits >= prefill_len:
                tl.store(input_ids_ptr + first_logit, tl.load(last_sampled_tokens_ptr + state))
        num_draft = num_logits - NEW_SAMPLED
        if ONE_TILE:
            if num_draft > 0:
                offs = tl.arange(0, TILE)
                inside = offs < num_draft
                if MAX_SPAN < TILE:
                    inside = inside & (offs < MAX_SPAN)
                # 32-bit row offset, as vLLM's: states x draft steps.
                tokens = tl.load(draft_tokens_ptr + state * draft_tokens_stride + offs, mask=inside, other=0)
                tl.store(input_ids_ptr + query_end - num_draft + offs, tokens, mask=inside)
        else:
            drafts = tl.minimum(num_draft, MAX_SPAN)
            row = draft_tokens_ptr + state.to(tl.int64) * draft_tokens_stride
            for i in range(0, drafts, TILE):
                offs = i + tl.arange(0, TILE)
                inside = offs < drafts
                tokens = tl.load(row + offs, mask=inside, other=0)
                tl.store(input_ids_ptr + query_end - num_draft + offs, tokens, mask=inside)


@triton.jit
def _combine_sampled_and_draft_kernel(
    input_ids_ptr,
    idx_mapping_ptr,
    last_sampled_tokens_ptr,
    query_start_loc_ptr,
    seq_lens_ptr,
    prefill_len_ptr,
    draft_tokens_ptr,
    draft_tokens_stride,
    cu_num_logits_ptr,
    logits_indices_ptr,
    num_reqs,
    MAX_SPAN: tl.constexpr,
    NEW_SAMPLED: tl.constexpr,
    TILE: tl.constexpr,
    PER_ITEM: tl.constexpr,
):
    if PER_ITEM:  # a program per request (CUDA, vLLM's grid)
        _combine_request(
            tl.program_id(0),
            input_ids_ptr,
            idx_mapping_ptr,
            last_sampled_tokens_ptr,
            query_start_loc_ptr,
            seq_lens_ptr,
            prefill_len_ptr,
            draft_tokens_ptr,
            draft_tokens_stride,
            cu_num_logits_ptr,
            logits_indices_ptr,
            MAX_SPAN,
            NEW_SAMPLED,
            TILE,
            MAX_SPAN <= TILE,
        )
    else:  # requests grid-stride (Ascend: a program per vector core)
        pid = tl.program_id(0)
        programs = tl.num_programs(0)
        for req in range(pid, num_reqs, programs):
            _combine_request(
                req,
                input_ids_ptr,
                idx_mapping_ptr,
                last_sampled_tokens_ptr,
                query_start_loc_ptr,
                seq_lens_ptr,
                prefill_len_ptr,
                draft_tokens_ptr,
                draft_tokens_stride,
                cu_num_logits_ptr,
                logits_indices_ptr,
                MAX_SPAN,
                NEW_SAMPLED,
                TILE,
                False,
            )


def combine_sampled_and_draft_tokens(
    grid: Grid,
    input_ids_ptr: torch.Tensor,
    idx_mapping_ptr: torch.Tensor,
    last_sampled_tokens_ptr: torch.Tensor,
    query_start_loc_ptr: torch.Tensor,
    seq_lens_ptr: torch.Tensor,
    prefill_len_ptr: torch.Tensor,
    draft_tokens_ptr: torch.Tensor,
    draft_tokens_stride: int,
    cu_num_logits_ptr: torch.Tensor,
    logits_indices_ptr: torch.Tensor,
    BLOCK_SIZE: int,
    NUM_NEW_SAMPLED_TOKENS: int = 1,
) -> None:
    num_reqs = grid_dim(grid, 0)
    if num_reqs == 0:
        return
    device = input_ids_ptr.device
    per_item = _geometry.geometry(device).grid == "work"
    _combine_sampled_and_draft_kernel[(num_reqs if per_item else _geometry.programs(device, num_reqs),)](
        input_ids_ptr,
        idx_mapping_ptr,
        last_sampled_tokens_ptr,
        query_start_loc_ptr,
        seq_lens_ptr,
        prefill_len_ptr,
        draft_tokens_ptr,
        draft_tokens_stride,
        cu_num_logits_ptr,
        logits_indices_ptr,
        num_reqs,
        MAX_SPAN=BLOCK_SIZE,
        NEW_SAMPLED=NUM_NEW_SAMPLED_TOKENS,
        TILE=_tile(device, next_power_of_2(max(1, BLOCK_SIZE))),
        PER_ITEM=per_item,
    )


@triton.jit
def _num_sampled_and_rejected_kernel(
    num_sampled_ptr,
    num_rejected_ptr,
    seq_lens_ptr,
    cu_num_logits_ptr,
    idx_mapping_ptr,
    prefill_len_ptr,
    num_reqs,
    TILE: tl.constexpr,
    PER_ITEM: tl.constexpr,
):
    # Chunk-prefilling requests (seq_len < prefill_len) sample and reject nothing; the others reject their
    # logits minus their sampled tokens.
    if PER_ITEM:  # a program per request (CUDA, vLLM's grid): scalars
        req = tl.program_id(0)
        chunked = tl.load(seq_lens_ptr + req) < tl.load(prefill_len_ptr + tl.load(idx_mapping_ptr + req))
        sampled = tl.where(chunked, 0, tl.load(num_sampled_ptr + req))
        tl.store(num_sampled_ptr + req, sampled)
        num_logits = tl.load(cu_num_logits_ptr + req + 1) - tl.load(cu_num_logits_ptr + req)
        tl.store(num_rejected_ptr + req, tl.where(chunked, 0, num_logits - sampled))
    else:  # tiles of requests grid-stride (Ascend: a program per vector core)
        pid = tl.program_id(0)
        programs = tl.num_programs(0)
        for t in range(pid * TILE, num_reqs, programs * TILE):
            req = t + tl.arange(0, TILE)
            inside = req < num_reqs
            state = tl.load(idx_mapping_ptr + req, mask=inside, other=0)
            seq_len = tl.load(seq_lens_ptr + req, mask=inside, other=0)
            prefill_len = tl.load(prefill_len_ptr + state, mask=inside, other=0)
            chunked = seq_len < prefill_len
            sampled = tl.load(num_sampled_ptr + req, mask=inside, other=0)
            sampled = tl.where(chunked, 0, sampled)
            tl.store(num_sampled_ptr + req, sampled, mask=inside)
            num_logits = tl.load(cu_num_logits_ptr + req + 1, mask=inside, other=0) - tl.load(
                cu_num_logits_ptr + req, mask=inside, other=0
            )
            tl.store(num_rejected_ptr + req, tl.where(chunked, 0, num_logits - sampled), mask=inside)


def get_num_sampled_and_rejected(
    grid: Grid,
    num_sampled_ptr: torch.Tensor,
    num_rejected_ptr: torch.Tensor,
    seq_lens_ptr: torch.Tensor,
    cu_num_logits_ptr: torch.Tensor,
    idx_mapping_ptr: torch.Tensor,
    prefill_len_ptr: torch.Tensor,
) -> None:
    num_reqs = grid_dim(grid, 0)
    if num_reqs == 0:
        return
    device = num_sampled_ptr.device
    tile = _tile(device)
    per_item = _geometry.geometry(device).grid == "work"
    programs = num_reqs if per_item else _geometry.programs(device, cdiv(num_reqs, tile))
    _num_sampled_and_rejected_kernel[(programs,)](
        num_sampled_ptr,
        num_rejected_ptr,
        seq_lens_ptr,
        cu_num_logits_ptr,
        idx_mapping_ptr,
        prefill_len_ptr,
        num_reqs,
        TILE=tile,
        PER_ITEM=per_item,
    )


@triton.jit
def _post_update_request(
    req,
    idx_mapping_ptr,
    num_computed_tokens_ptr,
    last_sampled_tokens_ptr,
    output_bin_counts_ptr,
    output_bin_counts_stride,
    sampled_tokens_ptr,
    sampled_tokens_stride,
    num_sampled_ptr,
    num_rejected_ptr,
    query_start_loc_ptr,
    all_token_ids_ptr,
    all_token_ids_stride,
    total_len_ptr,
    HAS_COUNTS: tl.constexpr,
    HAS_QUERY: tl.constexpr,
    TILE: tl.constexpr,
    SCALAR: tl.constexpr,
):
    # A negative state row is skipped: sampled tokens appended to the state's token row, counted one by
    # one in its histogram (a token may repeat), last token and length updated; computed tokens advanced
    # by the query length minus the rejected drafts. SCALAR (CUDA, vLLM's code): a token at a time, appended
    # and counted in one loop; else the tokens copied in tiles, then counted.
    state = tl.load(idx_mapping_ptr + req)
    if state >= 0:
        state64 = state.to(tl.int64)
        total = tl.load(total_len_ptr + state)
        sampled = tl.load(num_sampled_ptr + req)
        tokens_row = sampled_tokens_ptr + req * sampled_tokens_stride
        if sampled > 0:
            tl.store(last_sampled_tokens_ptr + state, tl.load(tokens_row + sampled - 1))
            tl.store(total_len_ptr + state, total + sampled)
        out_row = all_token_ids_ptr + state64 * all_token_ids_stride + total
        counts_row = output_bin_counts_ptr + state64 * output_bin_counts_stride
        if SCALAR:
            for i in range(0, sampled):
                token = tl.load(tokens_row + i)
                tl.store(out_row + i, token)
                if HAS_COUNTS:
                    tl.store(counts_row + token, tl.load(counts_row + token) + 1)
        else:
            for i in range(0, sampled, TILE):
                offs = i + tl.arange(0, TILE)
                inside = offs < sampled
                tl.store(out_row + offs, tl.load(tokens_row + offs, mask=inside, other=0), mask=inside)
            if HAS_COUNTS:
                for i in range(0, sampled):
                    slot = counts_row + tl.load(tokens_row + i)
                    tl.store(slot, tl.load(slot) + 1)
        delta = -tl.load(num_rejected_ptr + req)
        if HAS_QUERY:
            delta += tl.load(query_start_loc_ptr + req + 1) - tl.load(query_start_loc_ptr + req)
        if delta != 0:
            tl.store(num_computed_tokens_ptr + state, tl.load(num_computed_tokens_ptr + state) + delta)


@triton.jit
def _post_update_kernel(
    idx_mapping_ptr,
    num_computed_tokens_ptr,
    last_sampled_tokens_ptr,
    output_bin_counts_ptr,
    output_bin_counts_stride,
    sampled_tokens_ptr,
    sampled_tokens_stride,
    num_sampled_ptr,
    num_rejected_ptr,
    query_start_loc_ptr,
    all_token_ids_ptr,
    all_token_ids_stride,
    total_len_ptr,
    num_reqs,
    HAS_COUNTS: tl.constexpr,
    HAS_QUERY: tl.constexpr,
    TILE: tl.constexpr,
    PER_ITEM: tl.constexpr,
):
    if PER_ITEM:  # a program per request (CUDA, vLLM's grid), scalar code
        _post_update_request(
            tl.program_id(0),
            idx_mapping_ptr,
            num_computed_tokens_ptr,
            last_sampled_tokens_ptr,
            output_bin_counts_ptr,
            output_bin_counts_stride,
            sampled_tokens_ptr,
            sampled_tokens_stride,
            num_sampled_ptr,
            num_rejected_ptr,
            query_start_loc_ptr,
            all_token_ids_ptr,
            all_token_ids_stride,
            total_len_ptr,
            HAS_COUNTS,
            HAS_QUERY,
            TILE,
            True,
        )
    else:  # requests grid-stride (Ascend: a program per vector core)
        pid = tl.program_id(0)
        programs = tl.num_programs(0)
        for req in range(pid, num_reqs, programs):
            _post_update_request(
                req,
                idx_mapping_ptr,
                num_computed_tokens_ptr,
                last_sampled_tokens_ptr,
                output_bin_counts_ptr,
                output_bin_counts_stride,
                sampled_tokens_ptr,
                sampled_tokens_stride,
                num_sampled_ptr,
                num_rejected_ptr,
                query_start_loc_ptr,
                all_token_ids_ptr,
                all_token_ids_stride,
                total_len_ptr,
                HAS_COUNTS,
                HAS_QUERY,
                TILE,
                False,
            )


def post_update(
    grid: Grid,
    idx_mapping_ptr: torch.Tensor,
    num_computed_tokens_ptr: torch.Tensor,
    last_sampled_tokens_ptr: torch.Tensor,
    output_bin_counts_ptr: torch.Tensor | None,
    output_bin_counts_stride: int,
    sampled_tokens_ptr: torch.Tensor,
    sampled_tokens_stride: int,
    num_sampled_ptr: torch.Tensor,
    num_rejected_ptr: torch.Tensor,
    query_start_loc_ptr: torch.Tensor | None,
    all_token_ids_ptr: torch.Tensor,
    all_token_ids_stride: int,
    total_len_ptr: torch.Tensor,
) -> None:
    num_reqs = grid_dim(grid, 0)
    if num_reqs == 0:
        return
    device = all_token_ids_ptr.device
    per_item = _geometry.geometry(device).grid == "work"
    _post_update_kernel[(num_reqs if per_item else _geometry.programs(device, num_reqs),)](
        idx_mapping_ptr,
        num_computed_tokens_ptr,
        last_sampled_tokens_ptr,
        num_computed_tokens_ptr if output_bin_counts_ptr is None else output_bin_counts_ptr,
        output_bin_counts_stride,
        sampled_tokens_ptr,
        sampled_tokens_stride,
        num_sampled_ptr,
        num_rejected_ptr,
        num_rejected_ptr if query_start_loc_ptr is None else query_start_loc_ptr,
        all_token_ids_ptr,
        all_token_ids_stride,
        total_len_ptr,
        num_reqs,
        HAS_COUNTS=output_bin_counts_ptr is not None,
        HAS_QUERY=query_start_loc_ptr is not None,
        TILE=_tile(device, 16),
        PER_ITEM=per_item,
        **_geometry.launch(device, 1),  # scalar work per request: one warp on CUDA, as vLLM launches it
    )


@triton.jit
def _post_update_num_computed_kernel(
    idx_mapping_ptr,
    num_computed_tokens_ptr,
    query_start_loc_ptr,
    num_reqs,
):
    # Requests grid-stride: each state's computed tokens advanced by its query length.
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    for req in range(pid, num_reqs, programs):
        state = tl.load(idx_mapping_ptr + req)
        query_len = tl.load(query_start_loc_ptr + req + 1) - tl.load(query_start_loc_ptr + req)
        tl.store(num_computed_tokens_ptr + state, tl.load(num_computed_tokens_ptr + state) + query_len)


def post_update_num_computed_tokens(
    grid: Grid,
    idx_mapping_ptr: torch.Tensor,
    num_computed_tokens_ptr: torch.Tensor,
    query_start_loc_ptr: torch.Tensor,
) -> None:
    num_reqs = grid_dim(grid, 0)
    if num_reqs == 0:
        return
    _post_update_num_computed_kernel[(_geometry.programs(num_computed_tokens_ptr.device, num_reqs),)](
        idx_mapping_ptr, num_computed_tokens_ptr, query_start_loc_ptr, num_reqs
    )


@triton.jit
def _expand_request(
    req,
    idx_mapping_ptr,
    expanded_idx_mapping_ptr,
    expanded_local_pos_ptr,
    cu_num_logits_ptr,
    MAX_SPAN: tl.constexpr,
    TILE: tl.constexpr,
    ONE_TILE: tl.constexpr,
):
    # Each of a request's logits (at most MAX_SPAN) gets its state and local index: one tile where
    # ONE_TILE (TILE >= MAX_SPAN; vLLM's one block), else a loop of tiles.
    begin = tl.load(cu_num_logits_ptr + req)
    count = tl.load(cu_num_logits_ptr + req + 1) - begin
    state = tl.load(idx_mapping_ptr + req)
    if ONE_TILE:
        offs = tl.arange(0, TILE)
        inside = offs < count
        if MAX_SPAN < TILE:
            inside = inside & (offs < MAX_SPAN)
        tl.store(
            expanded_idx_mapping_ptr + begin + offs, tl.zeros([TILE], dtype=tl.int32) + state, mask=inside
        )
        tl.store(expanded_local_pos_ptr + begin + offs, offs, mask=inside)
    else:
        count = tl.minimum(count, MAX_SPAN)
        for i in range(0, count, TILE):
            offs = i + tl.arange(0, TILE)
            inside = offs < count
            states = tl.zeros([TILE], dtype=tl.int32) + state
            tl.store(expanded_idx_mapping_ptr + begin + offs, states, mask=inside)
            tl.store(expanded_local_pos_ptr + begin + offs, offs, mask=inside)


@triton.jit
def _expand_idx_mapping_kernel(
    idx_mapping_ptr,
    expanded_idx_mapping_ptr,
    expanded_local_pos_ptr,
    cu_num_logits_ptr,
    num_reqs,
    MAX_SPAN: tl.constexpr,
    TILE: tl.constexpr,
    PER_ITEM: tl.constexpr,
):
    if PER_ITEM:  # a program per request (CUDA, vLLM's grid)
        _expand_request(
            tl.program_id(0),
            idx_mapping_ptr,
            expanded_idx_mapping_ptr,
            expanded_local_pos_ptr,
            cu_num_logits_ptr,
            MAX_SPAN,
            TILE,
            MAX_SPAN <= TILE,
        )
    else:  # requests grid-stride (Ascend: a program per vector core)
        pid = tl.program_id(0)
        programs = tl.num_programs(0)
        for req in range(pid, num_reqs, programs):
            _expand_request(
                req,
                idx_mapping_ptr,
                expanded_idx_mapping_ptr,
                expanded_local_pos_ptr,
                cu_num_logits_ptr,
                MAX_SPAN,
                TILE,
                False,
            )


def expand_idx_mapping(
    grid: Grid,
    idx_mapping_ptr: torch.Tensor,
    expanded_idx_mapping_ptr: torch.Tensor,
    expanded_local_pos_ptr: torch.Tensor,
    cu_num_logits_ptr: torch.Tensor,
    BLOCK_SIZE: int,
) -> None:
    num_reqs = grid_dim(grid, 0)
    if num_reqs == 0:
        return
    device = idx_mapping_ptr.device
    per_item = _geometry.geometry(device).grid == "work"
    _expand_idx_mapping_kernel[(num_reqs if per_item else _geometry.programs(device, num_reqs),)](
        idx_mapping_ptr,
        expanded_idx_mapping_ptr,
        expanded_local_pos_ptr,
        cu_num_logits_ptr,
        num_reqs,
        MAX_SPAN=BLOCK_SIZE,
        TILE=_tile(device, next_power_of_2(max(1, BLOCK_SIZE))),
        PER_ITEM=per_item,
    )
