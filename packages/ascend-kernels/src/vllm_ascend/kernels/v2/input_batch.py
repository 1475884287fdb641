"""Overrides of the kernels of vLLM's ``vllm/v1/worker/gpu/input_batch.py`` (the V2 input batch:
positions, sequence lengths, prefill inputs, sampled/draft token bookkeeping)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from vllm_ascend.kernels.v2._launch import Grid, dispatch_v2, grid_dim, host_flat, lanes

_VLLM = "vllm.v1.worker.gpu.input_batch"


def _tokens(qsl: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The scheduled tokens ``qsl[0] .. qsl[-1]`` and the batch row owning each (row ``i`` owns ``qsl[i] ..
    qsl[i + 1]``), for a ``query_start_loc`` prefix ``qsl``; the two bounds are read on the host."""
    start, end = int(qsl[0]), int(qsl[-1])
    tokens = torch.arange(start, max(start, end), device=qsl.device)
    return tokens, torch.searchsorted(qsl[1:], tokens, right=True)


def prepare_pos_seq_lens_torch(
    grid: Grid,
    pos_ptr: torch.Tensor,
    seq_lens_ptr: torch.Tensor,
    idx_mapping_ptr: torch.Tensor,
    query_start_loc_ptr: torch.Tensor,
    num_computed_tokens_ptr: torch.Tensor,
    max_num_reqs: int,
    BLOCK_SIZE: int,
) -> None:
    """Reference of :func:`prepare_pos_seq_lens`: ``seq_lens = computed + query_len`` per row, 0 for the
    padding rows, and token ``t`` of row ``i`` at position ``computed[i] + t - query_start_loc[i]``."""
    num_reqs = grid_dim(grid, 0) - 1
    seq_lens_ptr[num_reqs:max_num_reqs] = 0
    if num_reqs <= 0:
        return
    qsl = query_start_loc_ptr[: num_reqs + 1]
    computed = num_computed_tokens_ptr[idx_mapping_ptr[:num_reqs]]
    seq_lens_ptr[:num_reqs] = computed + (qsl[1:] - qsl[:-1])
    tokens, owner = _tokens(qsl)
    pos_ptr[tokens] = (tokens + (computed - qsl[:-1])[owner]).to(pos_ptr.dtype)


def prepare_pos_seq_lens_host(
    grid: Grid,
    pos_ptr: torch.Tensor,
    seq_lens_ptr: torch.Tensor,
    idx_mapping_ptr: torch.Tensor,
    query_start_loc_ptr: torch.Tensor,
    num_computed_tokens_ptr: torch.Tensor,
    max_num_reqs: int,
    BLOCK_SIZE: int,
) -> None:
    """:func:`prepare_pos_seq_lens_torch` on numpy views of host tensors (``query_start_loc`` non-decreasing)."""
    num_reqs = grid_dim(grid, 0) - 1
    seq_lens = seq_lens_ptr.numpy()
    seq_lens[max(num_reqs, 0) : max_num_reqs] = 0
    if num_reqs <= 0:
        return
    qsl = query_start_loc_ptr.numpy()[: num_reqs + 1].astype(np.int64)
    computed = num_computed_tokens_ptr.numpy()[idx_mapping_ptr.numpy()[:num_reqs]].astype(np.int64)
    query_lens = qsl[1:] - qsl[:-1]
    seq_lens[:num_reqs] = computed + query_lens
    start, end = int(qsl[0]), int(qsl[-1])
    if end > start:
        pos_ptr.numpy()[start:end] = np.arange(start, end) + np.repeat(computed - qsl[:-1], query_lens)


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
    """Positions and sequence lengths of the scheduled tokens, in place.

    ``grid[0] - 1`` requests; request ``i`` (state row ``idx_mapping_ptr[i]``) owns tokens
    ``query_start_loc_ptr[i] .. [i + 1]``, at positions ``num_computed_tokens + 0, 1, ...``;
    ``seq_lens_ptr[i] = num_computed_tokens + query_len`` and ``seq_lens_ptr[num_reqs:max_num_reqs] = 0``
    (padding for full graphs)."""
    device = pos_ptr.device
    impl = dispatch_v2(
        "input_batch",
        "prepare_pos_seq_lens",
        prepare_pos_seq_lens_torch,
        device,
    )
    impl(
        grid,
        pos_ptr,
        seq_lens_ptr,
        idx_mapping_ptr,
        query_start_loc_ptr,
        num_computed_tokens_ptr,
        max_num_reqs,
        BLOCK_SIZE,
    )


def prepare_prefill_inputs_torch(
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
    """Reference of :func:`prepare_prefill_inputs`: for rows still in their prompt (``computed <
    prefill_len``), token ``t`` of row ``i`` reads ``all_token_ids[state, computed + t - start]``, and
    ``next_prefill_tokens[k, state]`` = the prompt token ``k`` past the chunk (0 past the prompt)."""
    num_reqs = grid_dim(grid, 0)
    if num_reqs <= 0:
        return
    states = idx_mapping_ptr[:num_reqs].to(torch.int64)
    prefill_len = prefill_lens_ptr[states]
    computed = num_computed_tokens_ptr[states]
    prefilling = computed < prefill_len
    rows = prefilling.nonzero().flatten()
    if not rows.numel():
        return
    qsl = query_start_loc_ptr[: num_reqs + 1].to(torch.int64)
    tokens, owner = _tokens(qsl)
    keep = prefilling[owner]
    tokens, owner = tokens[keep], owner[keep]
    columns = tokens + (computed - qsl[:-1])[owner]
    input_ids_ptr[tokens] = all_token_ids_ptr[states[owner], columns].to(input_ids_ptr.dtype)
    if num_lookahead <= 0:
        return
    state, k = states[rows, None], torch.arange(num_lookahead, device=states.device)
    pos = (computed + qsl[1:] - qsl[:-1])[rows, None] + k
    in_prompt = pos < prefill_len[rows, None]
    ahead = all_token_ids_ptr[state, pos.masked_fill(~in_prompt, 0)].masked_fill(~in_prompt, 0)
    next_prefill_tokens_ptr.view(-1)[k * next_prefill_tokens_stride + state] = ahead.to(
        next_prefill_tokens_ptr.dtype
    )


def prepare_prefill_inputs_host(
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
    """:func:`prepare_prefill_inputs_torch` on numpy views of host tensors."""
    num_reqs = grid_dim(grid, 0)
    if num_reqs <= 0:
        return
    states = idx_mapping_ptr.numpy()[:num_reqs].astype(np.int64)
    prefill_len = prefill_lens_ptr.numpy()[states].astype(np.int64)
    computed = num_computed_tokens_ptr.numpy()[states].astype(np.int64)
    prefilling = computed < prefill_len
    if not prefilling.any():
        return
    qsl = query_start_loc_ptr.numpy()[: num_reqs + 1].astype(np.int64)
    query_lens = qsl[1:] - qsl[:-1]
    owner = np.repeat(np.arange(num_reqs), query_lens)
    tokens = np.arange(qsl[0], qsl[-1])
    keep = prefilling[owner]
    tokens, owner = tokens[keep], owner[keep]
    all_token_ids = all_token_ids_ptr.numpy()
    input_ids_ptr.numpy()[tokens] = all_token_ids[states[owner], tokens + (computed - qsl[:-1])[owner]]
    if num_lookahead <= 0:
        return
    rows, k = np.flatnonzero(prefilling), np.arange(num_lookahead)
    state = states[rows, None]
    pos = (computed + query_lens)[rows, None] + k
    in_prompt = pos < prefill_len[rows, None]
    ahead = np.where(in_prompt, all_token_ids[state, np.where(in_prompt, pos, 0)], 0)
    host_flat(next_prefill_tokens_ptr)[k * next_prefill_tokens_stride + state] = ahead


def prepare_prefill_inputs(grid: Grid, **arguments: Any) -> None:
    """Input ids of prefill requests from their prompt rows (``all_token_ids[state, computed:...]``) and the
    next ``num_lookahead`` prompt tokens after the chunk (0 past the prompt) into ``next_prefill_tokens``
    (row ``k``, column ``state``); requests past their prompt are left alone."""
    device = arguments["input_ids_ptr"].device
    dispatch_v2(
        "input_batch",
        "prepare_prefill_inputs",
        prepare_prefill_inputs_torch,
        device,
    )(grid, **arguments)


def combine_sampled_and_draft_tokens_torch(
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
    """Reference of :func:`combine_sampled_and_draft_tokens`, on vLLM's (row, lane ``j < BLOCK_SIZE``)
    grid: ``logits_indices[cu[i] + j] = query_end - num_logits + j`` (``j < num_logits``); rows past their
    prompt (``seq_len > prefill_len``) get the last sampled token at ``query_end - num_logits`` (if that
    position is past the prompt too, and ``NEW > 0``) and draft ``j`` at ``query_end - num_draft + j``
    (``j < num_draft = num_logits - NEW``)."""
    num_reqs = grid_dim(grid, 0)
    if num_reqs <= 0:
        return
    states = idx_mapping_ptr[:num_reqs]
    cu = cu_num_logits_ptr[: num_reqs + 1].to(torch.int64)
    num_logits = cu[1:] - cu[:-1]
    query_end = query_start_loc_ptr[1 : num_reqs + 1]
    lane = torch.arange(BLOCK_SIZE, device=cu.device)

    row, j = (lane < num_logits[:, None]).nonzero(as_tuple=True)
    logits_indices_ptr[cu[row] + j] = (query_end - num_logits)[row] + j

    seq_len, prefill_len = seq_lens_ptr[:num_reqs], prefill_len_ptr[states]
    decoding = seq_len > prefill_len
    if NUM_NEW_SAMPLED_TOKENS > 0:
        last = (decoding & (seq_len - num_logits >= prefill_len)).nonzero().flatten()
        input_ids_ptr[(query_end - num_logits)[last]] = last_sampled_tokens_ptr.view(-1)[states[last]].to(
            input_ids_ptr.dtype
        )
    num_draft = num_logits - NUM_NEW_SAMPLED_TOKENS
    row, j = ((lane < num_draft[:, None]) & decoding[:, None]).nonzero(as_tuple=True)
    drafts = draft_tokens_ptr.view(-1)[states[row] * draft_tokens_stride + j]
    input_ids_ptr[(query_end - num_draft)[row] + j] = drafts.to(input_ids_ptr.dtype)


def combine_sampled_and_draft_tokens_host(
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
    """:func:`combine_sampled_and_draft_tokens_torch` on numpy views of host tensors."""
    num_reqs = grid_dim(grid, 0)
    if num_reqs <= 0:
        return
    states = idx_mapping_ptr.numpy()[:num_reqs].astype(np.int64)
    cu = cu_num_logits_ptr.numpy()[: num_reqs + 1].astype(np.int64)
    num_logits = cu[1:] - cu[:-1]
    query_end = query_start_loc_ptr.numpy()[1 : num_reqs + 1].astype(np.int64)
    row, j = lanes(num_logits, BLOCK_SIZE)
    logits_indices_ptr.numpy()[cu[row] + j] = (query_end - num_logits)[row] + j
    seq_len = seq_lens_ptr.numpy()[:num_reqs].astype(np.int64)
    prefill_len = prefill_len_ptr.numpy()[states]
    decoding = seq_len > prefill_len
    input_ids = input_ids_ptr.numpy()
    if NUM_NEW_SAMPLED_TOKENS > 0:
        last = np.flatnonzero(decoding & (seq_len - num_logits >= prefill_len))
        input_ids[(query_end - num_logits)[last]] = host_flat(last_sampled_tokens_ptr)[states[last]]
    num_draft = num_logits - NUM_NEW_SAMPLED_TOKENS
    row, j = lanes(num_draft * decoding, BLOCK_SIZE)
    if row.size:
        drafts = host_flat(draft_tokens_ptr)[states[row] * draft_tokens_stride + j]
        input_ids[(query_end - num_draft)[row] + j] = drafts


def combine_sampled_and_draft_tokens(grid: Grid, **arguments: Any) -> None:
    """Logits indices of each request (its last ``num_logits`` query tokens) and, for requests past their
    prompt, the last sampled token and the draft tokens written into the input ids."""
    device = arguments["input_ids_ptr"].device
    impl = dispatch_v2(
        "input_batch",
        "combine_sampled_and_draft_tokens",
        combine_sampled_and_draft_tokens_torch,
        device,
    )
    impl(grid, **arguments)


def get_num_sampled_and_rejected_torch(
    grid: Grid,
    num_sampled_ptr: torch.Tensor,
    num_rejected_ptr: torch.Tensor,
    seq_lens_ptr: torch.Tensor,
    cu_num_logits_ptr: torch.Tensor,
    idx_mapping_ptr: torch.Tensor,
    prefill_len_ptr: torch.Tensor,
) -> None:
    """Reference of :func:`get_num_sampled_and_rejected`: rows still chunk-prefilling (``seq_len <
    prefill_len``) get 0 and 0; the others keep ``num_sampled`` and reject ``num_logits - num_sampled``."""
    n = grid_dim(grid, 0)
    chunked = seq_lens_ptr[:n] < prefill_len_ptr[idx_mapping_ptr[:n].to(torch.int64)]
    sampled = num_sampled_ptr[:n].masked_fill(chunked, 0)
    num_logits = (cu_num_logits_ptr[1 : n + 1] - cu_num_logits_ptr[:n]).to(num_rejected_ptr.dtype)
    num_sampled_ptr[:n] = sampled
    num_rejected_ptr[:n] = (num_logits - sampled.to(num_logits.dtype)).masked_fill(chunked, 0)


def get_num_sampled_and_rejected_host(
    grid: Grid,
    num_sampled_ptr: torch.Tensor,
    num_rejected_ptr: torch.Tensor,
    seq_lens_ptr: torch.Tensor,
    cu_num_logits_ptr: torch.Tensor,
    idx_mapping_ptr: torch.Tensor,
    prefill_len_ptr: torch.Tensor,
) -> None:
    """:func:`get_num_sampled_and_rejected_torch` on numpy views of host tensors."""
    n = grid_dim(grid, 0)
    if n <= 0:
        return
    chunked = seq_lens_ptr.numpy()[:n] < prefill_len_ptr.numpy()[idx_mapping_ptr.numpy()[:n]]
    sampled = num_sampled_ptr.numpy()[:n]
    sampled[chunked] = 0
    rejected = num_rejected_ptr.numpy()[:n]
    cu = cu_num_logits_ptr.numpy()[: n + 1]
    rejected[:] = cu[1:] - cu[:-1] - sampled
    rejected[chunked] = 0


def get_num_sampled_and_rejected(grid: Grid, **arguments: Any) -> None:
    """Per request: sampled count (0 while chunk-prefilling) and rejected count (logits - sampled)."""
    device = arguments["num_sampled_ptr"].device
    impl = dispatch_v2(
        "input_batch",
        "get_num_sampled_and_rejected",
        get_num_sampled_and_rejected_torch,
        device,
    )
    impl(grid, **arguments)


def post_update_torch(
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
    """Reference of :func:`post_update`, on a (row, sampled token ``i < num_sampled``) grid; rows with a
    negative state are skipped. Token ``i`` goes to ``all_token_ids[state, total_len + i]`` and adds 1 to
    ``output_bin_counts[state, token]``; the last one is the state's last sampled token and ``total_len``
    grows by ``num_sampled``; ``num_computed_tokens`` grows by ``query_len - num_rejected``. As vLLM's
    kernel (a program per row, unsynchronised), the valid states are taken to be distinct."""
    n = grid_dim(grid, 0)
    if n <= 0:
        return
    states = idx_mapping_ptr[:n].to(torch.int64)
    valid = states >= 0
    k = num_sampled_ptr[:n].to(torch.int64)
    width = int(k.max())
    if width > 0:
        lane = torch.arange(width, device=states.device)
        row, i = ((lane < k[:, None]) & valid[:, None]).nonzero(as_tuple=True)
        state = states[row]
        tokens = sampled_tokens_ptr.view(-1)[row * sampled_tokens_stride + i]
        total = total_len_ptr[state]
        all_token_ids_ptr[state, total + i] = tokens.to(all_token_ids_ptr.dtype)
        if output_bin_counts_ptr is not None:
            index = state * output_bin_counts_stride + tokens
            counts = output_bin_counts_ptr.view(-1)
            counts.index_put_((index,), torch.ones_like(index, dtype=counts.dtype), accumulate=True)
        last = (i + 1 == k[row]).nonzero().flatten()
        last_sampled_tokens_ptr.view(-1)[state[last]] = tokens[last].to(last_sampled_tokens_ptr.dtype)
        total_len_ptr[state[last]] = (total + i + 1)[last].to(total_len_ptr.dtype)
    delta = -num_rejected_ptr[:n]
    if query_start_loc_ptr is not None:
        delta = delta + (query_start_loc_ptr[1 : n + 1] - query_start_loc_ptr[:n])
    num_computed_tokens_ptr.index_add_(0, states[valid], delta[valid].to(num_computed_tokens_ptr.dtype))


def post_update_host(
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
    """:func:`post_update_torch` on numpy views of host tensors."""
    n = grid_dim(grid, 0)
    if n <= 0:
        return
    states = idx_mapping_ptr.numpy()[:n].astype(np.int64)
    valid = states >= 0
    k = num_sampled_ptr.numpy()[:n].astype(np.int64)
    row, i = lanes(k * valid)
    if row.size:
        state = states[row]
        tokens = host_flat(sampled_tokens_ptr)[row * sampled_tokens_stride + i]
        total_len = total_len_ptr.numpy()
        total = total_len[state].astype(np.int64)
        all_token_ids_ptr.numpy()[state, total + i] = tokens
        if output_bin_counts_ptr is not None:
            counts = host_flat(output_bin_counts_ptr)
            np.add.at(counts, state * output_bin_counts_stride + tokens.astype(np.int64), 1)
        last = i + 1 == k[row]
        host_flat(last_sampled_tokens_ptr)[state[last]] = tokens[last]
        total_len[state[last]] = (total + i + 1)[last]
    delta = -num_rejected_ptr.numpy()[:n].astype(np.int64)
    if query_start_loc_ptr is not None:
        qsl = query_start_loc_ptr.numpy()[: n + 1]
        delta += qsl[1:] - qsl[:-1]
    np.add.at(num_computed_tokens_ptr.numpy(), states[valid], delta[valid])


def post_update(grid: Grid, **arguments: Any) -> None:
    """After sampling, per request: its sampled tokens appended to its token row and counted in its output
    histogram, its last sampled token and total length updated, its computed tokens advanced by the query
    length minus the rejected drafts. Rows with a negative state index are skipped."""
    device = arguments["all_token_ids_ptr"].device
    dispatch_v2(
        "input_batch",
        "post_update",
        post_update_torch,
        device,
    )(grid, **arguments)


def post_update_num_computed_tokens_torch(
    grid: Grid,
    idx_mapping_ptr: torch.Tensor,
    num_computed_tokens_ptr: torch.Tensor,
    query_start_loc_ptr: torch.Tensor,
) -> None:
    """Reference of :func:`post_update_num_computed_tokens`."""
    n = grid_dim(grid, 0)
    query_lens = (query_start_loc_ptr[1 : n + 1] - query_start_loc_ptr[:n]).to(num_computed_tokens_ptr.dtype)
    num_computed_tokens_ptr.index_add_(0, idx_mapping_ptr[:n].to(torch.int64), query_lens)


def post_update_num_computed_tokens(grid: Grid, **arguments: Any) -> None:
    """Each request's computed tokens advanced by its query length."""
    device = arguments["num_computed_tokens_ptr"].device
    impl = dispatch_v2(
        "input_batch", "post_update_num_computed_tokens", post_update_num_computed_tokens_torch, device
    )
    impl(grid, **arguments)


def expand_idx_mapping_torch(
    grid: Grid,
    idx_mapping_ptr: torch.Tensor,
    expanded_idx_mapping_ptr: torch.Tensor,
    expanded_local_pos_ptr: torch.Tensor,
    cu_num_logits_ptr: torch.Tensor,
    BLOCK_SIZE: int,
) -> None:
    """Reference of :func:`expand_idx_mapping`, on vLLM's (row, lane ``j < BLOCK_SIZE``) grid: logit
    ``cu[i] + j`` (``j < num_logits``) gets state ``idx_mapping[i]`` and local position ``j``."""
    n = grid_dim(grid, 0)
    if n <= 0:
        return
    cu = cu_num_logits_ptr[: n + 1].to(torch.int64)
    lane = torch.arange(BLOCK_SIZE, device=cu.device)
    row, j = (lane < (cu[1:] - cu[:-1])[:, None]).nonzero(as_tuple=True)
    expanded_idx_mapping_ptr[cu[row] + j] = idx_mapping_ptr[row].to(expanded_idx_mapping_ptr.dtype)
    expanded_local_pos_ptr[cu[row] + j] = j.to(expanded_local_pos_ptr.dtype)


def expand_idx_mapping_host(
    grid: Grid,
    idx_mapping_ptr: torch.Tensor,
    expanded_idx_mapping_ptr: torch.Tensor,
    expanded_local_pos_ptr: torch.Tensor,
    cu_num_logits_ptr: torch.Tensor,
    BLOCK_SIZE: int,
) -> None:
    """:func:`expand_idx_mapping_torch` on numpy views of host tensors."""
    n = grid_dim(grid, 0)
    if n <= 0:
        return
    cu = cu_num_logits_ptr.numpy()[: n + 1].astype(np.int64)
    row, j = lanes(cu[1:] - cu[:-1], BLOCK_SIZE)
    expanded_idx_mapping_ptr.numpy()[cu[row] + j] = idx_mapping_ptr.numpy()[row]
    expanded_local_pos_ptr.numpy()[cu[row] + j] = j


def expand_idx_mapping(grid: Grid, **arguments: Any) -> None:
    """Per logit: its request's state index and its position among the request's logits."""
    device = arguments["idx_mapping_ptr"].device
    dispatch_v2(
        "input_batch",
        "expand_idx_mapping",
        expand_idx_mapping_torch,
        device,
    )(grid, **arguments)


OVERRIDES: dict[str, Callable[..., Any]] = {
    f"{_VLLM}._prepare_pos_seq_lens_kernel": prepare_pos_seq_lens,
    f"{_VLLM}._prepare_prefill_inputs_kernel": prepare_prefill_inputs,
    f"{_VLLM}._combine_sampled_and_draft_tokens_kernel": combine_sampled_and_draft_tokens,
    f"{_VLLM}._get_num_sampled_and_rejected_kernel": get_num_sampled_and_rejected,
    f"{_VLLM}._post_update_kernel": post_update,
    f"{_VLLM}._post_update_num_computed_tokens_kernel": post_update_num_computed_tokens,
    f"{_VLLM}._expand_idx_mapping_kernel": expand_idx_mapping,
}
