"""V2 staged writes: the Ascend Triton kernel (interpreter) against the torch reference, one buffer and
per-group buffers through a pointer array."""

from __future__ import annotations

import pytest
import torch

from vllm_ascend.kernels._triton.v2 import buffer_utils as triton_impl
from vllm_ascend.kernels.v2 import buffer_utils as v2


def _ptrs(tables: list[torch.Tensor]) -> torch.Tensor:
    return torch.tensor([t.data_ptr() for t in tables], dtype=torch.uint64)


@pytest.mark.parametrize("multi_group", [False, True])
@pytest.mark.parametrize("num_writes", [0, 1, 7])
def test_apply_write(multi_group: bool, num_writes: int) -> None:
    g = torch.Generator().manual_seed(num_writes + 100 * multi_group)
    widths, rows = (10, 12, 6), 6
    lens = torch.randint(0, 6, (num_writes,), generator=g)
    groups = torch.randint(0, 3 if multi_group else 1, (num_writes,), generator=g, dtype=torch.int32)
    width = torch.tensor(widths)[groups.long()]
    starts = (torch.rand(num_writes, generator=g) * (width - lens + 1)).long().to(torch.int32)
    cu = torch.cumsum(lens, 0).to(torch.int32)
    contents = torch.randint(1, 1000, (int(lens.sum()),), generator=g, dtype=torch.int32)
    indices = torch.randint(0, rows, (num_writes,), generator=g, dtype=torch.int32)
    results = []
    for run in (triton_impl.apply_write, v2.apply_write_torch):
        outputs = [torch.zeros((rows, w), dtype=torch.int32) for w in widths]
        common = {
            "write_indices_ptr": indices,
            "write_starts_ptr": starts,
            "write_contents_ptr": contents,
            "write_cu_lens_ptr": cu,
            "BLOCK_SIZE": 1024,
            "MULTI_GROUP": multi_group,
        }
        if multi_group:
            common.update(
                output_ptr=_ptrs(outputs),
                output_stride=torch.tensor(widths, dtype=torch.int64),
                write_group_ids_ptr=groups,
            )
        else:
            common.update(output_ptr=outputs[0], output_stride=widths[0], write_group_ids_ptr=None)
        run((num_writes,), **common)
        results.append(outputs)
    for got, want in zip(*results, strict=True):
        assert torch.equal(got, want)
    written = sum(int((o != 0).sum()) for o in results[1])
    assert (written > 0) == (int(lens.sum()) > 0)


def test_apply_write_single_buffer_other_dtype() -> None:
    # A one-buffer StagedWriteTensor may hold any dtype (the contents come in that dtype).
    lens = torch.tensor([2, 3])
    results = []
    for run in (triton_impl.apply_write, v2.apply_write_torch):
        out = torch.zeros((4, 8), dtype=torch.int64)
        run(
            (2,),
            output_ptr=out,
            output_stride=8,
            write_indices_ptr=torch.tensor([3, 0], dtype=torch.int32),
            write_starts_ptr=torch.tensor([5, 1], dtype=torch.int32),
            write_contents_ptr=torch.tensor([2**40, 7, 8, 9, 10], dtype=torch.int64),
            write_cu_lens_ptr=torch.cumsum(lens, 0).to(torch.int32),
            write_group_ids_ptr=None,
            BLOCK_SIZE=1024,
            MULTI_GROUP=False,
        )
        results.append(out)
    assert torch.equal(results[0], results[1])
    assert int(results[1][3, 5]) == 2**40 and int(results[1][0, 3]) == 10
