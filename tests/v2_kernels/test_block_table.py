"""V2 block-table overrides against vLLM's own kernels (run in Triton's interpreter): block tables
reached through pointer arrays, one per KV-cache group."""

from __future__ import annotations

import pytest
import torch

from vllm_ascend.kernels.v2 import block_table

from .vllm_oracle import clone_args, vllm_kernel

pytestmark = pytest.mark.usefixtures("reference_form")


def _ptrs(tables: list[torch.Tensor]) -> torch.Tensor:
    return torch.tensor([t.data_ptr() for t in tables], dtype=torch.uint64)


@pytest.mark.parametrize(("num_reqs", "padded"), [(3, 5), (0, 2), (4, 4)])
def test_gather_block_tables_matches_vllm(num_reqs: int, padded: int) -> None:
    g = torch.Generator().manual_seed(num_reqs)
    max_reqs, widths = 6, (8, 5)
    src = [torch.randint(0, 99, (max_reqs, w), generator=g, dtype=torch.int32) for w in widths]
    counts = torch.stack(
        [torch.randint(0, w + 1, (max_reqs,), generator=g, dtype=torch.int32) for w in widths]
    )
    req = torch.randperm(max_reqs, generator=g)[:padded].to(torch.int32)
    results = []
    for run in (vllm_kernel("vllm.v1.worker.gpu.block_table._gather_block_tables_kernel"), None):
        dst = [torch.full((max_reqs, w), -9, dtype=torch.int32) for w in widths]
        args = {
            "batch_idx_to_req_idx": req,
            "src_block_table_ptrs": _ptrs(src),
            "dst_block_table_ptrs": _ptrs(dst),
            "block_table_strides": torch.tensor(widths, dtype=torch.int64),
            "num_blocks_ptr": counts,
            "num_blocks_stride": counts.stride(0),
            "num_reqs": num_reqs,
            "BLOCK_SIZE": 4,
        }
        (run or block_table.gather_block_tables_torch)((len(widths), padded), **args)
        results.append(dst)
    for got, want in zip(results[1], results[0], strict=True):
        assert torch.equal(got, want)


@pytest.mark.parametrize(
    ("num_reqs", "cp_size", "cp_rank"), [(4, 1, 0), (0, 1, 0), (1, 1, 0), (4, 2, 1), (5, 4, 2)]
)
def test_compute_slot_mappings_matches_vllm(num_reqs: int, cp_size: int, cp_rank: int) -> None:
    g = torch.Generator().manual_seed(cp_size + num_reqs)
    max_reqs, width, max_tokens = 6, 8, 40
    tables = [torch.randint(0, 50, (max_reqs, width), generator=g, dtype=torch.int32) for _ in range(2)]
    idx = torch.randperm(max_reqs, generator=g)[:num_reqs].to(torch.int32)
    if num_reqs > 2:
        idx[1] = -1  # a dummy request
    query_lens = torch.randint(1, 7, (num_reqs,), generator=g)
    qsl = torch.zeros(num_reqs + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(query_lens, 0)
    pos = torch.randint(0, 32, (max_tokens,), generator=g, dtype=torch.int64)
    base = {
        "max_num_tokens": max_tokens,
        "idx_mapping": idx,
        "query_start_loc": qsl,
        "pos": pos,
        "block_table_ptrs": _ptrs(tables),
        "block_table_strides": torch.tensor([width, width], dtype=torch.int64),
        "block_sizes": torch.tensor([16, 4], dtype=torch.int32),
        "slot_mapping_enabled": torch.tensor([True, False]) if cp_size == 1 else torch.tensor([True, True]),
        "dcp_sharded": torch.tensor([True, False]),
        "slot_mappings_stride": max_tokens,
        "cp_rank": cp_rank,
        "CP_SIZE": cp_size,
        "CP_INTERLEAVE": 2,
        "PAD_ID": -1,
        "TRITON_BLOCK_SIZE": 8,
    }
    got = {**clone_args(base), "slot_mappings_ptr": torch.full((2, max_tokens), 77, dtype=torch.int64)}
    block_table.compute_slot_mappings_torch((2, num_reqs + 1), **got)
    assert (got["slot_mappings_ptr"][:, int(qsl[-1]) :] == -1).all()
    want = {**clone_args(base), "slot_mappings_ptr": torch.full((2, max_tokens), 77, dtype=torch.int64)}
    vllm_kernel("vllm.v1.worker.gpu.block_table._compute_slot_mappings_kernel")((2, num_reqs + 1), **want)
    assert torch.equal(got["slot_mappings_ptr"], want["slot_mappings_ptr"])
    if cp_size == 1:
        return
    # The DCP layout, also against the kernels package's own DCP slot-mapping reference.
    from vllm_ascend.kernels.slot_mapping import compute_slot_mapping_torch

    owner = torch.repeat_interleave(torch.arange(num_reqs), query_lens)
    real = idx[owner] >= 0
    tokens = slice(0, int(qsl[-1]))
    for group, block_size in enumerate((16, 4)):
        rows = idx[owner].clamp(min=0)
        if group == 0:  # sharded over the DCP ranks
            want = compute_slot_mapping_torch(tables[0], rows, pos[tokens], block_size, cp_size, cp_rank, 2)
        else:
            want = tables[1].long()[rows, pos[tokens] // block_size] * block_size + pos[tokens] % block_size
        want = torch.where(real, want, torch.full_like(want, -1))
        assert torch.equal(got["slot_mappings_ptr"][group, tokens], want)
