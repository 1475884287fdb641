"""V2 thinking-budget kernels: the Ascend Triton kernels (interpreter) against the torch references."""

from __future__ import annotations

import pytest
import torch

from vllm_ascend.kernels._triton.v2 import sample_thinking_budget as triton_impl
from vllm_ascend.kernels.v2 import sample_thinking_budget as v2

START = [7, 8]
NATURAL_END = [9, 10]
END = [11, 12, 13]


def _clone(args: dict) -> dict:
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in args.items()}


def _state(seed: int, num_reqs: int, max_reqs: int = 10, max_len: int = 48):
    g = torch.Generator().manual_seed(seed)
    all_tokens = torch.randint(6, 14, (max_reqs, max_len), generator=g, dtype=torch.int32)
    total = torch.randint(0, max_len - 8, (max_reqs,), generator=g, dtype=torch.int32)
    budget = torch.randint(-1, 6, (max_reqs,), generator=g, dtype=torch.int32)
    scan = torch.randint(0, max_len, (max_reqs,), generator=g, dtype=torch.int32)
    mode = torch.randint(0, 3, (max_reqs,), generator=g)  # cold, warm, reset (scan past total)
    scan = torch.where(mode == 0, 0, torch.minimum(scan, total + (mode == 2) * 5)).to(torch.int32)
    last_start = torch.where(mode == 0, -1, torch.randint(-1, 20, (max_reqs,), generator=g)).to(torch.int32)
    last_end = torch.where(mode == 0, -1, torch.randint(-1, 20, (max_reqs,), generator=g)).to(torch.int32)
    req_ids = torch.randperm(max_reqs, generator=g)[:num_reqs].to(torch.int32)
    return g, all_tokens, total, budget, scan, last_start, last_end, req_ids


@pytest.mark.parametrize(
    ("num_reqs", "natural_len", "block"), [(0, 1, 8), (1, 1, 8), (10, 1, 8), (10, 2, 4), (10, 2, 64)]
)
def test_update_committed_marker_cache(num_reqs: int, natural_len: int, block: int) -> None:
    changed = 0
    for seed in range(3):
        _, all_tokens, total, budget, scan, last_start, last_end, req_ids = _state(seed * 7 + block, num_reqs)
        args = {
            "req_ids_ptr": req_ids,
            "thinking_token_budget_ptr": budget,
            "all_token_ids_ptr": all_tokens,
            "all_token_ids_stride": all_tokens.stride(0),
            "total_len_ptr": total,
            "cached_last_start_ptr": last_start.clone(),
            "cached_last_end_ptr": last_end,
            "cached_scan_pos_ptr": scan,
            "reasoning_start_token_ids_ptr": torch.tensor(START, dtype=torch.int32),
            "natural_reasoning_end_token_ids_ptr": torch.tensor(NATURAL_END[:natural_len], dtype=torch.int32),
            "START_LEN": len(START),
            "NATURAL_END_LEN": natural_len,
            "MAX_LEN": max(len(START), natural_len),
            "BLOCK": block,
        }
        ref = _clone(args)
        v2.update_committed_marker_cache_torch((num_reqs,), **ref)
        triton_impl.update_committed_marker_cache((num_reqs,), **args)
        for name in ("cached_last_start_ptr", "cached_last_end_ptr", "cached_scan_pos_ptr"):
            assert torch.equal(args[name], ref[name]), name
        changed += int((ref["cached_last_start_ptr"] != last_start).sum())
    if num_reqs > 1:
        assert changed > 0


def _budget_case(seed: int, num_reqs: int, end_len: int, dtype: torch.dtype) -> tuple[tuple, dict]:
    g, all_tokens, total, budget, _, last_start, last_end, req_ids = _state(seed, num_reqs)
    drafts = torch.randint(0, 4, (num_reqs,), generator=g)
    local_pos = torch.cat([torch.arange(int(d) + 1) for d in drafts]) if num_reqs else torch.zeros(0)
    expanded = torch.repeat_interleave(req_ids, drafts + 1) if num_reqs else req_ids
    num_tokens = int(local_pos.numel())
    args = {
        "logits_ptr": torch.randn(num_tokens, 20, generator=g).to(dtype),
        "logits_stride": 20,
        "expanded_idx_mapping_ptr": expanded.to(torch.int32),
        "thinking_token_budget_ptr": budget,
        "all_token_ids_ptr": all_tokens,
        "all_token_ids_stride": all_tokens.stride(0),
        "total_len_ptr": total,
        "input_ids_ptr": torch.randint(6, 14, (num_tokens,), generator=g, dtype=torch.int32),
        "expanded_local_pos_ptr": local_pos.to(torch.int32),
        "cached_last_start_ptr": last_start,
        "cached_last_end_ptr": last_end,
        "reasoning_start_token_ids_ptr": torch.tensor(START, dtype=torch.int32),
        "natural_reasoning_end_token_ids_ptr": torch.tensor(NATURAL_END[:1], dtype=torch.int32),
        "reasoning_end_token_ids_ptr": torch.tensor(END[:end_len], dtype=torch.int32),
        "START_LEN": len(START),
        "NATURAL_END_LEN": 1,
        "END_LEN": end_len,
    }
    return (num_tokens,), args


@pytest.mark.parametrize(
    ("num_reqs", "end_len", "dtype"),
    [
        (0, 3, torch.float32),
        (1, 3, torch.float32),
        (10, 3, torch.float32),
        (10, 1, torch.float32),
        (10, 2, torch.float16),
    ],
)
def test_thinking_budget(num_reqs: int, end_len: int, dtype: torch.dtype) -> None:
    forced = 0
    for seed in range(3):
        grid, args = _budget_case(seed * 31 + num_reqs + end_len, num_reqs, end_len, dtype)
        ref = _clone(args)
        v2.thinking_budget_torch(grid, **ref)
        triton_impl.thinking_budget(grid, **args)
        assert torch.equal(args["logits_ptr"], ref["logits_ptr"])
        forced += int((ref["logits_ptr"] == 1.0e9).sum()) if dtype == torch.float32 else 0
    if num_reqs > 1 and dtype == torch.float32:
        assert forced > 0
