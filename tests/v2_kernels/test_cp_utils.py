"""V2 DCP local sequence lengths against vLLM's own kernel (Triton's interpreter)."""

from __future__ import annotations

import pytest
import torch

from vllm_ascend.kernels.v2 import cp_utils

from .vllm_oracle import clone_args, vllm_kernel


@pytest.mark.parametrize(
    ("num_reqs", "dcp_size", "dcp_rank", "interleave"),
    [(7, 2, 0, 1), (0, 2, 1, 4), (10, 4, 3, 2), (1, 2, 1, 1)],
)
def test_dcp_local_seq_lens_matches_vllm(
    num_reqs: int, dcp_size: int, dcp_rank: int, interleave: int
) -> None:
    g = torch.Generator().manual_seed(dcp_size + dcp_rank)
    args = {
        "out_ptr": torch.full((10,), -1, dtype=torch.int32),
        "seq_lens_ptr": torch.randint(0, 100, (10,), generator=g, dtype=torch.int32),
        "dcp_size": dcp_size,
        "dcp_rank": dcp_rank,
        "cp_interleave": interleave,
        "num_reqs": num_reqs,
        "max_num_reqs": 10,
        "BLOCK_SIZE": 4,
    }
    expected = clone_args(args)
    vllm_kernel("vllm.v1.worker.gpu.cp_utils._dcp_local_seq_lens_kernel")((3,), **expected)
    cp_utils.dcp_local_seq_lens_torch((3,), **args)
    assert torch.equal(args["out_ptr"], expected["out_ptr"])
    assert (args["out_ptr"][num_reqs:] == 0).all()
