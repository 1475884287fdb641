"""V2's align-mode mamba kernels (prefix caching of hybrid models): the torch references against vLLM's own
kernels of ``vllm/v1/worker/mamba_utils.py`` (run in Triton's interpreter), on state caches laid out as vLLM
describes them (conv states token-first and dim-first, padded temporal pages, two mamba groups), and V1's
``batch_memcpy`` against vLLM's ``batch_memcpy_kernel``."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from vllm_ascend.kernels import state_copy
from vllm_ascend.kernels.v2 import mamba_utils as v2
from vllm_ascend.testing.mamba_states import MAX_REQS, run_pair
from vllm_ascend.testing.mamba_states import i32 as _i32
from vllm_ascend.testing.mamba_states import states as _states

from .vllm_oracle import vllm_kernel

_VLLM = "vllm.v1.worker.mamba_utils"


def _against_vllm(name: str, grid: tuple[int, ...], dim_first: bool, **arguments: Any) -> list[torch.Tensor]:
    """vLLM's kernel and the reference, each on its own copy of the caches and arguments; asserts they
    leave them equal and returns the reference's caches."""
    kernels = (vllm_kernel(f"{_VLLM}.{name}_kernel"), getattr(v2, f"{name}_torch"))
    (caches, args), (ref_caches, ref_args) = run_pair(kernels, grid, dim_first, **arguments)
    for got, want in zip(caches, ref_caches, strict=True):
        assert torch.equal(got, want)
    for key, value in args.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, ref_args[key]), key
    return ref_caches


@pytest.mark.parametrize("dim_first", [False, True])
def test_precopy_matches_vllm(dim_first: bool) -> None:
    caches = _against_vllm(
        "precopy_mamba_align_fused",
        (5, 4, 16),
        dim_first,
        mamba_state_idx_ptr=_i32([2, 0, 2, 2, 4, 5]),
        src_col_ptr=_i32([1, -1, 2, 0, 3, 4]),
        token_bias_ptr=_i32([0, 0, 0, 2, 1, 0]),
        idx_mapping_ptr=_i32([4, 0, 1, 3, 2]),
        num_reqs=5,
        HAS_IDX_MAPPING=True,
    )
    assert any(
        not torch.equal(after, before)
        for after, (_, before, _) in zip(caches, _states(11, dim_first), strict=True)
    )


@pytest.mark.parametrize("dim_first", [False, True])
@pytest.mark.parametrize("precomputed", [True, False])
def test_postprocess_matches_vllm(dim_first: bool, precomputed: bool) -> None:
    accepted = _i32([1, 1, 1, 3, 2, 1])
    running = [8, 12, 5, 6, 11, 0]
    scheduled, draft = _i32([3, 3, 3, 5, 4, 0]), _i32([0, 0, 0, 2, 1, 0])
    new_computed = [r + a - 1 for r, a in zip(running, accepted.tolist(), strict=True)]
    computed = (
        new_computed
        if precomputed
        else [r - s + d for r, s, d in zip(running, scheduled.tolist(), draft.tolist(), strict=True)]
    )
    caches = _against_vllm(
        "postprocess_mamba_fused",
        (5, 4, 16),
        dim_first,
        num_accepted_tokens_ptr=accepted,
        mamba_state_idx_ptr=_i32([0, 2, 0, 0, 2, 0]),
        num_scheduled_tokens_ptr=None if precomputed else scheduled,
        num_computed_tokens_ptr=_i32(computed),
        num_draft_tokens_ptr=None if precomputed else draft,
        num_accepted_tokens_out_ptr=_i32([9] * MAX_REQS),
        idx_mapping_ptr=_i32([0, 1, 2, 3, 4]) if precomputed else None,
        num_reqs=5,
        block_size=4,
        HAS_IDX_MAPPING=precomputed,
        PRECOMPUTED_NEW_COMPUTED=precomputed,
    )
    assert any(  # the accepted-token states were copied into their blocks (equal to vLLM's, checked above)
        not torch.equal(after, before)
        for after, (_, before, _) in zip(caches, _states(11, dim_first), strict=True)
    )


@pytest.mark.parametrize("num_reqs", [1, 5])
def test_preprocess_matches_vllm(num_reqs: int) -> None:
    g = torch.Generator().manual_seed(num_reqs)
    args = {
        "idx_mapping_ptr": torch.randperm(8, generator=g)[:num_reqs].int(),
        "state_idx_ptr": torch.randint(-1, 4, (8,), generator=g, dtype=torch.int32),
        "num_computed_tokens_ptr": torch.randint(0, 40, (8,), generator=g, dtype=torch.int32),
        "query_start_loc_ptr": torch.cat(
            [torch.zeros(1, dtype=torch.int32), torch.randint(1, 9, (num_reqs,), generator=g).cumsum(0).int()]
        ),
        "num_accepted_tokens_ptr": torch.randint(1, 4, (8,), generator=g, dtype=torch.int32),
        "src_col_ptr": _i32([-7] * 8),
        "src_off_ptr": _i32([-7] * 8),
        "num_reqs": num_reqs,
        "BLOCK_SIZE": 256,
        "MAMBA_BLOCK_SIZE": 16,
    }
    expected = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    vllm_kernel(f"{_VLLM}.preprocess_mamba_align_fused_kernel")((1,), **expected)
    v2.preprocess_mamba_align_fused_torch((1,), **args)
    for key, value in args.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, expected[key]), key
    assert (args["src_col_ptr"] != -7).sum() == num_reqs


def test_batch_memcpy_matches_vllm() -> None:
    g = torch.Generator().manual_seed(0)
    start = torch.randint(0, 256, (6, 100), generator=g, dtype=torch.uint8)
    blocks = [start.clone(), start.clone()]
    copies = [(0, 0, 1, 0, 64), (2, 3, 3, 1, 37), (4, 0, 0, 0, 100), (5, 3, 5, 0, 90)]
    for run, data in ((vllm_kernel(f"{_VLLM}.batch_memcpy_kernel"), blocks[0]), (None, blocks[1])):
        base = data.data_ptr()
        src = torch.tensor([base + sb * 100 + so for sb, so, *_ in copies], dtype=torch.uint64)
        dst = torch.tensor([base + db * 100 + do for *_, db, do, _n in copies], dtype=torch.uint64)
        sizes = torch.tensor([n for *_, n in copies], dtype=torch.int32)
        if run is None:
            state_copy.batch_memcpy_torch(src, dst, sizes)
        else:
            run((len(copies),), src, dst, sizes, BLOCK_SIZE=16)
    assert torch.equal(blocks[0], blocks[1])
    assert torch.equal(blocks[1][1, :64], start[0, :64]) and torch.equal(blocks[1][5, :90], start[5, 3:93])
