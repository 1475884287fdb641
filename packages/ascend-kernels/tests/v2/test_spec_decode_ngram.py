"""V2 GPU n-gram speculator: the Ascend Triton kernels (interpreter) against the torch references."""

from __future__ import annotations

import pytest
import torch

from vllm_ascend.kernels._triton.v2 import spec_decode_ngram as triton_impl
from vllm_ascend.kernels.v2 import spec_decode_ngram as v2


def _po2(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


def _clone(args: dict) -> dict:
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in args.items()}


@pytest.mark.parametrize(
    ("num_reqs", "max_len", "block_l", "min_n", "max_n", "k", "vocab", "seed"),
    [
        (0, 16, 16, 1, 2, 2, 3, 0),
        (1, 40, 16, 2, 3, 3, 2, 1),
        (5, 64, 16, 1, 4, 4, 3, 2),
        (9, 30, 8, 3, 5, 7, 2, 3),
        (3, 100, 64, 2, 3, 5, 4, 4),
    ],
)
def test_ngram_scan_and_finalize(
    num_reqs: int, max_len: int, block_l: int, min_n: int, max_n: int, k: int, vocab: int, seed: int
) -> None:
    g = torch.Generator().manual_seed(seed)
    max_reqs = num_reqs + 2
    n_blocks = -(-max_len // block_l)
    token_ids = torch.randint(0, vocab, (max_reqs, max_len + 3), generator=g, dtype=torch.int32)
    total_len = torch.randint(0, max_len + 1, (max_reqs,), generator=g, dtype=torch.int32)
    idx = torch.randperm(max_reqs, generator=g)[:num_reqs].to(torch.int64)
    num_sampled = torch.randint(0, 3, (num_reqs,), generator=g, dtype=torch.int32)
    if num_reqs:
        total_len[idx[0]] = max_len
        num_sampled[0] = 1
    if num_reqs > 1:
        total_len[idx[1]] = min_n - 1
    scan = {
        "token_ids_ptr": token_ids,
        "token_ids_stride": token_ids.stride(0),
        "idx_mapping_ptr": idx,
        "total_len_ptr": total_len,
        "num_sampled_ptr": num_sampled,
        "scratch_ptr": torch.full((max_reqs, n_blocks + 1), -7, dtype=torch.int64),
        "scratch_stride": n_blocks + 1,
        "L": max_len,
        "MIN_N": min_n,
        "MAX_N": max_n,
        "MAX_N_PO2": _po2(max_n),
        "BLOCK_L": block_l,
    }
    ref = _clone(scan)
    v2.ngram_scan_torch((num_reqs, n_blocks), **ref)
    triton_impl.ngram_scan((num_reqs, n_blocks), **scan)
    assert torch.equal(scan["scratch_ptr"], ref["scratch_ptr"])
    if num_reqs:
        assert (ref["scratch_ptr"][0, :n_blocks] > 0).any()
        assert (ref["scratch_ptr"][:, n_blocks] == -7).all()

    finalize = {
        "token_ids_ptr": token_ids,
        "token_ids_stride": token_ids.stride(0),
        "idx_mapping_ptr": idx,
        "total_len_ptr": total_len,
        "num_sampled_ptr": num_sampled,
        "last_sampled_ptr": torch.randint(100, 200, (max_reqs,), generator=g, dtype=torch.int64),
        "scratch_ptr": ref["scratch_ptr"],
        "scratch_stride": n_blocks + 1,
        "drafts_ptr": torch.full((max_reqs, k), -1, dtype=torch.int64),
        "L": max_len,
        "N_BLOCKS": n_blocks,
        "K": k,
        "K_PO2": _po2(k),
        "N_BLOCKS_PO2": _po2(n_blocks),
    }
    ref = _clone(finalize)
    v2.ngram_finalize_torch((num_reqs,), **ref)
    triton_impl.ngram_finalize((num_reqs,), **finalize)
    assert torch.equal(finalize["drafts_ptr"], ref["drafts_ptr"])
    if num_reqs:
        drafts = ref["drafts_ptr"][:num_reqs]
        assert (drafts < vocab).any()  # some drafts copied from the rows
        assert (ref["drafts_ptr"][num_reqs:] == -1).all()


def test_ngram_scan_finds_the_longest_rightmost_match() -> None:
    # Row: 1 2 3 9 1 2 3 7 2 3 | suffix "2 3": the 3-gram "x 2 3" has no earlier copy, "2 3" at 1, 5.
    row = torch.tensor([1, 2, 3, 9, 1, 2, 3, 7, 2, 3], dtype=torch.int32)
    token_ids = torch.zeros((1, 16), dtype=torch.int32)
    token_ids[0, : row.numel()] = row
    args = {
        "token_ids_ptr": token_ids,
        "token_ids_stride": 16,
        "idx_mapping_ptr": torch.zeros(1, dtype=torch.int64),
        "total_len_ptr": torch.tensor([row.numel()], dtype=torch.int32),
        "num_sampled_ptr": torch.ones(1, dtype=torch.int32),
        "scratch_ptr": torch.zeros((1, 2), dtype=torch.int64),
        "scratch_stride": 2,
        "L": 16,
        "MIN_N": 2,
        "MAX_N": 3,
        "MAX_N_PO2": 4,
        "BLOCK_L": 8,
    }
    triton_impl.ngram_scan((1, 2), **args)
    assert args["scratch_ptr"].tolist() == [[2 * 17 + 5 + 1, 0]]
    drafts = torch.zeros((1, 3), dtype=torch.int64)
    triton_impl.ngram_finalize(
        (1,),
        token_ids_ptr=token_ids,
        token_ids_stride=16,
        idx_mapping_ptr=args["idx_mapping_ptr"],
        total_len_ptr=args["total_len_ptr"],
        num_sampled_ptr=args["num_sampled_ptr"],
        last_sampled_ptr=torch.tensor([42], dtype=torch.int64),
        scratch_ptr=args["scratch_ptr"],
        scratch_stride=2,
        drafts_ptr=drafts,
        L=16,
        N_BLOCKS=2,
        K=3,
        K_PO2=4,
        N_BLOCKS_PO2=2,
    )
    assert drafts.tolist() == [[7, 2, 3]]
