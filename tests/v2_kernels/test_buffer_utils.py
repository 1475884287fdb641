"""V2 staged-write override against vLLM's own kernel (run in Triton's interpreter): one buffer, and one
buffer per KV-cache group through a pointer array."""

from __future__ import annotations

import pytest
import torch

from vllm_ascend.kernels.v2 import buffer_utils

from .vllm_oracle import vllm_kernel


def _ptrs(tables: list[torch.Tensor]) -> torch.Tensor:
    return torch.tensor([t.data_ptr() for t in tables], dtype=torch.uint64)


@pytest.mark.parametrize("multi_group", [False, True])
def test_apply_write_matches_vllm(multi_group: bool) -> None:
    lens = torch.tensor([3, 0, 5, 2])
    cu = torch.cumsum(lens, 0).to(torch.int32)
    results = []
    for run in (vllm_kernel("vllm.v1.worker.gpu.buffer_utils._apply_write_kernel"), None):
        outputs = [torch.zeros((6, 10), dtype=torch.int32), torch.zeros((4, 12), dtype=torch.int32)]
        common = {
            "write_indices_ptr": torch.tensor([0, 3, 5, 3], dtype=torch.int32),
            "write_starts_ptr": torch.tensor([1, 0, 4, 7], dtype=torch.int32),
            "write_contents_ptr": torch.arange(1, int(cu[-1]) + 1, dtype=torch.int32),
            "write_cu_lens_ptr": cu,
            "BLOCK_SIZE": 4,
            "MULTI_GROUP": multi_group,
        }
        if multi_group:
            common.update(
                output_ptr=_ptrs(outputs),
                output_stride=torch.tensor([10, 12], dtype=torch.int64),
                write_group_ids_ptr=torch.tensor([0, 1, 0, 1], dtype=torch.int32),
            )
        else:
            common.update(output_ptr=outputs[0], output_stride=10, write_group_ids_ptr=None)
        (run or buffer_utils.apply_write_torch)((4,), **common)
        results.append(outputs)
    for got, want in zip(results[1], results[0], strict=True):
        assert torch.equal(got, want)
    assert results[1][0].abs().sum() > 0
