"""V2 DFlash2 candidate walk and draft-logits cache: the Ascend Triton kernels (interpreter) against the
torch references."""

from __future__ import annotations

import pytest
import torch

from vllm_ascend.kernels._triton.v2 import spec_decode_dflash2 as triton_impl
from vllm_ascend.kernels.v2 import spec_decode_dflash2 as v2


def _clone(args: dict) -> dict:
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in args.items()}


def walk_case(seed: int, num_reqs: int, num_steps: int, top_k: int, *, probabilistic: bool, use_fp64: bool):
    g = torch.Generator().manual_seed(seed)
    max_reqs, vocab = 8, 50
    flat = num_reqs * num_steps
    req = torch.randperm(max_reqs, generator=g)[:num_reqs].to(torch.int32)
    if num_reqs > 2:
        req[1] = -1
    temperature = torch.rand(max_reqs, generator=g) + 0.3
    temperature[req[0] if num_reqs else 0] = 0.0  # a greedy request
    args = {
        "scores_ptr": torch.randn(flat, top_k, top_k, generator=g),
        "candidate_ptr": torch.stack([torch.randperm(vocab, generator=g)[:top_k] for _ in range(flat)])
        if flat
        else torch.zeros(0, top_k, dtype=torch.int64),
        "sample_pos_ptr": torch.randint(1, 100, (flat,), generator=g),
        "req_state_ptr": req.repeat_interleave(num_steps),
        "temperature_ptr": temperature,
        "seeds_ptr": torch.randint(0, 2**40, (max_reqs,), generator=g),
        "tokens_ptr": torch.full((max_reqs, num_steps), -9, dtype=torch.int64),
        "realized_scores_ptr": torch.full((max_reqs, num_steps, top_k), 9.0),
        "num_steps": num_steps,
        "top_k": top_k,
        "BLOCK_K": 1 << (top_k - 1).bit_length(),
        "SAMPLE_PROBABILISTIC": probabilistic,
        "USE_FP64": use_fp64,
    }
    return (num_reqs,), args


@pytest.mark.parametrize(
    ("num_reqs", "num_steps", "top_k", "probabilistic", "use_fp64"),
    [
        (0, 2, 4, True, False),
        (1, 3, 5, True, False),
        (6, 3, 5, True, False),
        (5, 2, 4, False, False),
        (4, 3, 3, True, True),
    ],
)
def test_selector_walk(
    num_reqs: int, num_steps: int, top_k: int, probabilistic: bool, use_fp64: bool
) -> None:
    grid, args = walk_case(
        num_reqs * 5 + top_k, num_reqs, num_steps, top_k, probabilistic=probabilistic, use_fp64=use_fp64
    )
    ref = _clone(args)
    v2.selector_walk_torch(grid, **ref)
    triton_impl.selector_walk(grid, **args)
    assert torch.equal(args["tokens_ptr"], ref["tokens_ptr"])
    assert torch.equal(args["realized_scores_ptr"], ref["realized_scores_ptr"])
    if num_reqs:
        assert (ref["tokens_ptr"] != -9).any()


@pytest.mark.parametrize(
    ("num_reqs", "num_steps", "top_k", "dtype"),
    [(0, 2, 4, torch.float32), (1, 3, 5, torch.float32), (6, 3, 5, torch.float16), (5, 2, 8, torch.float32)],
)
def test_cache_draft_logits(num_reqs: int, num_steps: int, top_k: int, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(num_reqs + top_k)
    max_reqs, vocab = 8, 40
    flat = num_reqs * num_steps
    req = torch.randperm(max_reqs, generator=g)[:num_reqs].to(torch.int32)
    if num_reqs > 2:
        req[1] = -1
    args = {
        "draft_logits_ptr": torch.randn(max_reqs, num_steps, vocab + 3, generator=g).to(dtype),
        "cached_candidate_ptr": torch.stack(
            [torch.randperm(vocab, generator=g)[:top_k] for _ in range(max_reqs * num_steps)]
        ).reshape(max_reqs, num_steps, top_k),
        "candidate_ptr": torch.stack([torch.randperm(vocab, generator=g)[:top_k] for _ in range(flat)])
        if flat
        else torch.zeros(0, top_k, dtype=torch.int64),
        "scores_ptr": torch.randn(max_reqs, num_steps, top_k, generator=g),
        "req_state_ptr": req.repeat_interleave(num_steps),
        "draft_logits_stride_0": num_steps * (vocab + 3),
        "draft_logits_stride_1": vocab + 3,
        "num_steps": num_steps,
        "top_k": top_k,
        "BLOCK_K": 1 << (top_k - 1).bit_length(),
    }
    ref = _clone(args)
    v2.cache_draft_logits_torch((flat,), **ref)
    triton_impl.cache_draft_logits((flat,), **args)
    assert torch.equal(args["draft_logits_ptr"], ref["draft_logits_ptr"])
    assert torch.equal(args["cached_candidate_ptr"], ref["cached_candidate_ptr"])
    if num_reqs:
        assert torch.isinf(ref["draft_logits_ptr"]).any()
