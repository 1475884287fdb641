"""V2 logprobs: the Ascend Triton kernels (interpreter) against the torch references."""

from __future__ import annotations

import pytest
import torch

from vllm_ascend.kernels._triton.v2 import sample_logprob as triton_impl
from vllm_ascend.kernels.v2 import sample_logprob as v2

pytestmark = pytest.mark.usefixtures("launch_grid")


def _clone(args: dict) -> dict:
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in args.items()}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("batch", "vocab", "topk"), [(0, 40, 3), (1, 40, 1), (6, 100, 6)])
def test_topk_log_softmax(batch: int, vocab: int, topk: int, dtype: torch.dtype) -> None:
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
        "BLOCK_SIZE": 1024,
        "TOPK_BLOCK_SIZE": 4,
    }
    ref = _clone(args)
    v2.topk_log_softmax_torch((batch,), **ref)
    triton_impl.topk_log_softmax((batch,), **args)
    torch.testing.assert_close(args["output_ptr"], ref["output_ptr"], rtol=1e-6, atol=1e-5)
    if batch:
        row = logits[0, :vocab].float()
        expected = torch.log_softmax(row, 0)[args["topk_ids_ptr"][0, :topk]]
        torch.testing.assert_close(ref["output_ptr"][0], expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("batch", "vocab"), [(0, 40), (1, 40), (6, 100)])
def test_ranks(batch: int, vocab: int, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(batch + vocab)
    logits = torch.randint(-5, 5, (batch, vocab), generator=g).to(dtype)
    args = {
        "output_ptr": torch.full((batch,), -1, dtype=torch.int64),
        "logits_ptr": logits,
        "logits_stride": vocab,
        "token_ids_ptr": torch.randint(0, vocab, (batch,), generator=g),
        "vocab_size": vocab,
        "BLOCK_SIZE": 8192,
    }
    ref = _clone(args)
    v2.ranks_torch((batch,), **ref)
    triton_impl.ranks((batch,), **args)
    assert torch.equal(args["output_ptr"], ref["output_ptr"])
    assert (ref["output_ptr"] >= 1).all()


@pytest.mark.parametrize(
    ("batch", "num_topk", "num_cols"), [(0, 2, 2), (1, 0, 3), (6, 2, 5), (6, 3, 3), (5, 0, 4)]
)
def test_fill_logprob_token_ids(batch: int, num_topk: int, num_cols: int) -> None:
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
        "num_per_req_token_ids_ptr": torch.tensor([0, 1, 2, num_cols], dtype=torch.int32),
        "per_req_token_ids_ptr": per_req,
        "per_req_token_ids_stride": max_ids,
        "NUM_TOPK": num_topk,
        "PADDED_COLS": 1 << (num_cols - 1).bit_length(),
    }
    ref = _clone(args)
    v2.fill_logprob_token_ids_torch((batch,), **ref)
    triton_impl.fill_logprob_token_ids((batch,), **args)
    assert torch.equal(args["out_token_ids_ptr"], ref["out_token_ids_ptr"])
    assert torch.equal(args["out_valid_mask_ptr"], ref["out_valid_mask_ptr"])
    if batch:
        assert torch.equal(ref["out_token_ids_ptr"][:, 0], args["sampled_token_ids_ptr"])
