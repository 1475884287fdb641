"""V2 penalties overrides against vLLM's own kernels (run in Triton's interpreter)."""

from __future__ import annotations

import pytest
import torch

from vllm_ascend.kernels.v2 import sample_penalties as v2

from ._interpreter_fixes import interpreter_fixes
from .vllm_oracle import clone_args, vllm_kernel

_MODULE = "vllm.v1.worker.gpu.sample.penalties"


@pytest.fixture(autouse=True)
def _fixes(monkeypatch):
    interpreter_fixes(monkeypatch)


@pytest.mark.parametrize(
    ("num_new", "block", "short_grid"),
    [(0, 16, False), (1, 16, False), (4, 16, False), (3, 64, False), (4, 16, True)],
)
def test_bincount_matches_vllm(num_new: int, block: int, short_grid: bool) -> None:
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
        # Nonzero starting state: the kernel ORs / adds into it.
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
    expected = clone_args(args)
    vllm_kernel(f"{_MODULE}._bincount_kernel")(grid, **expected)
    v2.bincount_torch(grid, **args)
    assert torch.equal(args["prompt_bin_mask_ptr"], expected["prompt_bin_mask_ptr"])
    assert torch.equal(args["output_bin_counts_ptr"], expected["output_bin_counts_ptr"])


def test_bincount_from_zero_is_the_token_histogram() -> None:
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 64, (2, 50), generator=g, dtype=torch.int32)
    args = {
        "expanded_idx_mapping_ptr": torch.tensor([1], dtype=torch.int32),
        "all_token_ids_ptr": tokens,
        "all_token_ids_stride": 50,
        "prompt_len_ptr": torch.tensor([0, 20], dtype=torch.int32),
        "prefill_len_ptr": torch.tensor([0, 45], dtype=torch.int32),
        "prompt_bin_mask_ptr": torch.zeros(2, 2, dtype=torch.int32),
        "prompt_bin_mask_stride": 2,
        "output_bin_counts_ptr": torch.zeros(2, 64, dtype=torch.int32),
        "output_bin_counts_stride": 64,
        "BLOCK_SIZE": 16,
    }
    v2.bincount_torch((1, 3), **args)
    assert torch.equal(
        args["output_bin_counts_ptr"][1], torch.bincount(tokens[1, 20:45].long(), minlength=64).int()
    )
    prompt = v2.unpack_bits(args["prompt_bin_mask_ptr"][1], 64)
    assert torch.equal(prompt.nonzero().flatten(), tokens[1, :20].long().unique())


def _penalty_args(g, query_lens, vocab, block, dtype):
    max_reqs = 5
    num_tokens = sum(query_lens)
    empty = [torch.zeros(0, dtype=torch.int32)]
    idx = torch.cat(empty + [torch.full((n,), r, dtype=torch.int32) for r, n in enumerate(query_lens)])
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
        # Request 0 none, 1 repetition only, 2 frequency only, 3 presence only, 4 all three.
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
    ("query_lens", "vocab", "block"), [([], 40, 16), ([1], 40, 16), ([1, 3, 2, 1, 4], 100, 32)]
)
def test_penalties_matches_vllm(query_lens, vocab: int, block: int, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(len(query_lens) * 11 + vocab)
    args, grid = _penalty_args(g, query_lens, vocab, block, dtype)
    original = args["logits_ptr"].clone()
    expected = clone_args(args)
    vllm_kernel(f"{_MODULE}._penalties_kernel")(grid, **expected)
    v2.penalties_torch(grid, **args)
    if dtype == torch.float32:
        torch.testing.assert_close(args["logits_ptr"], expected["logits_ptr"], rtol=0, atol=0)
    else:  # the interpreter truncates the float32 -> bfloat16 store, torch rounds: 1 ulp apart
        torch.testing.assert_close(args["logits_ptr"], expected["logits_ptr"], rtol=2**-7, atol=1e-6)
    unpenalised = args["expanded_idx_mapping_ptr"] == 0
    assert torch.equal(args["logits_ptr"][unpenalised], original[unpenalised])
    assert (args["logits_ptr"][~unpenalised] != original[~unpenalised]).any(dim=-1).all()
