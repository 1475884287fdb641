"""V2 rejection-sampler kernels (flatten sampled, gather draft sampled): the Ascend Triton kernels
(interpreter) against the torch references."""

from __future__ import annotations

import pytest
import torch

from vllm_ascend.kernels._triton.v2 import spec_decode_rejection_sampler as triton_impl
from vllm_ascend.kernels.v2 import spec_decode_rejection_sampler as v2


def _cu(counts: torch.Tensor) -> torch.Tensor:
    cu = torch.zeros(counts.numel() + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(counts, 0)
    return cu


def _same(name: str, grid: tuple[int, ...], args: dict) -> dict:
    ref = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    getattr(v2, f"{name}_torch")(grid, **ref)
    getattr(triton_impl, name)(grid, **args)
    for key, value in args.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, ref[key]), key
    return ref


@pytest.mark.parametrize(("num_reqs", "width"), [(0, 3), (1, 1), (6, 4), (11, 9)])
def test_flatten_sampled(num_reqs: int, width: int) -> None:
    g = torch.Generator().manual_seed(num_reqs)
    num_logits = torch.randint(1, width + 1, (num_reqs,), generator=g)
    num_sampled = torch.minimum(torch.randint(0, width + 1, (num_reqs,), generator=g), num_logits)
    cu = _cu(num_logits)
    args = {
        "flat_sampled_ptr": torch.zeros(int(cu[-1]), dtype=torch.int64),
        "sampled_ptr": torch.randint(1, 1000, (num_reqs, width), generator=g, dtype=torch.int64),
        "sampled_stride": width,
        "num_sampled_ptr": num_sampled.to(torch.int32),
        "cu_num_logits_ptr": cu,
    }
    ref = _same("flatten_sampled", (num_reqs,), args)
    assert int((ref["flat_sampled_ptr"] != 0).sum()) == int(num_sampled.sum())


@pytest.mark.parametrize(
    ("num_reqs", "block", "short_grid"), [(0, 4, False), (1, 4, False), (5, 4, False), (9, 8, True)]
)
def test_gather_draft_sampled(num_reqs: int, block: int, short_grid: bool) -> None:
    g = torch.Generator().manual_seed(100 + num_reqs)
    max_reqs, steps = 12, 3
    num_logits = torch.randint(2, steps + 2, (num_reqs,), generator=g)
    total = int(num_logits.sum())
    query_lens = num_logits + torch.randint(0, 3, (num_reqs,), generator=g)
    qsl = _cu(query_lens)
    idx = torch.randperm(max_reqs, generator=g)[:num_reqs].to(torch.int32)
    prefill = torch.randint(5, 20, (max_reqs,), generator=g, dtype=torch.int32)
    num_tokens = int(qsl[-1])
    start_pos = (
        prefill[idx.long()]
        - (query_lens - num_logits).to(torch.int32)
        + (torch.arange(num_reqs, dtype=torch.int32) % 4 - 2)
    )
    owner = torch.repeat_interleave(torch.arange(num_reqs), query_lens)
    positions = start_pos[owner].long() + torch.arange(num_tokens) - qsl[owner].long()
    logits_indices = torch.cat(
        [torch.arange(int(qsl[r + 1]) - int(num_logits[r]), int(qsl[r + 1])) for r in range(num_reqs)]
        or [torch.zeros(0, dtype=torch.int64)]
    )
    expanded_owner = torch.repeat_interleave(torch.arange(num_reqs), num_logits)
    args = {
        "draft_sampled_ptr": torch.full((total,), -9, dtype=torch.int32),
        "pos_ptr": torch.full((total,), -9, dtype=torch.int64),
        "input_ids_ptr": torch.randint(0, 1000, (num_tokens,), generator=g, dtype=torch.int32),
        "positions_ptr": positions,
        "logits_indices_ptr": logits_indices.to(torch.int64),
        "expanded_idx_mapping_ptr": idx[expanded_owner].to(torch.int32),
        "expanded_local_pos_ptr": (torch.arange(total) - _cu(num_logits)[expanded_owner].long()).to(
            torch.int32
        ),
        "prefill_len_ptr": prefill,
        "num_logits": total,
        "BLOCK_SIZE": block,
    }
    programs = (total + block - 1) // block - (1 if short_grid else 0)
    ref = _same("gather_draft_sampled", (programs,), args)
    covered = min(total, programs * block)
    assert (ref["draft_sampled_ptr"][covered:] == -9).all()
    if num_reqs:
        assert (ref["draft_sampled_ptr"][:covered] == -1).any()
        assert (ref["pos_ptr"][:covered] >= 0).all()
