"""V2 bad-words override against vLLM's own kernel (run in Triton's interpreter)."""

from __future__ import annotations

import pytest
import torch

from vllm_ascend.kernels.v2 import sample_bad_words as v2

from ._interpreter_fixes import interpreter_fixes
from .vllm_oracle import clone_args, vllm_kernel


@pytest.fixture(autouse=True)
def _fixes(monkeypatch):
    interpreter_fixes(monkeypatch)


def bad_words_args(g, query_lens: list[int], vocab: int = 12) -> tuple[dict, tuple[int, int]]:
    """A small vocabulary, so that random histories match some bad words."""
    max_reqs, max_len, max_words, max_total = 4, 40, 4, 12
    num_tokens = sum(query_lens)
    empty = [torch.zeros(0, dtype=torch.int32)]
    idx = torch.cat(
        empty + [torch.full((n,), r % max_reqs, dtype=torch.int32) for r, n in enumerate(query_lens)]
    )
    local_pos = torch.cat(empty + [torch.arange(n, dtype=torch.int32) for n in query_lens])
    num_words = torch.tensor([0, 2, 4, 3], dtype=torch.int32)
    offsets = torch.zeros(max_reqs, max_words + 1, dtype=torch.int32)
    for r in range(max_reqs):
        lengths = torch.randint(1, 4, (int(num_words[r]),), generator=g)
        offsets[r, 1 : 1 + lengths.numel()] = torch.cumsum(lengths, 0)
    prompt_len = torch.randint(1, 10, (max_reqs,), generator=g, dtype=torch.int32)
    total_len = prompt_len + torch.tensor([0, 1, 3, 6], dtype=torch.int32)
    args = {
        "logits_ptr": torch.zeros(num_tokens, vocab),
        "logits_stride": vocab,
        "expanded_idx_mapping_ptr": idx,
        "bad_word_token_ids_ptr": torch.randint(0, 3, (max_reqs, max_total), generator=g, dtype=torch.int32),
        "bad_word_token_ids_stride": max_total,
        "bad_word_offsets_ptr": offsets,
        "bad_word_offsets_stride": max_words + 1,
        "num_bad_words_ptr": num_words,
        "all_token_ids_ptr": torch.randint(0, 3, (max_reqs, max_len), generator=g, dtype=torch.int32),
        "all_token_ids_stride": max_len,
        "prompt_len_ptr": prompt_len,
        "total_len_ptr": total_len,
        "input_ids_ptr": torch.randint(0, 3, (num_tokens,), generator=g, dtype=torch.int32),
        "expanded_local_pos_ptr": local_pos,
    }
    return args, (num_tokens, max_words)


@pytest.mark.parametrize("query_lens", [[], [1], [1, 2, 3, 4], [3, 3, 1, 4, 2]])
def test_bad_words_matches_vllm(query_lens: list[int]) -> None:
    g = torch.Generator().manual_seed(len(query_lens) * 5 + sum(query_lens))
    args, grid = bad_words_args(g, query_lens)
    expected = clone_args(args)
    vllm_kernel("vllm.v1.worker.gpu.sample.bad_words._bad_words_kernel")(grid, **expected)
    v2.bad_words_torch(grid, **args)
    assert torch.equal(args["logits_ptr"], expected["logits_ptr"])
    if len(query_lens) > 2:
        assert torch.isinf(args["logits_ptr"]).any()  # some words matched
