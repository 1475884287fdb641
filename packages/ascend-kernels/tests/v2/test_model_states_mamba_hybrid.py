"""V2 hybrid-Mamba accepted-token counts: the Ascend Triton kernels (interpreter) against the torch
references."""

from __future__ import annotations

import pytest
import torch

from vllm_ascend.kernels._triton.v2 import model_states_mamba_hybrid as triton_impl
from vllm_ascend.kernels.v2 import model_states_mamba_hybrid as v2


def _idx(g: torch.Generator, num_reqs: int, max_reqs: int) -> torch.Tensor:
    idx = torch.randperm(max_reqs, generator=g)[:num_reqs].to(torch.int32)
    idx[::3] = -1
    return idx


@pytest.mark.parametrize("num_reqs", [0, 1, 7, 30])
def test_scatter_num_accepted(num_reqs: int) -> None:
    g = torch.Generator().manual_seed(num_reqs)
    idx = _idx(g, num_reqs, 40)
    sampled = torch.randint(0, 5, (num_reqs,), generator=g, dtype=torch.int32)
    ref = torch.full((40,), -9, dtype=torch.int32)
    out = ref.clone()
    v2.scatter_num_accepted_torch((num_reqs,), idx, sampled, ref)
    triton_impl.scatter_num_accepted((num_reqs,), idx, sampled, out)
    assert torch.equal(out, ref)
    if num_reqs > 1:
        assert (ref != -9).any() and (ref[ref != -9] >= 1).all()


@pytest.mark.parametrize(("num_reqs", "value"), [(0, 1), (1, 3), (7, 2), (30, 4)])
def test_fill_num_accepted(num_reqs: int, value: int) -> None:
    g = torch.Generator().manual_seed(num_reqs + 100)
    idx = _idx(g, num_reqs, 40)
    ref = torch.full((40,), -9, dtype=torch.int32)
    out = ref.clone()
    v2.fill_num_accepted_torch((num_reqs,), idx, ref, value)
    triton_impl.fill_num_accepted((num_reqs,), idx, out, value)
    assert torch.equal(out, ref)
    assert int((ref == value).sum()) == int((idx >= 0).sum())
