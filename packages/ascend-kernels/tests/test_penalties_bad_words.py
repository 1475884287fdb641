"""Penalties (counts kept across steps: add, clear, apply) and bad-words masking against their references."""

from __future__ import annotations

import pytest
import torch

import vllm_ascend.kernels as K
from vllm_ascend.kernels import bad_words, penalties
from vllm_ascend.kernels.penalties import COUNT_MASK, PROMPT_BIT

DTYPES = [torch.float32, torch.bfloat16]


def _state(slots: int, vocab: int, capacity: int):
    return (
        torch.zeros(slots, vocab, dtype=torch.int32),
        torch.full((slots, capacity), -5, dtype=torch.int32),  # garbage past num_seen
        torch.zeros(slots, dtype=torch.int32),
    )


def _seen_sets(seen: torch.Tensor, num_seen: torch.Tensor) -> list[list[int]]:
    return [sorted(seen[s, : int(n)].tolist()) for s, n in enumerate(num_seen)]


def _nonzero_sets(counts: torch.Tensor) -> list[list[int]]:
    return [row.nonzero().flatten().tolist() for row in counts]


def _random_entries(gen, slots: int, vocab: int, n: int):
    slot = torch.randint(-1, slots, (n,), generator=gen)  # -1: skipped
    tok = torch.randint(-2, vocab + 2, (n,), generator=gen)  # outside [0, V): skipped
    tok[n // 2 :] = tok[: n - n // 2].clone()  # repeats inside one call
    is_prompt = torch.rand(n, generator=gen) < 0.4
    return slot, tok, is_prompt


def test_add_keeps_counts_prompt_bits_and_the_seen_index_like_the_reference(gen):
    slots, vocab, capacity = 5, 50, 64
    got, want = _state(slots, vocab, capacity), _state(slots, vocab, capacity)
    for n in (40, 7, 90):  # three steps accumulate
        entries = _random_entries(gen, slots, vocab, n)
        K.penalty_counts_add(*got, *entries)
        penalties.penalty_counts_add_torch(*want, *entries)
        assert torch.equal(got[0], want[0])
        assert torch.equal(got[2], want[2])
        assert _seen_sets(got[1], got[2]) == _seen_sets(want[1], want[2]) == _nonzero_sets(got[0])
    slot, tok, is_prompt = (t.tolist() for t in entries)
    counts = got[0]
    for s, t, p in zip(slot, tok, is_prompt, strict=True):
        if s >= 0 and 0 <= t < vocab:
            assert bool(counts[s, t] & PROMPT_BIT) or not p
            assert int(counts[s, t] & COUNT_MASK) > 0 or p


def test_add_counts_every_output_occurrence_and_marks_the_prompt_once():
    counts, seen, num_seen = _state(2, 10, 8)
    slot = torch.tensor([0, 0, 0, 0, 1, 1])
    tok = torch.tensor([3, 3, 3, 7, 3, 3])
    is_prompt = torch.tensor([True, True, False, False, False, False])
    K.penalty_counts_add(counts, seen, num_seen, slot, tok, is_prompt)
    assert counts[0, 3] == PROMPT_BIT + 1 and counts[0, 7] == 1 and counts[1, 3] == 2
    assert _seen_sets(seen, num_seen) == [[3, 7], [3]]


def test_clear_empties_the_named_slots_only(gen):
    slots, vocab = 4, 30
    counts, seen, num_seen = _state(slots, vocab, 32)
    K.penalty_counts_add(counts, seen, num_seen, *_random_entries(gen, slots, vocab, 60))
    before = counts.clone(), num_seen.clone()
    K.penalty_counts_clear(counts, seen, num_seen, torch.tensor([1, 3]))
    assert not counts[[1, 3]].any() and num_seen[[1, 3]].tolist() == [0, 0]
    assert torch.equal(counts[[0, 2]], before[0][[0, 2]])
    assert torch.equal(num_seen[[0, 2]], before[1][[0, 2]])


def _dense_penalties(logits, prompts, outputs, rep, freq, pres):
    """The penalties from token lists (vLLM's formulas: OpenAI frequency/presence, CTRL repetition)."""
    x = logits.float().clone()
    for row, (prompt, output) in enumerate(zip(prompts, outputs, strict=True)):
        for tok in set(prompt) | set(output):
            v, n = x[row, tok], output.count(tok)
            v = v / rep[row] if v > 0 else v * rep[row]
            x[row, tok] = v - freq[row] * n - pres[row] * (n > 0)
    return x.to(logits.dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_apply_matches_the_reference_and_the_formulas_with_draft_tokens(gen, dtype, close_ulp):
    rows, vocab, capacity = 5, 90, 96
    counts, seen, num_seen = _state(rows + 1, vocab, capacity)
    prompts = [torch.randint(0, vocab, (int(n),), generator=gen).tolist() for n in (9, 0, 30, 4, 12)]
    outputs = [torch.randint(0, vocab, (int(n),), generator=gen).tolist() for n in (13, 5, 40, 0, 3)]
    outputs[0][5] = outputs[0][0]  # a repeated output token: frequency counts 2+
    outputs[0][6] = prompts[0][1]  # a token in both prompt and output
    slot_of_row = torch.tensor([5, 0, 2, -1, 3])  # rows and slots need not agree; -1: no state
    for row, (prompt, output) in enumerate(zip(prompts, outputs, strict=True)):
        slot = int(slot_of_row[row])
        toks = torch.tensor(prompt + output, dtype=torch.long)
        flags = torch.arange(toks.numel()) < len(prompt)
        K.penalty_counts_add(counts, seen, num_seen, torch.full_like(toks, slot), toks, flags)
    logits = (torch.randn(rows, vocab, generator=gen) * 3).to(dtype)
    rep = torch.rand(rows, generator=gen) + 0.5
    freq = torch.rand(rows, generator=gen) - 0.2
    pres = torch.rand(rows, generator=gen) - 0.2
    rep[4], freq[4], pres[4] = 1.0, 0.0, 0.0  # a neutral row
    drafts = torch.randint(0, vocab, (rows, 3), generator=gen)
    drafts[0, 1] = drafts[0, 0]  # a repeated draft ...
    drafts[1] = torch.tensor([outputs[1][0], -1, vocab])  # ... one the slot has seen, padding
    for extra in (None, drafts):
        got, want = logits.clone(), logits.clone()
        args = (slot_of_row, counts, seen, num_seen, rep, freq, pres, extra)
        assert K.apply_penalties(got, *args, max_seen=capacity) is got
        penalties.apply_penalties_torch(want, *args)
        close_ulp(got, want)
        assert torch.equal(got[3:], logits[3:])  # no state, neutral penalties
        with_drafts = [
            out + ([t for t in extra[row].tolist() if 0 <= t < vocab] if extra is not None else [])
            for row, out in enumerate(outputs)
        ]
        expected = _dense_penalties(logits, prompts, with_drafts, rep, freq, pres)
        close_ulp(got[:3], expected[:3], 2.0 if dtype == torch.bfloat16 else 8.0)


def test_apply_with_a_small_bound_covers_only_that_many_seen_tokens(gen):
    counts, seen, num_seen = _state(1, 20, 20)
    toks = torch.arange(20)
    K.penalty_counts_add(counts, seen, num_seen, torch.zeros(20, dtype=torch.long), toks, toks < 0)
    logits = torch.ones(1, 20)
    ones = torch.ones(1)
    K.apply_penalties(
        logits, torch.zeros(1, dtype=torch.long), counts, seen, num_seen, ones, ones, ones, None, 20
    )
    assert torch.equal(logits, torch.full((1, 20), -1.0))


def test_apply_counts_draft_tokens_of_a_slot_that_has_seen_nothing():
    counts, seen, num_seen = _state(2, 8, 8)
    logits = torch.zeros(2, 8)
    ones, slots = torch.ones(2), torch.tensor([0, 1])
    extra = torch.tensor([[3, 3, 5], [-1, 8, 2]])  # a repeat, padding (-1 and V)
    K.apply_penalties(logits, slots, counts, seen, num_seen, ones, ones, ones, extra, 0)
    want = torch.zeros(2, 8)
    want[0, 3], want[0, 5], want[1, 2] = -3.0, -2.0, -2.0  # - freq * count - pres
    assert torch.equal(logits, want)


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
