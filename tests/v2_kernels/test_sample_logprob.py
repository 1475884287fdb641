"""V2 logprob overrides against vLLM's own kernels (run in Triton's interpreter)."""

from __future__ import annotations

import pytest
import torch

from vllm_ascend.kernels.v2 import sample_logprob as v2

from ._interpreter_fixes import interpreter_fixes
from .vllm_oracle import clone_args, vllm_kernel

_MODULE = "vllm.v1.worker.gpu.sample.logprob"


@pytest.fixture(autouse=True)
def _fixes(monkeypatch):
    interpreter_fixes(monkeypatch)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("batch", "vocab", "topk"), [(0, 40, 3), (1, 40, 1), (5, 100, 6)])
def test_topk_log_softmax_matches_vllm(batch: int, vocab: int, topk: int, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(batch + vocab + topk)
    logits = (torch.randn(batch, vocab + 2, generator=g) * 4).to(dtype)
    if batch > 1:
        logits[1, : vocab // 2] = float("-inf")
    args = {
        "output_ptr": torch.full((batch, topk), 9.0),
        "logits_ptr": logits,
        "logits_stride": vocab + 2,
        "topk_ids_ptr": torch.randint(0, vocab, (batch, topk + 1), generator=g),
        "topk_ids_stride": topk + 1,
        "topk": topk,
        "vocab_size": vocab,
        "BLOCK_SIZE": 32,
        "TOPK_BLOCK_SIZE": 4,
    }
    expected = clone_args(args)
    vllm_kernel(f"{_MODULE}._topk_log_softmax_kernel")((batch,), **expected)
    v2.topk_log_softmax_torch((batch,), **args)
    torch.testing.assert_close(args["output_ptr"], expected["output_ptr"], rtol=1e-6, atol=1e-5)


# Upstream Triton's interpreter compares two bfloat16 values by their bit patterns (negative numbers
# order backwards) and loads a masked lane's bfloat16 ``other=-inf`` as garbage: the bfloat16 cases
# hold non-negative logits in whole BLOCK_SIZE tiles.
@pytest.mark.parametrize(
    ("batch", "vocab", "dtype"),
    [
        (0, 40, torch.float32),
        (1, 40, torch.float32),
        (6, 100, torch.float32),
        (1, 64, torch.bfloat16),
        (6, 96, torch.bfloat16),
    ],
)
def test_ranks_matches_vllm(batch: int, vocab: int, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(batch + vocab)
    low = 0 if dtype == torch.bfloat16 else -5
    logits = torch.randint(low, low + 10, (batch, vocab), generator=g).to(dtype)
    args = {
        "output_ptr": torch.full((batch,), -1, dtype=torch.int64),
        "logits_ptr": logits,
        "logits_stride": vocab,
        "token_ids_ptr": torch.randint(0, vocab, (batch,), generator=g),
        "vocab_size": vocab,
        "BLOCK_SIZE": 32,
    }
    expected = clone_args(args)
    vllm_kernel(f"{_MODULE}._ranks_kernel")((batch,), **expected)
    v2.ranks_torch((batch,), **args)
    assert torch.equal(args["output_ptr"], expected["output_ptr"])


@pytest.mark.parametrize(
    ("batch", "num_topk", "num_cols"), [(0, 2, 2), (1, 0, 3), (6, 2, 5), (6, 3, 3), (5, 0, 4)]
)
def test_fill_logprob_token_ids_matches_vllm(batch: int, num_topk: int, num_cols: int) -> None:
    g = torch.Generator().manual_seed(batch * 10 + num_topk + num_cols)
    max_reqs, max_ids = 4, 8
    per_req = torch.randint(0, 1000, (max_reqs, max_ids), generator=g, dtype=torch.int32)
    topk = torch.randint(0, 1000, (batch, max(num_topk, 1)), generator=g, dtype=torch.int32)
    args = {
        "out_token_ids_ptr": torch.zeros(batch, 1 + num_cols, dtype=torch.int64),
        "out_token_ids_stride": 1 + num_cols,
        "out_valid_mask_ptr": torch.zeros(batch, 1 + num_cols, dtype=torch.bool),
        "out_valid_mask_stride": 1 + num_cols,
        "sampled_token_ids_ptr": torch.randint(0, 1000, (batch,), generator=g),
        "topk_indices_ptr": topk if num_topk else per_req,
        "topk_indices_stride": topk.stride(0) if num_topk else per_req.stride(0),
        "expanded_idx_mapping_ptr": torch.randint(0, max_reqs, (batch,), generator=g, dtype=torch.int32),
        # Request 0: top-k; the others their own ids (request 3: as many as fit num_cols).
        "num_per_req_token_ids_ptr": torch.tensor([0, 1, 2, num_cols], dtype=torch.int32),
        "per_req_token_ids_ptr": per_req,
        "per_req_token_ids_stride": max_ids,
        "NUM_TOPK": num_topk,
        "PADDED_COLS": 1 << (num_cols - 1).bit_length(),
    }
    expected = clone_args(args)
    vllm_kernel(f"{_MODULE}._fill_logprob_token_ids_kernel")((batch,), **expected)
    v2.fill_logprob_token_ids_torch((batch,), **args)
    assert torch.equal(args["out_token_ids_ptr"], expected["out_token_ids_ptr"])
    assert torch.equal(args["out_valid_mask_ptr"], expected["out_valid_mask_ptr"])
