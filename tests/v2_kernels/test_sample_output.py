"""V2 sampling-mask override against vLLM's own kernel (run in Triton's interpreter)."""

from __future__ import annotations

import pytest
import torch

from vllm_ascend.kernels.v2 import sample_output as v2

from ._interpreter_fixes import interpreter_fixes
from .vllm_oracle import clone_args, vllm_kernel


@pytest.fixture(autouse=True)
def _fixes(monkeypatch):
    interpreter_fixes(monkeypatch)


def mask_args(g, num_reqs: int, rows_per_request: int, vocab: int, max_kept: int, transposed: bool) -> dict:
    num_sampled = torch.randint(0, rows_per_request + 1, (num_reqs,), generator=g, dtype=torch.int32)
    cu = torch.zeros(num_reqs + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(num_sampled + 1, 0)
    num_logits = int(cu[-1]) + 1
    logits = torch.randn(num_logits, vocab, generator=g)
    logits[torch.rand(num_logits, vocab, generator=g) < 0.7] = float("-inf")
    logits[0, 3] = float("inf")
    logits[0, 4] = float("nan")
    if num_logits > 2:
        logits[2] = float("-inf")  # nothing kept
    if transposed:  # a column stride other than 1
        logits = logits.t().contiguous().t()
    rows = num_reqs * rows_per_request
    return {
        "logits_ptr": logits,
        "logits_row_stride": logits.stride(0),
        "logits_col_stride": logits.stride(1),
        "cu_num_logits_ptr": cu,
        "num_sampled_tokens_ptr": num_sampled,
        "token_ids_ptr": torch.full((rows, max_kept), -9, dtype=torch.int32),
        "token_ids_row_stride": max_kept,
        "packed_mask_ptr": torch.full((rows, (vocab + 7) // 8), 0xAB, dtype=torch.uint8),
        "packed_mask_row_stride": (vocab + 7) // 8,
        "counts_ptr": torch.full((rows,), -9, dtype=torch.int32),
        "vocab_size": vocab,
        "max_num_kept": max_kept,
        "ROWS_PER_REQUEST": rows_per_request,
        "BLOCK_SIZE": 16,
    }


@pytest.mark.parametrize(
    ("num_reqs", "rows_per_request", "vocab", "max_kept", "transposed"),
    [
        (0, 1, 40, 8, False),
        (1, 1, 40, 8, False),
        (4, 1, 45, 6, False),
        (3, 3, 37, 20, True),
        (3, 2, 50, 50, False),
    ],
)
def test_compact_sampling_mask_matches_vllm(num_reqs, rows_per_request, vocab, max_kept, transposed) -> None:
    g = torch.Generator().manual_seed(num_reqs * 13 + vocab)
    args = mask_args(g, num_reqs, rows_per_request, vocab, max_kept, transposed)
    grid = (num_reqs * rows_per_request,)
    expected = clone_args(args)
    vllm_kernel("vllm.v1.worker.gpu.sample.output._compact_sampling_mask_kernel")(grid, **expected)
    v2.compact_sampling_mask_torch(grid, **args)
    for name in ("token_ids_ptr", "packed_mask_ptr", "counts_ptr"):
        assert torch.equal(args[name], expected[name]), name
