"""Penalties (sparse bincount kernel) and bad-words masking against their references."""

from __future__ import annotations

import pytest
import torch

import vllm_ascend.kernels as K
from vllm_ascend.kernels import bad_words, penalties
from vllm_ascend.kernels._triton import penalties as penalties_triton

DTYPES = [torch.float32, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
def test_penalties_match_dense_reference_and_leave_scratch_zeroed(gen, dtype, close_ulp):
    rows, vocab = 4, 120
    logits = (torch.randn(rows, vocab, generator=gen) * 3).to(dtype)
    prompt = torch.randint(0, vocab, (rows, 9), generator=gen)
    output = torch.randint(0, vocab, (rows, 13), generator=gen)
    output[:, 5] = output[:, 0]  # repeated output tokens: frequency counts 2+
    output[:, 6] = prompt[:, 1]  # token in both prompt and output
    prompt[0, -3:] = vocab  # padding with V ...
    output[1, -4:] = -1  # ... and with -1
    rep = torch.rand(rows, generator=gen) + 0.5
    freq = torch.rand(rows, generator=gen) - 0.2
    pres = torch.rand(rows, generator=gen) - 0.2
    rep[3], freq[3], pres[3] = 1.0, 0.0, 0.0  # no-op row
    got, want = logits.clone(), logits.clone()
    assert K.apply_penalties(got, prompt, output, rep, freq, pres) is got
    penalties.apply_penalties_torch(want, prompt, output, rep, freq, pres)
    close_ulp(got, want)
    assert torch.equal(got[3], logits[3])
    assert (got[:3] != logits[:3]).any()
    scratch = penalties_triton._scratch[torch.device("cpu")]
    assert not scratch.any(), "the count scratch must be all zeros between calls"


def test_penalties_with_empty_history_are_a_no_op(gen):
    logits = torch.randn(2, 10, generator=gen)
    got = logits.clone()
    empty = torch.empty(2, 0, dtype=torch.long)
    K.apply_penalties(got, empty, empty, torch.full((2,), 2.0), torch.ones(2), torch.ones(2))
    assert torch.equal(got, logits)


def test_bincount_reference_counts_and_ignores_padding():
    ids = torch.tensor([[1, 1, 3, -1, 5], [0, 5, 5, 5, 2]])
    counts = penalties.token_bincount_torch(ids, 5)
    assert counts.tolist() == [[0, 2, 0, 1, 0], [1, 0, 1, 0, 0]]


def _bad_words_case(gen, rows, vocab):
    hist_len = 10
    history = torch.randint(0, 6, (rows, hist_len), generator=gen)  # small alphabet: prefixes often match
    lens = torch.randint(0, hist_len + 1, (rows,), generator=gen)
    lens[0] = hist_len
    words, word_rows = [], []
    for _ in range(12):
        row = int(torch.randint(0, rows, (1,), generator=gen))
        n = int(torch.randint(1, 5, (1,), generator=gen))
        word = torch.randint(0, 6, (n,), generator=gen).tolist()
        word[-1] = int(torch.randint(0, vocab, (1,), generator=gen))
        words.append(word)
        word_rows.append(row)
    # one word that surely matches the end of row 0's history
    words.append([*history[0, -2:].tolist(), vocab - 1])
    word_rows.append(0)
    tokens = torch.tensor([t for w in words for t in w])
    offsets = torch.tensor([0, *torch.tensor([len(w) for w in words]).cumsum(0).tolist()])
    return history, lens, tokens, offsets, torch.tensor(word_rows)


@pytest.mark.parametrize("dtype", DTYPES)
def test_bad_words(gen, dtype):
    rows, vocab = 3, 40
    logits = torch.randn(rows, vocab, generator=gen).to(dtype)
    case = _bad_words_case(gen, rows, vocab)
    got, want = logits.clone(), logits.clone()
    assert K.apply_bad_words(got, *case) is got
    bad_words.apply_bad_words_torch(want, *case)
    assert torch.equal(got, want)
    assert torch.isinf(got[0, vocab - 1])
