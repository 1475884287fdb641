"""V2 multi-module MTP drafting: the Ascend Triton kernels (interpreter) against the torch references."""

from __future__ import annotations

import pytest
import torch

from vllm_ascend.kernels._triton.v2 import spec_decode_multi_module_mtp as triton_impl
from vllm_ascend.kernels.v2 import spec_decode_multi_module_mtp as v2


def _check(kernel: str, grid: tuple[int, ...], args: dict, reference) -> dict:
    expected = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    reference(grid, **expected)
    getattr(triton_impl, kernel)(grid, **args)
    for name, value in args.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, expected[name]), name
    return expected


def _batch(seed: int, num_reqs: int, steps: int, max_reqs: int = 8) -> dict:
    """A mixed batch: decode requests (query ``1 + steps``, up to ``steps`` rejected) and chunked prefills."""
    g = torch.Generator().manual_seed(seed)
    decode = torch.rand(num_reqs, generator=g) < 0.7
    query_lens = torch.where(
        decode, torch.full((num_reqs,), 1 + steps), torch.randint(1, 9, (num_reqs,), generator=g)
    )
    rejected = torch.where(
        decode,
        torch.randint(0, steps + 1, (num_reqs,), generator=g),
        torch.zeros(num_reqs, dtype=torch.int64),
    )
    if num_reqs:
        decode[0], query_lens[0], rejected[0] = True, 1 + steps, steps  # the widest re-prefill gap
    qsl = torch.zeros(max_reqs + 1, dtype=torch.int32)
    qsl[1 : num_reqs + 1] = torch.cumsum(query_lens, 0)
    qsl[num_reqs + 1 :] = qsl[num_reqs]
    sampled = torch.where(
        decode,
        torch.randint(1, steps + 2, (num_reqs,), generator=g),
        torch.randint(0, 2, (num_reqs,), generator=g),
    )
    return {
        "g": g,
        "tokens": int(query_lens.sum()) + 4,
        "query_start_loc": qsl,
        "num_rejected": rejected.to(torch.int32),
        "num_sampled": sampled.to(torch.int32),
        "idx_mapping": torch.randperm(max_reqs, generator=g)[:num_reqs].to(torch.int32),
        "max_reqs": max_reqs,
    }


@pytest.mark.parametrize(
    ("num_reqs", "steps", "seed"), [(0, 3, 0), (1, 3, 1), (5, 3, 2), (6, 4, 3), (4, 1, 4)]
)
def test_prepare_input_buffers(num_reqs: int, steps: int, seed: int) -> None:
    b = _batch(seed, num_reqs, steps)
    g, tokens, max_reqs = b["g"], b["tokens"], b["max_reqs"]
    if steps == 1:
        b["num_rejected"].clamp_(max=1)
    width = max(steps - 1, 1)
    args = {
        "last_token_indices_ptr": torch.full((max_reqs,), -9, dtype=torch.int64),
        "draft_input_ids_ptr": torch.full((tokens,), -1, dtype=torch.int32),
        "draft_positions_ptr": torch.full((tokens,), -2, dtype=torch.int64),
        "draft_seq_lens_ptr": torch.full((max_reqs,), -3, dtype=torch.int32),
        "target_input_ids_ptr": torch.randint(0, 1000, (tokens,), generator=g, dtype=torch.int32),
        "target_positions_ptr": torch.randint(10, 4000, (tokens,), generator=g, dtype=torch.int64),
        "cached_draft_input_ids_ptr": torch.randint(
            2000, 3000, (max_reqs, width), generator=g, dtype=torch.int64
        ),
        "cached_draft_input_ids_stride0": width,
        "draft_input_id_overrides_ptr": torch.full((max_reqs, width), -5, dtype=torch.int64),
        "draft_input_id_overrides_stride0": width,
        "idx_mapping_ptr": b["idx_mapping"],
        "last_sampled_ptr": torch.randint(5000, 6000, (max_reqs, 1), generator=g, dtype=torch.int64),
        "next_prefill_tokens_ptr": torch.randint(
            7000, 8000, (steps + 1, max_reqs), generator=g, dtype=torch.int32
        ),
        "next_prefill_tokens_stride0": max_reqs,
        "num_sampled_ptr": b["num_sampled"],
        "num_rejected_ptr": b["num_rejected"],
        "target_seq_lens_ptr": torch.randint(20, 4000, (num_reqs,), generator=g, dtype=torch.int32),
        "query_start_loc_ptr": b["query_start_loc"],
        "max_num_reqs": max_reqs,
        "num_speculative_steps": steps,
        "BLOCK_SIZE": 4,
    }
    _check("prepare_input_buffers", (num_reqs,), args, v2.prepare_input_buffers_torch)


@pytest.mark.parametrize(
    ("num_reqs", "steps", "embeds", "query_blocks", "dtype"),
    [
        (0, 3, True, 1, torch.float32),
        (1, 3, False, None, torch.float32),
        (5, 3, True, None, torch.bfloat16),
        (4, 4, True, 1, torch.float16),
    ],
)
def test_prepare_input_hidden_states_and_embeddings(
    num_reqs: int, steps: int, embeds: bool, query_blocks: int | None, dtype: torch.dtype
) -> None:
    b = _batch(10 + num_reqs, num_reqs, steps)
    g, tokens, max_reqs = b["g"], b["tokens"], b["max_reqs"]
    hidden, block_q, block_h = 20, 4, 8
    qsl = b["query_start_loc"]
    max_query = int((qsl[1:] - qsl[:-1]).max()) if num_reqs else 1
    grid = (num_reqs, query_blocks or -(-max_query // block_q), -(-hidden // block_h))

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=g).to(dtype)

    cached_hidden = rand(max_reqs, steps - 1, hidden + 1)
    cached_embeds = rand(max_reqs, steps - 1, hidden + 2)
    args = {
        "draft_input_hidden_states_ptr": torch.zeros((tokens, hidden + 3), dtype=dtype),
        "draft_input_hidden_states_stride0": hidden + 3,
        "target_hidden_states_ptr": rand(tokens, hidden),
        "target_hidden_states_stride0": hidden,
        "cached_target_hidden_states_ptr": cached_hidden,
        "cached_target_hidden_states_stride0": cached_hidden.stride(0),
        "cached_target_hidden_states_stride1": cached_hidden.stride(1),
        "input_embeds_ptr": torch.zeros((tokens, hidden), dtype=dtype) if embeds else None,
        "input_embeds_stride0": hidden if embeds else 0,
        "cached_draft_input_embeds_ptr": cached_embeds if embeds else None,
        "cached_draft_input_embeds_stride0": cached_embeds.stride(0) if embeds else 0,
        "cached_draft_input_embeds_stride1": cached_embeds.stride(1) if embeds else 0,
        "idx_mapping_ptr": b["idx_mapping"],
        "num_rejected_ptr": b["num_rejected"],
        "query_start_loc_ptr": qsl,
        "num_speculative_steps": steps,
        "hidden_size": hidden,
        "BLOCK_SIZE_Q": block_q,
        "BLOCK_SIZE_H": block_h,
        "USE_INPUT_EMBEDS": embeds,
    }
    _check(
        "prepare_input_hidden_states_and_embeddings",
        grid,
        args,
        v2.prepare_input_hidden_states_and_embeddings_torch,
    )


def _last_token_indices(g: torch.Generator, qsl: torch.Tensor, num_reqs: int) -> torch.Tensor:
    starts, ends = qsl[:num_reqs].long(), qsl[1 : num_reqs + 1].long()
    offsets = (torch.rand(num_reqs, generator=g) * (ends - starts).float()).long()
    return (starts + offsets).to(torch.int64)


@pytest.mark.parametrize(("groups", "num_reqs"), [(1, 0), (1, 1), (2, 5), (3, 6)])
def test_pad_trailing_draft_slots(groups: int, num_reqs: int) -> None:
    b = _batch(20 + num_reqs, num_reqs, 3)
    g, tokens = b["g"], b["tokens"]
    slots = torch.randint(0, 10_000, (groups, tokens + 5), generator=g, dtype=torch.int64)
    args = {
        "slot_mappings_ptr": slots,
        "slot_mappings_stride0": slots.stride(0),
        "query_start_loc_ptr": b["query_start_loc"],
        "last_token_indices_ptr": _last_token_indices(g, b["query_start_loc"], num_reqs),
        "PAD_ID": -1,
        "BLOCK_SIZE": 4,
    }
    _check("pad_trailing_draft_slots", (groups, num_reqs), args, v2.pad_trailing_draft_slots_torch)


@pytest.mark.parametrize(
    ("num_reqs", "steps", "embeds", "dtype"),
    [
        (0, 3, True, torch.float32),
        (1, 3, True, torch.float32),
        (5, 4, False, torch.bfloat16),
        (6, 3, True, torch.float16),
        (3, 1, True, torch.float32),
    ],
)
def test_cache_inputs(num_reqs: int, steps: int, embeds: bool, dtype: torch.dtype) -> None:
    b = _batch(30 + num_reqs, num_reqs, steps)
    g, tokens, max_reqs = b["g"], b["tokens"], b["max_reqs"]
    hidden, block = 20, 8
    idx = b["idx_mapping"].clone()
    if num_reqs > 2:
        idx[2] = -1  # a padded request
    window = max(steps - 1, 0)
    cached_hidden = torch.zeros((max_reqs, window, hidden + 1), dtype=dtype)
    cached_embeds = torch.zeros((max_reqs, window, hidden + 2), dtype=dtype)
    args = {
        "draft_input_ids_ptr": torch.randint(0, 1000, (tokens,), generator=g, dtype=torch.int32),
        "draft_input_embeds_ptr": torch.randn((tokens, hidden), generator=g).to(dtype) if embeds else None,
        "draft_input_embeds_stride0": hidden if embeds else 0,
        "draft_input_hidden_states_ptr": torch.randn((tokens, hidden + 4), generator=g).to(dtype),
        "draft_input_hidden_states_stride0": hidden + 4,
        "cached_draft_input_ids_ptr": torch.full((max_reqs, window), -1, dtype=torch.int64),
        "cached_draft_input_ids_stride0": window,
        "cached_draft_input_embeds_ptr": cached_embeds if embeds else None,
        "cached_draft_input_embeds_stride0": cached_embeds.stride(0) if embeds else 0,
        "cached_draft_input_embeds_stride1": cached_embeds.stride(1) if embeds else 0,
        "cached_target_hidden_states_ptr": cached_hidden,
        "cached_target_hidden_states_stride0": cached_hidden.stride(0),
        "cached_target_hidden_states_stride1": cached_hidden.stride(1),
        "idx_mapping_ptr": idx,
        "last_token_indices_ptr": _last_token_indices(g, b["query_start_loc"], num_reqs),
        "query_start_loc_ptr": b["query_start_loc"],
        "num_speculative_steps": steps,
        "hidden_size": hidden,
        "BLOCK_SIZE": block,
        "USE_INPUT_EMBEDS": embeds,
    }
    _check("cache_inputs", (num_reqs, -(-hidden // block)), args, v2.cache_inputs_torch)


@pytest.mark.parametrize(
    ("num_reqs", "dtype"), [(0, torch.float32), (1, torch.float32), (5, torch.bfloat16), (7, torch.float16)]
)
def test_shift_input_ids_and_embeds(num_reqs: int, dtype: torch.dtype) -> None:
    b = _batch(40 + num_reqs, num_reqs, 3)
    g, tokens, max_reqs = b["g"], b["tokens"], b["max_reqs"]
    idx = b["idx_mapping"].clone()
    if num_reqs > 3:
        idx[3] = -1
    last = _last_token_indices(g, b["query_start_loc"], num_reqs)
    ids_args = {
        "input_ids_ptr": torch.randint(0, 1000, (tokens,), generator=g, dtype=torch.int32),
        "idx_mapping_ptr": idx,
        "query_start_loc_ptr": b["query_start_loc"],
        "last_token_indices_ptr": last,
        "draft_tokens_ptr": torch.randint(5000, 6000, (max_reqs,), generator=g, dtype=torch.int64),
        "BLOCK_SIZE": 2,
    }
    _check("shift_input_ids", (num_reqs,), ids_args, v2.shift_input_ids_torch)
    hidden, block_h = 20, 8
    embeds_args = {
        "input_embeds_ptr": torch.randn((tokens, hidden + 2), generator=g).to(dtype),
        "input_embeds_stride0": hidden + 2,
        "draft_embeds_ptr": torch.randn((max_reqs, hidden), generator=g).to(dtype),
        "draft_embeds_stride0": hidden,
        "idx_mapping_ptr": idx,
        "query_start_loc_ptr": b["query_start_loc"],
        "last_token_indices_ptr": last,
        "hidden_size": hidden,
        "BLOCK_SIZE_Q": 2,
        "BLOCK_SIZE_H": block_h,
    }
    _check("shift_input_embeds", (num_reqs, -(-hidden // block_h)), embeds_args, v2.shift_input_embeds_torch)
