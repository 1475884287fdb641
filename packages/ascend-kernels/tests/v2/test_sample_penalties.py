"""V2 penalties: the Ascend Triton kernels (interpreter) against the torch references."""

from __future__ import annotations

import pytest
import torch

from vllm_ascend.kernels._triton.v2 import sample_penalties as triton_impl
from vllm_ascend.kernels.v2 import sample_penalties as v2

pytestmark = pytest.mark.usefixtures("launch_grid")


def _clone(args: dict) -> dict:
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in args.items()}


@pytest.mark.parametrize(
    ("num_new", "block", "short_grid"),
    [(0, 16, False), (1, 16, False), (2, 16, False), (4, 32, False), (4, 16, True)],  # 2: rows split
)
def test_bincount(num_new: int, block: int, short_grid: bool) -> None:
    g = torch.Generator().manual_seed(num_new * 7 + block)
    max_reqs, max_len, vocab = 6, 80, 70
    prompt_len = torch.randint(1, 40, (max_reqs,), generator=g, dtype=torch.int32)
    prefill_len = prompt_len + torch.randint(0, 30, (max_reqs,), generator=g, dtype=torch.int32)
    prefill_len[0] = prompt_len[0] - 1  # a prompt longer than the prefill: blocks past prefill read nothing
    idx = torch.cat([torch.tensor([0]), torch.randperm(max_reqs - 1, generator=g) + 1])[:num_new].to(
        torch.int32
    )
    max_prefill = int(prefill_len[idx.long()].max()) if num_new else 1
    args = {
        "expanded_idx_mapping_ptr": idx,
        "all_token_ids_ptr": torch.randint(0, vocab, (max_reqs, max_len), generator=g, dtype=torch.int32),
        "all_token_ids_stride": max_len,
        "prompt_len_ptr": prompt_len,
        "prefill_len_ptr": prefill_len,
        "prompt_bin_mask_ptr": torch.randint(
            -(2**31), 2**31 - 1, (max_reqs, 3), generator=g, dtype=torch.int32
        ),
        "prompt_bin_mask_stride": 3,
        "output_bin_counts_ptr": torch.randint(0, 3, (max_reqs, vocab), generator=g, dtype=torch.int32),
        "output_bin_counts_stride": vocab,
        "BLOCK_SIZE": block,
    }
    num_blocks = (max_prefill + block - 1) // block
    grid = (num_new, max(1, num_blocks - 1) if short_grid else num_blocks)
    ref = _clone(args)
    v2.bincount_torch(grid, **ref)
    triton_impl.bincount(grid, **args)
    assert torch.equal(args["prompt_bin_mask_ptr"], ref["prompt_bin_mask_ptr"])
    assert torch.equal(args["output_bin_counts_ptr"], ref["output_bin_counts_ptr"])


def _penalty_args(g, query_lens, vocab, block, dtype):
    max_reqs = 5
    num_tokens = sum(query_lens)
    empty = [torch.zeros(0, dtype=torch.int32)]
    idx = torch.cat(
        empty + [torch.full((n,), r % max_reqs, dtype=torch.int32) for r, n in enumerate(query_lens)]
    )
    local_pos = torch.cat(empty + [torch.arange(n, dtype=torch.int32) for n in query_lens])
    words = (vocab + 31) // 32
    logits = torch.randn(num_tokens, vocab, generator=g) * 3
    logits[:, :4] = torch.tensor([0.0, -0.0, 1.0, -1.0])
    return {
        "logits_ptr": logits.to(dtype),
        "logits_stride": vocab,
        "expanded_idx_mapping_ptr": idx,
        "token_ids_ptr": torch.randint(0, vocab, (num_tokens,), generator=g, dtype=torch.int32),
        "expanded_local_pos_ptr": local_pos,
        "repetition_penalty_ptr": torch.tensor([1.0, 1.3, 1.0, 1.0, 0.8]),
        "frequency_penalty_ptr": torch.tensor([0.0, 0.0, 0.5, 0.0, -0.3]),
        "presence_penalty_ptr": torch.tensor([0.0, 0.0, 0.0, 0.7, 0.2]),
        "prompt_bin_mask_ptr": torch.randint(
            -(2**31), 2**31 - 1, (max_reqs, words), generator=g, dtype=torch.int32
        ),
        "prompt_bin_mask_stride": words,
        "output_bin_counts_ptr": torch.randint(0, 3, (max_reqs, vocab), generator=g, dtype=torch.int32)
        * torch.randint(0, 2, (max_reqs, vocab), generator=g, dtype=torch.int32),
        "output_bin_counts_stride": vocab,
        "vocab_size": vocab,
        "BLOCK_SIZE": block,
    }, (num_tokens, (vocab + block - 1) // block)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("query_lens", "vocab", "block"),
    [
        ([], 40, 16),
        ([1], 40, 16),
        ([1, 3, 2, 1, 4], 100, 32),
        ([2, 2, 2, 1, 1, 3], 150, 64),
        ([1, 2], 300, 64),  # fewer rows than the interpreter's cores: rows split
    ],
)
def test_penalties(query_lens, vocab: int, block: int, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(len(query_lens) * 11 + vocab)
    args, grid = _penalty_args(g, query_lens, vocab, block, dtype)
    original = args["logits_ptr"].clone()
    ref = _clone(args)
    v2.penalties_torch(grid, **ref)
    triton_impl.penalties(grid, **args)
    if dtype == torch.float32:
        assert torch.equal(args["logits_ptr"], ref["logits_ptr"])
    else:  # the interpreter truncates the float32 -> bfloat16 store, torch rounds: 1 ulp apart
        torch.testing.assert_close(args["logits_ptr"], ref["logits_ptr"], rtol=2**-7, atol=1e-6)
    unpenalised = args["expanded_idx_mapping_ptr"] == 0
    assert torch.equal(args["logits_ptr"][unpenalised], original[unpenalised])
    assert (args["logits_ptr"][~unpenalised] != original[~unpenalised]).any(dim=-1).all()


@pytest.mark.parametrize(
    ("tile_cap", "query_lens", "vocab", "block"),
    [
        (256, [1, 3, 2], 300, 64),  # [8, 32] word tiles, the last cut at the vocabulary
        (256, [2, 1, 1, 1, 1, 1, 3], 1000, 128),  # more rows than the interpreter's programs
        (8192, [1, 2], 300, 64),  # CUDA's cap: one tile wider than the row (512 columns for 300)
        (8192, [1, 1, 2], 40, 1024),  # a row narrower than two words, vLLM's block wider than it
    ],
)
def test_penalties_word_tiles(monkeypatch, tile_cap: int, query_lens, vocab: int, block: int) -> None:
    """Tiles of several bitmask words (the CUDA and Ascend caps), against the reference."""
    monkeypatch.setitem(triton_impl.PENALTIES_TILE, "interpreter", tile_cap)
    g = torch.Generator().manual_seed(tile_cap + vocab)
    args, grid = _penalty_args(g, query_lens, vocab, block, torch.float32)
    ref = _clone(args)
    v2.penalties_torch(grid, **ref)
    triton_impl.penalties(grid, **args)
    assert torch.equal(args["logits_ptr"], ref["logits_ptr"])
    assert torch.equal(args["output_bin_counts_ptr"], ref["output_bin_counts_ptr"])
