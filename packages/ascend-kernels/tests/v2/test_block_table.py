"""V2 block-table kernels: the Ascend Triton kernels (interpreter) against the torch references, block
tables reached through pointer arrays (one per KV-cache group)."""

from __future__ import annotations

import pytest
import torch

from vllm_ascend.kernels._triton.v2 import block_table as triton_impl
from vllm_ascend.kernels.v2 import block_table as v2

# every case under both launch grids and both reference forms
pytestmark = pytest.mark.usefixtures("launch_grid", "reference_form")


def _ptrs(tables: list[torch.Tensor]) -> torch.Tensor:
    return torch.tensor([t.data_ptr() for t in tables], dtype=torch.uint64)


@pytest.mark.parametrize(("num_reqs", "padded"), [(0, 0), (0, 3), (1, 1), (5, 8), (9, 9)])
def test_gather_block_tables(num_reqs: int, padded: int) -> None:
    g = torch.Generator().manual_seed(num_reqs * 10 + padded)
    max_reqs, widths = 12, (11, 5, 7)
    src = [torch.randint(1, 99, (max_reqs, w), generator=g, dtype=torch.int32) for w in widths]
    counts = torch.stack(
        [torch.randint(0, w + 1, (max_reqs,), generator=g, dtype=torch.int32) for w in widths]
    )
    req = torch.randperm(max_reqs, generator=g)[:padded].to(torch.int32)
    results = []
    for run in (triton_impl.gather_block_tables, v2.gather_block_tables_torch):
        dst = [torch.full((max_reqs, w), -9, dtype=torch.int32) for w in widths]
        run(
            (len(widths), padded),
            batch_idx_to_req_idx=req,
            src_block_table_ptrs=_ptrs(src),
            dst_block_table_ptrs=_ptrs(dst),
            block_table_strides=torch.tensor(widths, dtype=torch.int64),
            num_blocks_ptr=counts,
            num_blocks_stride=counts.stride(0),
            num_reqs=num_reqs,
            BLOCK_SIZE=1024,
        )
        results.append(dst)
    for got, want in zip(*results, strict=True):
        assert torch.equal(got, want)
        assert (want[num_reqs:padded] == 0).all()
        assert (want[padded:] == -9).all()
    if num_reqs:
        row = int(req[0])
        n = int(counts[0, row])
        assert torch.equal(results[1][0][0, :n], src[0][row, :n])


@pytest.mark.parametrize(
    ("num_reqs", "cp_size", "cp_rank", "interleave"),
    [(0, 1, 0, 1), (1, 1, 0, 1), (5, 1, 0, 1), (6, 2, 1, 2), (4, 4, 2, 1)],
)
def test_compute_slot_mappings(num_reqs: int, cp_size: int, cp_rank: int, interleave: int) -> None:
    g = torch.Generator().manual_seed(num_reqs + 7 * cp_size)
    max_reqs, width, max_tokens = 8, 16, 64
    tables = [torch.randint(0, 50, (max_reqs, width), generator=g, dtype=torch.int32) for _ in range(3)]
    idx = torch.randperm(max_reqs, generator=g)[:num_reqs].to(torch.int32)
    if num_reqs > 2:
        idx[1] = -1  # a dummy request
    query_lens = torch.randint(1, 9, (num_reqs,), generator=g)
    qsl = torch.zeros(num_reqs + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(query_lens, 0)
    args = {
        "max_num_tokens": max_tokens,
        "idx_mapping": idx,
        "query_start_loc": qsl,
        "pos": torch.randint(0, 60, (max_tokens,), generator=g, dtype=torch.int64),
        "block_table_ptrs": _ptrs(tables),
        "block_table_strides": torch.tensor([width] * 3, dtype=torch.int64),
        "block_sizes": torch.tensor([16, 4, 8], dtype=torch.int32),
        "slot_mapping_enabled": torch.tensor([True, False, True]),
        "dcp_sharded": torch.tensor([True, True, False]),
        "slot_mappings_stride": max_tokens,
        "cp_rank": cp_rank,
        "CP_SIZE": cp_size,
        "CP_INTERLEAVE": interleave,
        "PAD_ID": -1,
        "TRITON_BLOCK_SIZE": 1024,
    }
    outputs = []
    for run in (triton_impl.compute_slot_mappings, v2.compute_slot_mappings_torch):
        out = torch.full((3, max_tokens), 77, dtype=torch.int64)
        run((3, num_reqs + 1), slot_mappings_ptr=out, **args)
        outputs.append(out)
    assert torch.equal(outputs[0], outputs[1])
    total = int(qsl[-1])
    assert (outputs[1][:, total:] == -1).all()
    assert (outputs[1][1] == -1).all()  # group 1: slot mapping disabled
    if num_reqs:
        assert (outputs[1][0, :total] >= 0).any()


def test_gather_block_tables_reference_num_reqs_past_grid() -> None:
    """``num_reqs`` beyond the grid's rows: only the grid's rows are gathered, none zeroed; rows copy only
    their ``num_blocks`` leading entries and keep the rest."""
    src = torch.arange(1, 25, dtype=torch.int32).view(4, 6)
    dst = torch.full((4, 6), -9, dtype=torch.int32)
    v2.gather_block_tables_torch(
        (1, 2),
        batch_idx_to_req_idx=torch.tensor([3, 1, 0], dtype=torch.int32),
        src_block_table_ptrs=_ptrs([src]),
        dst_block_table_ptrs=_ptrs([dst]),
        block_table_strides=torch.tensor([6]),
        num_blocks_ptr=torch.tensor([[6, 2, 0, 3]], dtype=torch.int32),
        num_blocks_stride=4,
        num_reqs=3,
        BLOCK_SIZE=1024,
    )
    assert dst[0].tolist() == [19, 20, 21, -9, -9, -9]
    assert dst[1].tolist() == [7, 8, -9, -9, -9, -9]
    assert (dst[2:] == -9).all()


class _Launches:
    """Stands for a Triton kernel: records each launch's grid and ``PER_ITEM``, then runs it."""

    def __init__(self, kernel) -> None:
        self.kernel, self.seen = kernel, []

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.seen.append((tuple(grid), kwargs["PER_ITEM"]))
            return self.kernel[grid](*args, **kwargs)

        return run


def test_work_grid_launches_vllms_2d_grid(launch_grid: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the "work" grid (CUDA's) both kernels take vLLM's grid, a program per (group, row) with no
    grid-stride loop (the tests above compare that variant with the references); on "cores" a 1-D grid
    of at most the interpreter's programs."""
    gather = _Launches(triton_impl._gather_block_tables_kernel)
    slots = _Launches(triton_impl._compute_slot_mappings_kernel)
    monkeypatch.setattr(triton_impl, "_gather_block_tables_kernel", gather)
    monkeypatch.setattr(triton_impl, "_compute_slot_mappings_kernel", slots)
    test_gather_block_tables(5, 8)
    test_compute_slot_mappings(6, 2, 1, 2)
    if launch_grid == "work":
        assert gather.seen == [((3, 8), True)] and slots.seen == [((3, 7), True)]
    else:
        assert gather.seen == [((4,), False)] and slots.seen == [((4,), False)]
