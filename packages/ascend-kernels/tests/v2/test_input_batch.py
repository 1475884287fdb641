"""V2 input-batch kernels: the Ascend Triton kernels (interpreter) against the torch references."""

from __future__ import annotations

import pytest
import torch

from vllm_ascend.kernels._triton.v2 import input_batch as triton_impl
from vllm_ascend.kernels.v2 import input_batch as v2


def _batch(seed: int, num_reqs: int, max_reqs: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    query_lens = torch.randint(1, 9, (num_reqs,), generator=g)
    qsl = torch.zeros(max_reqs + 1, dtype=torch.int32)
    qsl[1 : num_reqs + 1] = torch.cumsum(query_lens, 0)
    return {
        "pos_ptr": torch.full((int(query_lens.sum()) + 4,), -7, dtype=torch.int64),
        "seq_lens_ptr": torch.full((max_reqs,), -3, dtype=torch.int32),
        "idx_mapping_ptr": torch.randperm(max_reqs, generator=g)[:num_reqs].to(torch.int32),
        "query_start_loc_ptr": qsl,
        "num_computed_tokens_ptr": torch.randint(0, 50, (max_reqs,), generator=g, dtype=torch.int32),
        "max_num_reqs": max_reqs,
        "BLOCK_SIZE": 4,
    }


@pytest.mark.parametrize("num_reqs", [0, 1, 5, 11])
def test_prepare_pos_seq_lens(num_reqs: int) -> None:
    args = _batch(num_reqs, num_reqs, 12)
    ref = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    v2.prepare_pos_seq_lens_torch((num_reqs + 1,), **ref)
    triton_impl.prepare_pos_seq_lens((num_reqs + 1,), **args)
    assert torch.equal(args["pos_ptr"], ref["pos_ptr"])
    assert torch.equal(args["seq_lens_ptr"], ref["seq_lens_ptr"])
    assert (ref["seq_lens_ptr"][num_reqs:] == 0).all()
    if num_reqs:
        first = int(ref["num_computed_tokens_ptr"][ref["idx_mapping_ptr"][0]])
        assert ref["pos_ptr"][0] == first
