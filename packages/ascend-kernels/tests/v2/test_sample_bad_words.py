"""V2 bad words: the Ascend Triton kernel (interpreter) against the torch reference."""

from __future__ import annotations

import pytest
import torch

from vllm_ascend.kernels._triton.v2 import sample_bad_words as triton_impl
from vllm_ascend.kernels.v2 import sample_bad_words as v2


def bad_words_args(g, query_lens: list[int], vocab: int, dtype: torch.dtype) -> tuple[dict, tuple[int, int]]:
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
    return {
        "logits_ptr": torch.zeros(num_tokens, vocab, dtype=dtype),
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
        "total_len_ptr": prompt_len + torch.tensor([0, 1, 3, 6], dtype=torch.int32),
        "input_ids_ptr": torch.randint(0, 3, (num_tokens,), generator=g, dtype=torch.int32),
        "expanded_local_pos_ptr": local_pos,
    }, (num_tokens, max_words)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("query_lens", [[], [1], [1, 2, 3, 4], [3, 3, 1, 4, 2]])
def test_bad_words(query_lens: list[int], dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(len(query_lens) * 5 + sum(query_lens))
    args, grid = bad_words_args(g, query_lens, 12, dtype)
    ref = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    v2.bad_words_torch(grid, **ref)
    triton_impl.bad_words(grid, **args)
    assert torch.equal(args["logits_ptr"], ref["logits_ptr"])
    if len(query_lens) > 2:
        assert torch.isinf(ref["logits_ptr"]).any()
        assert not torch.isinf(ref["logits_ptr"][args["expanded_idx_mapping_ptr"] == 0]).any()
