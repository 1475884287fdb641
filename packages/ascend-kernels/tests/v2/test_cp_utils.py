"""V2 DCP local sequence lengths: the Ascend Triton kernel (interpreter) against the torch reference."""

from __future__ import annotations

import pytest
import torch

from vllm_ascend.kernels._triton.v2 import cp_utils as triton_impl
from vllm_ascend.kernels.v2 import cp_utils as v2


@pytest.mark.parametrize(
    ("num_reqs", "dcp_size", "dcp_rank", "interleave"),
    [(0, 2, 0, 1), (1, 2, 1, 1), (7, 4, 3, 2), (13, 2, 0, 16)],
)
def test_dcp_local_seq_lens(num_reqs: int, dcp_size: int, dcp_rank: int, interleave: int) -> None:
    g = torch.Generator().manual_seed(num_reqs)
    max_reqs = 16
    args = {
        "seq_lens_ptr": torch.randint(0, 200, (max_reqs,), generator=g, dtype=torch.int32),
        "dcp_size": dcp_size,
        "dcp_rank": dcp_rank,
        "cp_interleave": interleave,
        "num_reqs": num_reqs,
        "max_num_reqs": max_reqs,
        "BLOCK_SIZE": 128,
    }
    got = torch.full((max_reqs,), -1, dtype=torch.int32)
    want = got.clone()
    triton_impl.dcp_local_seq_lens((1,), out_ptr=got, **args)
    v2.dcp_local_seq_lens_torch((1,), out_ptr=want, **args)
    assert torch.equal(got, want)
    assert (want[num_reqs:] == 0).all()
    # Every token lands on exactly one rank.
    shares = torch.zeros(num_reqs, dtype=torch.int64)
    for rank in range(dcp_size):
        out = torch.empty(max_reqs, dtype=torch.int32)
        v2.dcp_local_seq_lens_torch((1,), out_ptr=out, **{**args, "dcp_rank": rank})
        shares += out[:num_reqs]
    assert torch.equal(shares, args["seq_lens_ptr"][:num_reqs].long())
