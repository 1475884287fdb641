"""V2 RecoverSSM align postprocess: the Ascend Triton kernel (interpreter) against the torch reference."""

from __future__ import annotations

import pytest
import torch

from vllm_ascend.kernels._triton.v2 import model_states_recoverssm as triton_impl
from vllm_ascend.kernels.v2 import model_states_recoverssm as v2


@pytest.mark.parametrize(
    ("num_spec", "with_indices", "explicit"),
    [
        (0, False, False),
        (1, True, False),
        (5, False, False),
        (7, True, False),
        (7, True, True),
        (20, False, True),
    ],
)
def test_postprocess_recoverssm_align(num_spec: int, with_indices: bool, explicit: bool) -> None:
    g = torch.Generator().manual_seed(num_spec * 4 + with_indices * 2 + explicit)
    num_reqs, max_reqs = 24, 30
    idx = torch.randperm(max_reqs, generator=g)[:num_reqs].to(torch.int32)
    idx[3] = -1
    args = {
        "idx_mapping_ptr": idx,
        "num_sampled_ptr": torch.randint(0, 4, (num_reqs,), generator=g, dtype=torch.int32),
        "request_indices_ptr": (
            torch.randperm(num_reqs, generator=g)[:num_spec].to(torch.int32) if with_indices else None
        ),
        "num_computed_ptr": torch.randint(0, 90, (num_reqs,), generator=g, dtype=torch.int32),
        "state_idx_ptr": torch.full((max_reqs,), -4, dtype=torch.int32),
        "num_accepted_ptr": torch.full((max_reqs,), 7, dtype=torch.int32),
        "MAMBA_BLOCK_SIZE": 16,
        "BLOCK_TABLE_WIDTH": 5,
    }
    if explicit:
        args["HAS_REQUEST_INDICES"] = with_indices
    args["num_computed_ptr"][0] = 0
    args["num_sampled_ptr"][0] = 0
    ref = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    v2.postprocess_recoverssm_align_torch((num_spec,), **ref)
    triton_impl.postprocess_recoverssm_align((num_spec,), **args)
    assert torch.equal(args["state_idx_ptr"], ref["state_idx_ptr"])
    assert torch.equal(args["num_accepted_ptr"], ref["num_accepted_ptr"])
    if num_spec > 1:
        assert (ref["num_accepted_ptr"] == 1).any() and (ref["state_idx_ptr"] != -4).any()
