"""V2 GPU n-gram speculator overrides against vLLM's own kernels (Triton's interpreter)."""

from __future__ import annotations

import pytest
import torch

from vllm_ascend.kernels.v2 import spec_decode_ngram as v2

from .vllm_oracle import clone_args, vllm_kernel

_MODULE = "vllm.v1.worker.gpu.spec_decode.ngram.speculator"


def _po2(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


def _batch(seed: int, num_reqs: int, max_len: int, vocab: int, min_n: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    max_reqs = num_reqs + 2
    token_ids = torch.randint(0, vocab, (max_reqs, max_len + 3), generator=g, dtype=torch.int32)
    total_len = torch.randint(0, max_len + 1, (max_reqs,), generator=g, dtype=torch.int32)
    idx = torch.randperm(max_reqs, generator=g)[:num_reqs].to(torch.int64)
    if num_reqs:
        total_len[idx[0]] = max_len  # a full row
    if num_reqs > 1:
        total_len[idx[1]] = max(min_n - 1, 0)  # too short to match
    num_sampled = torch.randint(0, 3, (num_reqs,), generator=g, dtype=torch.int32)
    num_sampled[: min(num_reqs, 2)] = 1
    return {
        "token_ids_ptr": token_ids,
        "token_ids_stride": token_ids.stride(0),
        "idx_mapping_ptr": idx,
        "total_len_ptr": total_len,
        "num_sampled_ptr": num_sampled,
        "last_sampled_ptr": torch.randint(100, 200, (max_reqs, 1), generator=g, dtype=torch.int64),
    }


def _compare(kernel: str, grid: tuple[int, ...], args: dict, reference) -> dict:
    expected = clone_args(args)
    vllm_kernel(f"{_MODULE}.{kernel}")(grid, **expected)
    reference(grid, **args)
    for name, value in args.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, expected[name]), name
    return expected


@pytest.mark.parametrize(
    ("num_reqs", "max_len", "block_l", "min_n", "max_n", "k", "vocab", "seed"),
    [
        (0, 16, 16, 1, 2, 2, 3, 0),
        (1, 40, 16, 2, 3, 3, 2, 1),
        (4, 48, 16, 1, 4, 4, 3, 2),
        (5, 20, 8, 3, 5, 5, 2, 3),
    ],
)
def test_ngram_scan_and_finalize_match_vllm(
    num_reqs: int, max_len: int, block_l: int, min_n: int, max_n: int, k: int, vocab: int, seed: int
) -> None:
    n_blocks = -(-max_len // block_l)
    batch = _batch(seed, num_reqs, max_len, vocab, min_n)
    max_reqs = batch["token_ids_ptr"].shape[0]
    scratch = torch.full((max_reqs, n_blocks + 1), -7, dtype=torch.int64)
    scan_args = {
        key: batch[key] for key in ("token_ids_ptr", "token_ids_stride", "idx_mapping_ptr", "total_len_ptr")
    }
    scan_args.update(
        num_sampled_ptr=batch["num_sampled_ptr"],
        scratch_ptr=scratch,
        scratch_stride=scratch.stride(0),
        L=max_len,
        MIN_N=min_n,
        MAX_N=max_n,
        MAX_N_PO2=_po2(max_n),
        BLOCK_L=block_l,
    )
    scanned = _compare("_ngram_scan_kernel", (num_reqs, n_blocks), scan_args, v2.ngram_scan_torch)
    if num_reqs:
        assert (scanned["scratch_ptr"][:num_reqs, :n_blocks] > 0).any()

    finalize_args = {
        key: batch[key]
        for key in (
            "token_ids_ptr",
            "token_ids_stride",
            "idx_mapping_ptr",
            "total_len_ptr",
            "num_sampled_ptr",
        )
    }
    finalize_args.update(
        last_sampled_ptr=batch["last_sampled_ptr"].view(-1),
        scratch_ptr=scanned["scratch_ptr"],
        scratch_stride=scratch.stride(0),
        drafts_ptr=torch.full((max_reqs, k), -1, dtype=torch.int64),
        L=max_len,
        N_BLOCKS=n_blocks,
        K=k,
        K_PO2=_po2(k),
        N_BLOCKS_PO2=_po2(n_blocks),
    )
    _compare("_ngram_finalize_kernel", (num_reqs,), finalize_args, v2.ngram_finalize_torch)
