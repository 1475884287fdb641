"""Draft-model (EAGLE-style) speculative-decoding input preparation in plain vectorised torch.

vLLM builds the drafter's inputs with CUDA-only Triton kernels; these functions compute the same
values with torch ops only (no host syncs, no per-request Python loops), so they run on any device.
All write into caller-owned buffers, the way the kernels do.
"""

from __future__ import annotations

import torch

from vllm_ascend.kernels.slot_mapping import PAD_SLOT_ID


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if value <= 0:
            raise ValueError(f"{name} must be positive, got {value}")


def eagle_step_slot_mapping(
    positions: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    out_positions: torch.Tensor,
    out_slot_mapping: torch.Tensor,
    block_size: int,
    max_model_len: int,
    pad_id: int = PAD_SLOT_ID,
) -> None:
    """One autoregressive draft step: advance each request's position and its KV slot.

    ``positions``: ``[B]`` current positions; ``block_table``: ``[>=B, n_blocks]`` block ids;
    ``seq_lens``: ``[>=B]``, its first ``B`` entries updated in place. For each request the next
    position ``p + 1`` is written to ``out_positions[:B]`` (0 once it reaches ``max_model_len``);
    ``out_slot_mapping[:B]`` gets its slot ``block_table[r, min(p' // bs, n_blocks - 1)] * bs + p' % bs``
    (``pad_id`` past the limit) and ``out_slot_mapping[B:]`` (graph padding) ``pad_id``;
    ``seq_lens`` becomes ``min(len + 1, max_model_len)``, or 1 past the limit.
    """
    _check_positive(block_size=block_size, max_model_len=max_model_len, n_blocks=block_table.shape[1])
    batch = positions.shape[0]
    next_pos = positions.to(torch.int64) + 1
    exceeds = next_pos >= max_model_len
    clamped = torch.where(exceeds, 0, next_pos)
    block_idx = torch.clamp(clamped // block_size, max=block_table.shape[1] - 1)
    blocks = block_table[:batch].to(torch.int64).gather(1, block_idx.unsqueeze(1)).squeeze(1)
    slots = torch.where(exceeds, pad_id, blocks * block_size + clamped % block_size)
    lens = seq_lens[:batch]
    new_lens = torch.clamp(torch.where(exceeds, 1, lens.to(torch.int64) + 1), max=max_model_len)
    out_positions[:batch].copy_(clamped)
    out_slot_mapping[:batch].copy_(slots)
    out_slot_mapping[batch:].fill_(pad_id)
    lens.copy_(new_lens)


def eagle_prepare_inputs_padded(
    cu_num_draft_tokens: torch.Tensor,
    valid_sampled_tokens_count: torch.Tensor,
    query_start_loc: torch.Tensor,
    out_token_indices_to_sample: torch.Tensor,
    out_num_rejected_tokens: torch.Tensor,
) -> None:
    """Per request, the rejected draft count and the index of the token the drafter samples from.

    ``cu_num_draft_tokens``: ``[R]`` inclusive cumulative draft counts; ``valid_sampled_tokens_count``:
    ``[R]`` accepted drafts + 1; ``query_start_loc``: ``[>=R + 1]``. Writes
    ``out_num_rejected_tokens[:R] = drafts + 1 - valid`` (0 for requests without drafts) and
    ``out_token_indices_to_sample[:R] = query_start_loc[r + 1] - 1 - rejected``.
    """
    num_reqs = cu_num_draft_tokens.shape[0]
    cu = cu_num_draft_tokens.to(torch.int64)
    drafts = torch.diff(cu, prepend=cu.new_zeros(1))
    rejected = torch.where(drafts > 0, drafts + 1 - valid_sampled_tokens_count.to(torch.int64), 0)
    last_token = query_start_loc[1 : num_reqs + 1].to(torch.int64) - 1
    out_token_indices_to_sample[:num_reqs].copy_(last_token - rejected)
    out_num_rejected_tokens[:num_reqs].copy_(rejected)


def eagle_prepare_next_token_padded(
    sampled_token_ids: torch.Tensor,
    discard_request_mask: torch.Tensor,
    backup_next_token_ids: torch.Tensor,
    vocab_size: int,
    out_next_token_ids: torch.Tensor,
    out_valid_sampled_tokens_count: torch.Tensor,
) -> None:
    """Per request, the number of valid sampled tokens and the token the drafter continues from.

    ``sampled_token_ids``: ``[R, S]`` target-sampled tokens, ``-1`` (or ``>= vocab_size``) marking
    rejected slots; ``discard_request_mask``: ``[R]`` bool; ``backup_next_token_ids``: ``[R]``.
    Writes ``out_valid_sampled_tokens_count[:R]`` (0 for discarded requests) and
    ``out_next_token_ids[:R]``: the last valid token, or the backup token when the request is
    discarded or has no valid token.
    """
    num_reqs, width = sampled_token_ids.shape
    discard = discard_request_mask[:num_reqs].to(torch.bool)
    backup = backup_next_token_ids[:num_reqs].to(torch.int64)
    tokens = sampled_token_ids.to(torch.int64)
    valid = (tokens != -1) & (tokens < vocab_size)
    count = valid.sum(dim=1)
    if width == 0:
        next_tokens = backup
    else:
        columns = torch.arange(width, device=tokens.device)
        last_index = torch.where(valid, columns, -1).amax(dim=1).clamp(min=0)
        last_token = tokens.gather(1, last_index.unsqueeze(1)).squeeze(1)
        next_tokens = torch.where(discard | (count == 0), backup, last_token)
    out_next_token_ids[:num_reqs].copy_(next_tokens)
    out_valid_sampled_tokens_count[:num_reqs].copy_(torch.where(discard, 0, count))


def copy_and_expand_eagle_inputs(
    target_token_ids: torch.Tensor,
    target_positions: torch.Tensor,
    next_token_ids: torch.Tensor,
    query_start_loc: torch.Tensor,
    query_end_loc: torch.Tensor,
    out_input_ids: torch.Tensor,
    out_positions: torch.Tensor,
    out_is_rejected_token_mask: torch.Tensor,
    out_is_masked_token_mask: torch.Tensor,
    out_new_token_indices: torch.Tensor,
    out_hidden_state_mapping: torch.Tensor,
    padding_token_id: int,
    parallel_drafting_token_id: int,
    num_padding_slots_per_request: int,
    shift_input_ids: bool,
) -> None:
    """Lay the target model's tokens out as drafter input, with bonus, parallel-draft and rejected slots.

    ``target_token_ids``/``target_positions``: ``[T]``; ``next_token_ids``: ``[B]`` bonus tokens;
    ``query_start_loc``: ``[B + 1]``; ``query_end_loc``: ``[B]`` last accepted token of each request.
    With ``P = num_padding_slots_per_request`` and ``s = shift_input_ids``, request ``r`` owns the
    output run starting at ``query_start_loc[r] + r * (P - s)``: its accepted tokens (the first
    dropped when shifting), the bonus token, ``P - 1`` ``parallel_drafting_token_id`` slots (marked
    in ``out_is_masked_token_mask``), then one ``padding_token_id`` slot per rejected token (marked in
    ``out_is_rejected_token_mask``, position 0). Positions count up from the request's first
    position. ``out_new_token_indices[r * P + k]`` is the output index of its ``k``-th new token;
    when shifting, ``out_hidden_state_mapping[i]`` is the output index of input token ``i``.
    Elements outside the runs are left as they were.
    """
    batch = query_end_loc.shape[0]
    total = target_token_ids.shape[0]
    if batch == 0 or total == 0:
        return
    slots = num_padding_slots_per_request
    shift = int(bool(shift_input_ids))
    device = target_token_ids.device
    starts = query_start_loc[: batch + 1].to(torch.int64)
    start, next_start = starts[:-1], starts[1:]
    end = query_end_loc.to(torch.int64)
    num_valid = end - start + 1 - shift
    req = torch.arange(batch, device=device)
    out_start = start + req * (slots - shift)
    out_len = next_start - start + slots - shift

    size = min(
        total + batch * (slots - shift),
        out_input_ids.shape[0],
        out_positions.shape[0],
        out_is_rejected_token_mask.shape[0],
        out_is_masked_token_mask.shape[0],
    )
    if size > 0:
        out_idx = torch.arange(size, device=device)
        owner = torch.searchsorted(out_start, out_idx, right=True) - 1
        r = owner.clamp(min=0)
        j = out_idx - out_start[r]
        in_run = (owner >= 0) & (j < out_len[r])
        valid_r = num_valid[r]
        is_valid = j < valid_r
        is_bonus = j == valid_r
        is_parallel = (j > valid_r) & (j < valid_r + slots)
        is_rejected = j >= valid_r + slots
        src = torch.clamp(start[r] + shift + j, 0, total - 1)
        ids = torch.where(is_valid, target_token_ids[src].to(torch.int64), 0)
        ids = torch.where(is_bonus, next_token_ids[r].to(torch.int64), ids)
        ids = torch.where(is_parallel, parallel_drafting_token_id, ids)
        ids = torch.where(is_rejected, padding_token_id, ids)
        first_pos = target_positions[torch.clamp(start[r], 0, total - 1)].to(torch.int64)
        pos = torch.where(is_rejected, 0, first_pos + j)
        for out, value in (
            (out_input_ids, ids),
            (out_positions, pos),
            (out_is_rejected_token_mask, is_rejected),
            (out_is_masked_token_mask, is_parallel),
        ):
            head = out[:size]
            head.copy_(torch.where(in_run, value.to(out.dtype), head))

    if slots > 0:
        k = torch.arange(slots, device=device)
        j_new = num_valid.unsqueeze(1) + k
        new_in_run = (j_new >= 0) & (j_new < out_len.unsqueeze(1))
        head = out_new_token_indices[: batch * slots]
        value = (out_start.unsqueeze(1) + j_new).reshape(-1).to(head.dtype)
        head.copy_(torch.where(new_in_run.reshape(-1), value, head))

    if shift:
        mapped = min(total, out_hidden_state_mapping.shape[0])
        src_idx = torch.arange(mapped, device=device)
        owner = torch.searchsorted(next_start, src_idx, right=True)
        r = owner.clamp(max=batch - 1)
        in_req = (owner < batch) & (src_idx >= start[r])
        head = out_hidden_state_mapping[:mapped]
        value = (out_start[r] + src_idx - start[r]).to(head.dtype)
        head.copy_(torch.where(in_req, value, head))
