"""Speculative-decoding verification kernels (interpreted) against their torch references."""

from __future__ import annotations

import pytest
import torch

import vllm_ascend.kernels as K
from vllm_ascend.kernels import rejection

P = rejection.PLACEHOLDER_TOKEN_ID


def _batch(gen, counts, vocab, max_spec):
    cu = torch.tensor(counts).cumsum(0).to(torch.int32)
    n = int(cu[-1])
    draft = torch.randint(0, vocab, (n,), generator=gen, dtype=torch.int32)
    bonus = torch.randint(0, vocab, (len(counts), 1), generator=gen, dtype=torch.int32)
    out = torch.full((len(counts), max_spec + 1), P, dtype=torch.int32)
    return cu, draft, bonus, out


def test_greedy_example():
    """Request 0 accepts 7 and stops at 8 (argmax 9); request 1 accepts all three and takes its
    bonus; request 2 has no draft: bonus only; request 3 is not greedy: untouched."""
    cu = torch.tensor([2, 5, 5, 6], dtype=torch.int32)
    draft = torch.tensor([7, 8, 1, 2, 3, 4], dtype=torch.int32)
    argmax = torch.tensor([7, 9, 1, 2, 3, 4])
    bonus = torch.tensor([100, 101, 102, 103], dtype=torch.int32)
    is_greedy = torch.tensor([True, True, True, False])
    for fn in (K.rejection_greedy_sample, rejection.rejection_greedy_sample_torch):
        out = torch.full((4, 4), P, dtype=torch.int32)
        assert fn(out, cu, draft, argmax, bonus, is_greedy) is out
        assert out.tolist() == [[7, 9, P, P], [1, 2, 3, 101], [102, P, P, P], [P, P, P, P]]


@pytest.mark.parametrize("with_is_greedy", [False, True])
def test_greedy_matches_reference(gen, with_is_greedy):
    counts = [0, 1, 3, 5, 2, 4, 5]
    cu, draft, bonus, out = _batch(gen, counts, 3, 5)  # 3 tokens: matches and mismatches both common
    argmax = torch.randint(0, 3, draft.shape, generator=gen)
    is_greedy = torch.rand(len(counts), generator=gen) < 0.7 if with_is_greedy else None
    want = rejection.rejection_greedy_sample_torch(out.clone(), cu, draft, argmax, bonus, is_greedy)
    got = K.rejection_greedy_sample(out, cu, draft, argmax, bonus, is_greedy)
    assert torch.equal(got, want)
    assert (want[:, 0] != P).sum() >= (0 if with_is_greedy else len(counts))


def test_random_example():
    """Without draft probabilities q = 1: accept while p(d) >= u; the first rejection writes the
    recovered token; a -1 draft (padding) is always rejected."""
    vocab = 4
    target = torch.tensor([[0.1, 0.5, 0.2, 0.2], [0.7, 0.1, 0.1, 0.1], [0.25] * 4, [0.25] * 4])
    cu = torch.tensor([2, 4], dtype=torch.int32)
    draft = torch.tensor([1, 0, -1, 2], dtype=torch.int32)
    uniform = torch.tensor([0.4, 0.6, 0.0, 0.1], dtype=torch.float64)
    recovered = torch.tensor([3, 2, 1, 0], dtype=torch.int32)
    bonus = torch.tensor([50, 51], dtype=torch.int32)
    is_greedy = torch.tensor([False, False])
    for fn in (K.rejection_random_sample, rejection.rejection_random_sample_torch):
        out = torch.full((2, 3), P, dtype=torch.int32)
        fn(out, cu, draft, None, target[:, :vocab], bonus, recovered, uniform, is_greedy)
        assert out.tolist() == [[1, 0, 50], [1, P, P]]
    uniform[1] = 0.8  # p(0) = 0.7 < 0.8: rejected, recovered token 2
    out = torch.full((2, 3), P, dtype=torch.int32)
    K.rejection_random_sample(out, cu, draft, None, target, bonus, recovered, uniform, is_greedy)
    assert out[0].tolist() == [1, 2, P]


def test_float64_uniforms_next_to_the_ratio_decide_as_in_float64():
    """The kernels compare float64 uniforms without float64 arithmetic (rounded to float32 up or down
    from their bits): a uniform one float64 step above or below ``p(d)`` (q = 1), or far below the
    float32 range, decides exactly as the float64 comparison ``p(d) >= u`` and synthetic ``u < rate``."""
    third = torch.tensor(1 / 3, dtype=torch.float32).double()
    up, down = torch.nextafter(third, third.new_tensor(1.0)), torch.nextafter(third, third.new_tensor(0.0))
    probs = [third, third, third, 0.0, 0.0, 0.75]
    uniform = torch.tensor([third, up, down, 1e-300, 0.0, 0.75 - 2**-60], dtype=torch.float64)
    rows = len(probs)
    target = torch.zeros(rows, 2)
    target[:, 0] = torch.tensor(probs, dtype=torch.float64).float()
    cu = torch.arange(1, rows + 1, dtype=torch.int32)
    draft = torch.zeros(rows, dtype=torch.int32)
    recovered = torch.ones(rows, dtype=torch.int32)
    bonus = torch.full((rows,), 9, dtype=torch.int32)
    is_greedy = torch.zeros(rows, dtype=torch.bool)
    accept = [True, False, True, False, True, True]
    want = [[0, 9] if a else [1, P] for a in accept]
    for fn in (K.rejection_random_sample, rejection.rejection_random_sample_torch):
        out = torch.full((rows, 2), P, dtype=torch.int32)
        fn(out, cu, draft, None, target, bonus, recovered, uniform, is_greedy)
        assert out.tolist() == want
    rates = torch.tensor([1 / 3])
    synthetic = torch.tensor([third, down, 1e-300, up], dtype=torch.float64)
    for fn in (K.rejection_synthetic_sample, rejection.rejection_synthetic_sample_torch):
        out = torch.full((4, 2), P, dtype=torch.int32)
        fn(out, cu[:4], draft[:4], recovered[:4], bonus[:4], synthetic, rates)
        assert out.tolist() == [[1, P], [0, 9], [0, 9], [1, P]]


@pytest.mark.parametrize("with_draft_probs", [False, True])
def test_random_matches_reference(gen, with_draft_probs):
    counts = [3, 0, 5, 1, 4, 5, 2]
    vocab = 6
    cu, draft, bonus, out = _batch(gen, counts, vocab, 5)
    draft[::7] = -1
    n = draft.numel()
    target = torch.softmax(torch.randn(n, vocab, generator=gen) * 2, 1)
    probs = torch.softmax(torch.randn(n, vocab, generator=gen) * 2, 1) if with_draft_probs else None
    if probs is not None:
        probs[0, draft[0].clamp(min=0)] = 0.0  # q = 0: rejected, never divided by
    uniform = torch.rand(n, generator=gen, dtype=torch.float64)
    recovered = torch.randint(0, vocab, (n,), generator=gen, dtype=torch.int32)
    is_greedy = torch.rand(len(counts), generator=gen) < 0.3
    args = (cu, draft, probs, target, bonus, recovered, uniform, is_greedy)
    want = rejection.rejection_random_sample_torch(out.clone(), *args)
    got = K.rejection_random_sample(out, *args)
    assert torch.equal(got, want)
    assert (got[is_greedy] == P).all()


@pytest.mark.parametrize("with_draft_probs", [False, True])
def test_recovered_tokens_match_reference(gen, with_draft_probs):
    counts = [2, 0, 3, 1]
    vocab = 150  # several interpreter tiles
    cu = torch.tensor(counts).cumsum(0).to(torch.int32)
    n = int(cu[-1])
    draft = torch.randint(0, vocab, (n,), generator=gen, dtype=torch.int64)
    target = torch.softmax(torch.randn(n, vocab, generator=gen), 1)
    probs = torch.softmax(torch.randn(n, vocab, generator=gen), 1) if with_draft_probs else None
    inv_q = 1.0 / torch.empty(len(counts), vocab).exponential_(generator=gen)
    args = (max(counts), cu, draft, probs, target, inv_q)
    got = K.sample_recovered_tokens(*args)
    assert got.dtype == draft.dtype
    assert torch.equal(got, rejection.sample_recovered_tokens_torch(*args))
    if probs is None:
        assert (got != draft).all()  # the draft token itself is never recovered


def test_recovered_ties_take_the_lowest_id_across_tiles():
    vocab = 200
    target = torch.zeros(2, vocab)
    target[:, [5, 70, 130]] = 1.0 / 3
    draft = torch.tensor([5, 199])
    cu = torch.tensor([2], dtype=torch.int32)
    got = K.sample_recovered_tokens(2, cu, draft, None, target, torch.ones(1, vocab))
    assert got.tolist() == [70, 5]


def test_recovered_reference_samples_the_residual_distribution(gen, chi2_limit):
    """argmax((p - q)+ / E) with fresh exponentials E draws from (p - q)+ normalized."""
    vocab, draws = 6, 30000
    p = torch.tensor([0.3, 0.25, 0.2, 0.1, 0.1, 0.05])
    q = torch.tensor([0.1, 0.3, 0.1, 0.2, 0.05, 0.25])
    cu = torch.arange(1, draws + 1, dtype=torch.int32)
    inv_q = 1.0 / torch.empty(draws, vocab).exponential_(generator=gen)
    tokens = rejection.sample_recovered_tokens_torch(
        1, cu, torch.zeros(draws, dtype=torch.int64), q.expand(draws, vocab), p.expand(draws, vocab), inv_q
    )
    residual = (p - q).clamp(min=0).double()
    expected = residual / residual.sum() * draws
    observed = torch.bincount(tokens, minlength=vocab).double()
    support = expected > 0
    assert observed[~support].sum() == 0
    chi2 = float(((observed - expected)[support] ** 2 / expected[support]).sum())
    assert chi2 < chi2_limit(int(support.sum()) - 1), observed.tolist()


def test_expand_batch_to_tokens(gen):
    temps = torch.tensor([0.5, 0.0, 1.5, 0.0])
    cu = torch.tensor([2, 5, 5, 8], dtype=torch.int32)
    want = [0.5, 0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    for fn in (K.expand_batch_to_tokens, rejection.expand_batch_to_tokens_torch):
        assert fn(temps, cu, 8, replace_from=0, replace_to=1).tolist() == want
    counts = torch.randint(0, 300, (5,), generator=gen)  # several expansion blocks per request
    ids = torch.randint(0, 1000, (5,), generator=gen)
    cu = counts.cumsum(0)
    got = K.expand_batch_to_tokens(ids, cu, int(cu[-1]))
    assert torch.equal(got, torch.repeat_interleave(ids, counts))


def test_bad_shapes_are_named():
    cu = torch.tensor([1, 2], dtype=torch.int32)
    with pytest.raises(
        ValueError, match=r"output must be int32 \[B, max_spec_len \+ 1\].*B = 2.*got torch.int64"
    ):
        K.rejection_greedy_sample(torch.zeros(2, 3, dtype=torch.int64), cu, cu, cu, cu)
    with pytest.raises(ValueError, match=r"output must be .*B = 2.*\(3, 3\)"):
        K.rejection_greedy_sample(torch.zeros(3, 3, dtype=torch.int32), cu, cu, cu, cu)
    with pytest.raises(ValueError, match="cu_num_tokens must hold one entry per request: got 2 for 3"):
        K.expand_batch_to_tokens(torch.zeros(3), cu, 2)
    draft, probs = torch.tensor([1, 2]), torch.full((2, 4), 0.25)
    with pytest.raises(
        ValueError, match=r"target_probs must be float32 \[N, V\] with N = 2 draft tokens; got torch.float64"
    ):
        K.sample_recovered_tokens(1, cu, draft, None, probs.double(), torch.ones(2, 4))
    with pytest.raises(
        ValueError, match=r"draft_probs must have the shape of target_probs \(2, 4\), got \(2, 5\)"
    ):
        K.sample_recovered_tokens(1, cu, draft, torch.zeros(2, 5), probs, torch.ones(2, 4))
    with pytest.raises(ValueError, match=r"inv_q must be \[B, V\] = \(2, 4\), got \(1, 4\)"):
        K.sample_recovered_tokens(1, cu, draft, None, probs, torch.ones(1, 4))
    out = torch.full((2, 2), P, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"target_probs must be float32 \[N, V\] with N = 2 .*\(3, 4\)"):
        K.rejection_random_sample(out, cu, draft, None, torch.ones(3, 4), cu, draft, torch.rand(2), cu > 0)
