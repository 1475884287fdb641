"""V2's align-mode mamba kernels (prefix caching of hybrid models): the Ascend Triton kernels (interpreter)
against the torch references, on state caches laid out as vLLM describes them to its kernels (conv states
stored token-first or dim-first, temporal states with padded pages, two mamba groups)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from vllm_ascend.kernels._triton.v2 import mamba_utils as triton_impl
from vllm_ascend.kernels.v2 import mamba_utils as v2
from vllm_ascend.testing.mamba_states import MAX_REQS, run_pair
from vllm_ascend.testing.mamba_states import i32 as _i32
from vllm_ascend.testing.mamba_states import states as _states
from vllm_ascend.testing.mamba_states import tables as _tables


def _run_both(
    run_name: str, grid: tuple[int, ...], dim_first: bool, **arguments: Any
) -> list[tuple[list[torch.Tensor], dict[str, Any]]]:
    """The Triton kernel and the reference, each on its own copy of the caches and arguments."""
    kernels = (getattr(triton_impl, run_name), getattr(v2, f"{run_name}_torch"))
    return run_pair(kernels, grid, dim_first, **arguments)


def _assert_same(results: list[tuple[list[torch.Tensor], dict[str, Any]]]) -> None:
    (caches, args), (ref_caches, ref_args) = results
    for got, want in zip(caches, ref_caches, strict=True):
        assert torch.equal(got, want)
    for name, value in args.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, ref_args[name]), name


@pytest.mark.parametrize("dim_first", [False, True])
@pytest.mark.parametrize("mapping", [True, False])
def test_precopy_matches_the_reference(dim_first: bool, mapping: bool) -> None:
    # Slots: 0 crosses (bias 0), 1 fresh (-1), 2 stays in its column, 3 crosses with 2 accepted tokens,
    # 4 crosses with bias 1, 5 not in the batch.
    src = _i32([1, -1, 2, 0, 3, 4])
    dst = _i32([2, 0, 2, 2, 4, 5])
    bias = _i32([0, 0, 0, 2, 1, 0])
    idx = _i32([4, 0, 1, 3, 2]) if mapping else None
    results = _run_both(
        "precopy_mamba_align_fused",
        (5, 4, 16),
        dim_first,
        mamba_state_idx_ptr=dst,
        src_col_ptr=src,
        token_bias_ptr=bias,
        idx_mapping_ptr=idx,
        num_reqs=5,
        HAS_IDX_MAPPING=mapping,
    )
    _assert_same(results)
    caches, fresh, tables = results[1][0], _states(11, dim_first), _tables()
    # Slot 0 (every state, no shift): its column 2 now holds what its column 1 held.
    for (group, before, _), after in zip(fresh, caches, strict=True):
        table = tables[group]
        assert torch.equal(after[int(table[0, 2])], before[int(table[0, 1])])
        assert torch.equal(after[int(table[5, 5])], before[int(table[5, 5])])  # slot 5 untouched


@pytest.mark.parametrize("dim_first", [False, True])
@pytest.mark.parametrize("precomputed", [True, False])
def test_postprocess_matches_the_reference(dim_first: bool, precomputed: bool) -> None:
    """Rows: a boundary reached with nothing accepted past it in a new column; reached in the running column
    (only the accepted count reset); not reached; reached with 2 tokens accepted past it (the conv window
    shifted, the temporal state taken 2 columns on); reached in the running column with a shift (a left shift
    inside one block)."""
    block_size = 4
    accepted = _i32([1, 1, 1, 3, 2, 1])
    src = _i32([0, 2, 0, 0, 2, 0])
    running = [8, 12, 5, 6, 11, 0]  # tokens the running state holds
    new_computed = [r + a - 1 for r, a in zip(running, accepted.tolist(), strict=True)]
    scheduled = _i32([3, 3, 3, 5, 4, 0])
    draft = _i32([0, 0, 0, 2, 1, 0])
    computed = (
        new_computed
        if precomputed
        else [r - s + d for r, s, d in zip(running, scheduled.tolist(), draft.tolist(), strict=True)]
    )
    results = _run_both(
        "postprocess_mamba_fused",
        (5, 4, 16),
        dim_first,
        num_accepted_tokens_ptr=accepted,
        mamba_state_idx_ptr=src,
        num_scheduled_tokens_ptr=None if precomputed else scheduled,
        num_computed_tokens_ptr=_i32(computed),
        num_draft_tokens_ptr=None if precomputed else draft,
        num_accepted_tokens_out_ptr=_i32([9] * MAX_REQS),
        idx_mapping_ptr=_i32([0, 1, 2, 3, 4]) if precomputed else None,
        num_reqs=5,
        block_size=block_size,
        HAS_IDX_MAPPING=precomputed,
        PRECOMPUTED_NEW_COMPUTED=precomputed,
    )
    _assert_same(results)
    caches, args = results[1]
    assert args["num_accepted_tokens_out_ptr"].tolist() == [9, 1, 9, 9, 1, 9]
    group, before, _ = _states(11, dim_first)[1]  # a temporal state: row 3 takes column 0 + 2 into column 1
    table = _tables()[group]
    assert torch.equal(caches[1][int(table[3, 1])], before[int(table[3, 2])])


@pytest.mark.parametrize("num_reqs", [0, 1, 5])
def test_preprocess_matches_the_reference(num_reqs: int) -> None:
    g = torch.Generator().manual_seed(num_reqs)
    idx = torch.randperm(8, generator=g)[:num_reqs].int()
    state_idx = torch.randint(-1, 4, (8,), generator=g, dtype=torch.int32)
    computed = torch.randint(0, 40, (8,), generator=g, dtype=torch.int32)
    qsl = torch.cat(
        [torch.zeros(1, dtype=torch.int32), torch.randint(1, 9, (num_reqs,), generator=g).cumsum(0).int()]
    )
    accepted = torch.randint(1, 4, (8,), generator=g, dtype=torch.int32)
    outputs = []
    for run in (triton_impl.preprocess_mamba_align_fused, v2.preprocess_mamba_align_fused_torch):
        args = [idx, state_idx.clone(), computed, qsl, accepted.clone(), _i32([-7] * 8), _i32([-7] * 8)]
        run((1,), *args, num_reqs=num_reqs, BLOCK_SIZE=256, MAMBA_BLOCK_SIZE=16)
        outputs.append(args)
    for got, want in zip(*outputs, strict=True):
        assert torch.equal(got, want)
    if num_reqs:
        r = int(idx[0])
        assert int(outputs[1][5][r]) == int(state_idx[r])  # the column left behind
        query = int(qsl[1] - qsl[0])
        assert int(outputs[1][1][r]) == (int(computed[r]) + query + 15) // 16 - 1
