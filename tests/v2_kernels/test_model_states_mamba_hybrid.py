"""V2 hybrid-Mamba accepted-token counts against vLLM's own kernels (run in Triton's interpreter)."""

from __future__ import annotations

import pytest
import torch

from vllm_ascend.kernels.v2 import model_states_mamba_hybrid as v2

from .vllm_oracle import clone_args, vllm_kernel

_VLLM = "vllm.v1.worker.gpu.model_states.mamba_hybrid"


def _idx(g: torch.Generator, num_reqs: int, max_reqs: int) -> torch.Tensor:
    idx = torch.randperm(max_reqs, generator=g)[:num_reqs].to(torch.int32)
    idx[::3] = -1  # filtered rows (PP)
    return idx


@pytest.mark.parametrize("num_reqs", [0, 1, 7])
def test_scatter_num_accepted_matches_vllm(num_reqs: int) -> None:
    g = torch.Generator().manual_seed(num_reqs)
    args = {
        "idx_mapping_ptr": _idx(g, num_reqs, 10),
        "num_sampled_ptr": torch.randint(0, 5, (num_reqs,), generator=g, dtype=torch.int32),
        "num_accepted_ptr": torch.full((10,), -9, dtype=torch.int32),
    }
    expected = clone_args(args)
    vllm_kernel(f"{_VLLM}._scatter_num_accepted_kernel")((num_reqs,), **expected)
    v2.scatter_num_accepted_torch((num_reqs,), **args)
    assert torch.equal(args["num_accepted_ptr"], expected["num_accepted_ptr"])
    if num_reqs > 1:
        assert (args["num_accepted_ptr"] != -9).any()


@pytest.mark.parametrize(("num_reqs", "value"), [(0, 1), (1, 3), (7, 2)])
def test_fill_num_accepted_matches_vllm(num_reqs: int, value: int) -> None:
    g = torch.Generator().manual_seed(num_reqs + 100)
    args = {
        "idx_mapping_ptr": _idx(g, num_reqs, 10),
        "num_accepted_ptr": torch.full((10,), -9, dtype=torch.int32),
        "num_sampled": value,
    }
    expected = clone_args(args)
    vllm_kernel(f"{_VLLM}._fill_num_accepted_kernel")((num_reqs,), **expected)
    v2.fill_num_accepted_torch((num_reqs,), **args)
    assert torch.equal(args["num_accepted_ptr"], expected["num_accepted_ptr"])
    assert int((args["num_accepted_ptr"] == value).sum()) == int((args["idx_mapping_ptr"] >= 0).sum())
