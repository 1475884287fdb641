"""V2 sampling mask: the Ascend Triton kernel (interpreter) against the torch reference."""

from __future__ import annotations

import pytest
import torch

from vllm_ascend.kernels._triton.v2 import sample_output as triton_impl
from vllm_ascend.kernels.v2 import sample_output as v2


def mask_args(
    g, num_reqs: int, rows_per_request: int, vocab: int, max_kept: int, transposed: bool, dtype
) -> dict:
    num_sampled = torch.randint(0, rows_per_request + 1, (num_reqs,), generator=g, dtype=torch.int32)
    cu = torch.zeros(num_reqs + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(num_sampled + 1, 0)
    num_logits = int(cu[-1]) + 1
    logits = torch.randn(num_logits, vocab, generator=g)
    logits[torch.rand(num_logits, vocab, generator=g) < 0.7] = float("-inf")
    logits[0, 3] = float("inf")
    logits[0, 4] = float("nan")
    if num_logits > 2:
        logits[2] = float("-inf")
    logits = logits.to(dtype)
    if transposed:
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
        "BLOCK_SIZE": 8192,
    }


@pytest.mark.parametrize(
    ("num_reqs", "rows_per_request", "vocab", "max_kept", "transposed", "dtype"),
    [
        (0, 1, 40, 8, False, torch.float32),
        (1, 1, 40, 8, False, torch.float32),
        (4, 1, 45, 6, False, torch.bfloat16),
        (3, 3, 37, 20, True, torch.float32),
        (3, 2, 100, 100, False, torch.float32),
    ],
)
def test_compact_sampling_mask(num_reqs, rows_per_request, vocab, max_kept, transposed, dtype) -> None:
    g = torch.Generator().manual_seed(num_reqs * 13 + vocab)
    args = mask_args(g, num_reqs, rows_per_request, vocab, max_kept, transposed, dtype)
    grid = (num_reqs * rows_per_request,)
    ref = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    v2.compact_sampling_mask_torch(grid, **ref)
    triton_impl.compact_sampling_mask(grid, **args)
    for name in ("token_ids_ptr", "packed_mask_ptr", "counts_ptr"):
        assert torch.equal(args[name], ref[name]), name
    live = ref["counts_ptr"] > 0
    if bool(live.any()):
        row = int(live.nonzero()[0])
        bits = (ref["packed_mask_ptr"][row].long()[:, None] >> torch.arange(8)) & 1
        assert int(bits.sum()) == int(ref["counts_ptr"][row])
