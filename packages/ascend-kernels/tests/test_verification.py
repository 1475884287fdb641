"""Block, entropy and synthetic verification: interpreted kernels against their torch references, and
the output laws they promise (block: the target's; entropy: the documented lossy law; synthetic: the
given acceptance rates), by chi-square over 1e5 draws with fixed seeds."""

from __future__ import annotations

import pytest
import torch

import vllm_ascend.kernels as K
from vllm_ascend.kernels import rejection

P = rejection.PLACEHOLDER_TOKEN_ID
DRAWS = 100_000


def _chi2(observed: torch.Tensor, expected: torch.Tensor) -> tuple[float, int, float]:
    """(statistic, degrees of freedom, p-value) over the cells where ``expected > 0``; no draw may
    fall where ``expected == 0``."""
    support = expected > 0
    assert observed[~support].sum() == 0, "draws outside the expected support"
    stat = float(((observed - expected)[support] ** 2 / expected[support]).sum())
    dof = int(support.sum()) - 1
    p_value = float(torch.special.gammaincc(torch.tensor(dof / 2.0), torch.tensor(stat / 2.0)))
    return stat, dof, p_value


def _random_batch(gen, counts, vocab, max_spec, with_draft_probs):
    cu = torch.tensor(counts).cumsum(0).to(torch.int32)
    n = int(cu[-1])
    draft = torch.randint(0, vocab, (n,), generator=gen, dtype=torch.int32)
    draft[::5] = -1
    target = torch.softmax(torch.randn(n, vocab, generator=gen) * 2, 1)
    probs = torch.softmax(torch.randn(n, vocab, generator=gen) * 2, 1) if with_draft_probs else None
    bonus = torch.randint(0, vocab, (len(counts), 1), generator=gen, dtype=torch.int32)
    uniform = torch.rand(n, generator=gen, dtype=torch.float64)
    inv_q = 1.0 / torch.empty(len(counts), vocab).exponential_(generator=gen)
    out = torch.full((len(counts), max_spec + 1), P, dtype=torch.int32)
    return cu, draft, probs, target, bonus, uniform, inv_q, out


# -- block verification ------------------------------------------------------------------------
@pytest.mark.parametrize("with_draft_probs", [False, True])
def test_block_matches_reference(gen, with_draft_probs):
    counts = [3, 0, 5, 1, 4, 5, 2]
    vocab = 150  # several interpreter tiles
    cu, draft, probs, target, bonus, uniform, inv_q, out = _random_batch(
        gen, counts, vocab, 5, with_draft_probs
    )
    is_greedy = torch.rand(len(counts), generator=gen) < 0.3
    args = (cu, draft, probs, target, bonus, uniform, inv_q, is_greedy)
    want = rejection.rejection_block_sample_torch(out.clone(), *args)
    got = K.rejection_block_sample(out, *args)
    assert torch.equal(got, want)
    assert (got[is_greedy] == P).all() and (got[~is_greedy, 0] != P).all()


def test_block_example():
    """Request 0 drafts the target's own distribution: weights stay 1, h_1 = 0/0 = 0, h_2 = 1: the
    block is accepted with its bonus. Request 1: draft 0 has ratio 9 (w_1 = 1, h_1 = 0.4 / 0.4 = 1),
    draft 1 has target probability 0 (w_2 = h_2 = 0): it stops after one draft and draws from the
    residual (p - q)+ = [0, 0.4, 0] of position 1. Request 2: w_1 = h_1 = 1/3 < u_0: the residual
    [0, 0.3, 0.1] of position 0 (inv_q = 1: its argmax)."""
    vocab = 3
    p = torch.tensor([[0.5, 0.3, 0.2], [0.2, 0.2, 0.6], [0.1, 0.0, 0.9], [0.5, 0.5, 0.0], [0.2, 0.5, 0.3]])
    q = torch.tensor([[0.5, 0.3, 0.2], [0.2, 0.2, 0.6], [0.1, 0.8, 0.1], [0.8, 0.1, 0.1], [0.6, 0.2, 0.2]])
    cu = torch.tensor([2, 4, 5], dtype=torch.int32)
    draft = torch.tensor([0, 2, 2, 2, 0], dtype=torch.int32)
    bonus = torch.tensor([7, 8, 9], dtype=torch.int32)
    uniform = torch.tensor([0.9, 0.99, 0.0, 0.5, 0.9], dtype=torch.float64)
    inv_q = torch.ones(3, vocab)
    is_greedy = torch.zeros(3, dtype=torch.bool)
    for fn in (K.rejection_block_sample, rejection.rejection_block_sample_torch):
        out = torch.full((3, 3), P, dtype=torch.int32)
        assert fn(out, cu, draft, q, p, bonus, uniform, inv_q, is_greedy) is out
        assert out.tolist() == [[0, 2, 7], [2, 1, P], [1, P, P]]


def _prefix_tables(gen, vocab, depth):
    """One distribution per prefix of length 0..depth, ``tables[L][code]`` with ``code`` the prefix
    in base ``vocab``: a target that depends on everything drafted so far."""
    return [
        torch.softmax(torch.randn(vocab**length, vocab, generator=gen) * 0.7, 1)
        for length in range(depth + 1)
    ]


def _sample(table: torch.Tensor, code: torch.Tensor, gen) -> torch.Tensor:
    return torch.multinomial(table[code], 1, generator=gen).squeeze(1)


def _simulate(model_seed, gen, vocab, spec, with_draft_probs, verify):
    """``DRAWS`` single-request steps on the prefix model of ``model_seed``; returns the outputs, the
    code of each row's ``spec + 1`` tokens after continuing the step by target sampling, and the
    expected count of every code."""
    model = torch.Generator().manual_seed(model_seed)
    p_tab = _prefix_tables(model, vocab, spec)
    q_tab = _prefix_tables(model, vocab, spec - 1)
    code = torch.zeros(DRAWS, dtype=torch.int64)
    drafts, targets, draft_rows = [], [], []
    for j in range(spec):
        if with_draft_probs:
            x = _sample(q_tab[j], code, gen)
            draft_rows.append(q_tab[j][code])
        else:  # an n-gram-like proposer: a fixed token per prefix, no probabilities
            x = (code * 7 + 3) % vocab
        drafts.append(x)
        targets.append(p_tab[j][code])
        code = code * vocab + x
    bonus = _sample(p_tab[spec], code, gen).to(torch.int32)
    draft = torch.stack(drafts, 1).reshape(-1).to(torch.int32)
    target = torch.stack(targets, 1).reshape(-1, vocab)
    q = torch.stack(draft_rows, 1).reshape(-1, vocab) if with_draft_probs else None
    cu = torch.arange(1, DRAWS + 1, dtype=torch.int32) * spec
    uniform = torch.rand(DRAWS * spec, generator=gen, dtype=torch.float64)
    inv_q = 1.0 / torch.empty(DRAWS, vocab).exponential_(generator=gen)
    out = torch.full((DRAWS, spec + 1), P, dtype=torch.int32)
    greedy = torch.zeros(DRAWS, dtype=torch.bool)
    if verify == "block":
        rejection.rejection_block_sample_torch(out, cu, draft, q, target, bonus, uniform, inv_q, greedy)
    else:
        recovered = rejection.sample_recovered_tokens_torch(spec, cu, draft, q, target, inv_q)
        rejection.rejection_random_sample_torch(out, cu, draft, q, target, bonus, recovered, uniform, greedy)
    seq = out.to(torch.int64).clone()
    code = torch.zeros(DRAWS, dtype=torch.int64)
    for k in range(spec + 1):
        missing = seq[:, k] == P
        seq[missing, k] = _sample(p_tab[k], code[missing], gen)
        code = code * vocab + seq[:, k]
    expected = torch.ones(1, dtype=torch.float64)
    for k in range(spec + 1):
        expected = (expected.unsqueeze(1) * p_tab[k].double()).reshape(-1)
    return out, code, expected * DRAWS


@pytest.mark.parametrize("spec, vocab", [(1, 5), (2, 4), (3, 3)])
@pytest.mark.parametrize("with_draft_probs", [True, False])
def test_block_preserves_the_target_distribution(spec, vocab, with_draft_probs, chi2_limit):
    """The first ``spec + 1`` tokens (the step's output, continued by target sampling) follow the
    target's joint law over every sequence; block verification accepts at least as many drafts as
    token-wise rejection on the same model."""
    model_seed = 1700 + 10 * spec + with_draft_probs
    gen = torch.Generator().manual_seed(17)
    out, code, expected = _simulate(model_seed, gen, vocab, spec, with_draft_probs, "block")
    observed = torch.bincount(code, minlength=vocab ** (spec + 1)).double()
    stat, dof, p_value = _chi2(observed, expected)
    print(
        f"block spec={spec} vocab={vocab} draft_probs={with_draft_probs}: chi2={stat:.1f} dof={dof} p={p_value:.3f}"
    )
    assert stat < chi2_limit(dof), (stat, dof, p_value)
    accepted = (out != P).sum(1).double() - 1
    strict_out, _, _ = _simulate(model_seed, gen, vocab, spec, with_draft_probs, "strict")
    strict = (strict_out != P).sum(1).double() - 1
    se = ((accepted.var() + strict.var()) / DRAWS).sqrt()
    print(f"  mean accepted: block {accepted.mean():.4f}, token-wise {strict.mean():.4f} (se {se:.4f})")
    assert accepted.mean() >= strict.mean() - 4 * se


# -- entropy verification ----------------------------------------------------------------------
def test_typical_threshold_matches_reference_and_formula(gen, close_ulp):
    vocab = 150
    probs = torch.softmax(torch.randn(7, vocab, generator=gen) * 3, 1)
    probs[0] = 1.0 / vocab  # H = log V: alpha / V
    probs[1] = 0.0
    probs[1, 3] = 1.0  # H = 0: min(epsilon, alpha)
    got = K.typical_acceptance_threshold(probs, 0.09, 0.3)
    close_ulp(got, rejection.typical_acceptance_threshold_torch(probs, 0.09, 0.3), 64)
    assert got[0].item() == pytest.approx(0.3 / vocab, rel=1e-5) and got[1].item() == pytest.approx(0.09)


def test_entropy_example():
    """Request 0: position 0 (H = 1.22 nats, threshold min(0.09, 0.3 e^-H) = 0.0885) accepts draft 1
    (p = 0.5); position 1 (H = 0.59, threshold 0.09) rejects draft 2 (p = 0.05) and takes a draw
    from p (inv_q favours token 3). Request 1: a -1 pad is rejected, a draw from p (token 1) replaces
    it. Request 2 is greedy and untouched."""
    target = torch.tensor([[0.1, 0.5, 0.2, 0.2], [0.05, 0.05, 0.05, 0.85], [0.25] * 4, [0.25] * 4])
    cu = torch.tensor([2, 3, 4], dtype=torch.int32)
    draft = torch.tensor([1, 2, -1, 0], dtype=torch.int32)
    bonus = torch.tensor([50, 51, 52], dtype=torch.int32)
    inv_q = torch.tensor([[1.0, 1.0, 1.0, 100.0], [1.0, 9.0, 1.0, 1.0], [1.0] * 4])
    is_greedy = torch.tensor([False, False, True])
    out = torch.full((3, 3), P, dtype=torch.int32)
    K.rejection_entropy_sample(out, cu, draft, target, bonus, inv_q, is_greedy, 0.09, 0.3)
    assert out.tolist() == [[1, 3, P], [1, P, P], [P, P, P]]


def test_entropy_kernels_match_reference(gen, monkeypatch):
    counts = [3, 0, 5, 1, 4]
    vocab = 150
    cu, draft, _, target, bonus, _, inv_q, out = _random_batch(gen, counts, vocab, 5, False)
    draft = torch.where(torch.rand(draft.shape, generator=gen) < 0.5, target.argmax(1).to(draft.dtype), draft)
    is_greedy = torch.rand(len(counts), generator=gen) < 0.3
    args = (cu, draft, target, bonus, inv_q, is_greedy, 0.09, 0.3)
    got = K.rejection_entropy_sample(out.clone(), *args)
    monkeypatch.setenv("VLLM_ASCEND_KERNEL_BACKEND", "torch")
    assert torch.equal(got, K.rejection_entropy_sample(out, *args))


def test_entropy_follows_its_documented_lossy_law(chi2_limit):
    """One draft position, drafts from q: the output is q(x) [p(x) >= t] + p(x) sum_{p(y) < t} q(y)
    (chi-square), which is not p (the same draws are far from p)."""
    gen = torch.Generator().manual_seed(1717)
    p = torch.tensor([0.45, 0.25, 0.15, 0.08, 0.04, 0.03])
    q = torch.tensor([0.05, 0.1, 0.15, 0.2, 0.25, 0.25])
    epsilon, alpha = 0.09, 0.3
    t = float(rejection.typical_acceptance_threshold_torch(p.unsqueeze(0), epsilon, alpha))
    draft = torch.multinomial(q, DRAWS, replacement=True, generator=gen).to(torch.int32)
    cu = torch.arange(1, DRAWS + 1, dtype=torch.int32)
    inv_q = 1.0 / torch.empty(DRAWS, 6).exponential_(generator=gen)
    out = torch.full((DRAWS, 2), P, dtype=torch.int32)
    target = p.expand(DRAWS, 6).contiguous()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_ASCEND_KERNEL_BACKEND", "torch")
        K.rejection_entropy_sample(
            out, cu, draft, target, torch.full((DRAWS,), 99, dtype=torch.int32), inv_q,
            torch.zeros(DRAWS, dtype=torch.bool), epsilon, alpha,
        )  # fmt: skip
    first = out[:, 0].to(torch.int64)
    observed = torch.bincount(first, minlength=6).double()
    keep = p >= t
    law = (q * keep + p * q[~keep].sum()).double()
    stat, dof, p_value = _chi2(observed, law * DRAWS)
    print(f"entropy law: threshold={t:.4f} chi2={stat:.1f} dof={dof} p={p_value:.3f}")
    assert stat < chi2_limit(dof)
    accepted = out[:, 1] == 99
    assert torch.equal(accepted, keep[draft.long()])  # deterministic: accepted iff p(d) >= t
    stat_p, _, _ = _chi2(observed, p.double() * DRAWS)
    assert stat_p > 100 * chi2_limit(dof)  # not the target distribution


# -- greedy: block and entropy give the target argmax -------------------------------------------
@pytest.mark.parametrize("with_draft_probs", [False, True])
def test_block_and_entropy_at_temperature_zero_give_the_argmax_tokens(gen, with_draft_probs):
    """A temperature-0 target (one-hot at its argmax): block and entropy verification write exactly
    what greedy verification writes, whatever the uniforms and exponentials."""
    counts = [3, 0, 5, 1, 4, 5, 2]
    vocab = 5
    cu, draft, probs, _, bonus, uniform, inv_q, out = _random_batch(gen, counts, vocab, 5, with_draft_probs)
    argmax = torch.randint(0, vocab, draft.shape, generator=gen)
    draft = torch.where(torch.rand(draft.shape, generator=gen) < 0.6, argmax.to(draft.dtype), draft)
    one_hot = torch.nn.functional.one_hot(argmax, vocab).float()
    greedy = K.rejection_greedy_sample(out.clone(), cu, draft, argmax, bonus)
    random_rows = torch.zeros(len(counts), dtype=torch.bool)
    block = K.rejection_block_sample(
        out.clone(), cu, draft, probs, one_hot, bonus, uniform, inv_q, random_rows
    )
    entropy = K.rejection_entropy_sample(
        out.clone(), cu, draft, one_hot, bonus, inv_q, random_rows, 0.09, 0.3
    )
    assert torch.equal(block, greedy) and torch.equal(entropy, greedy)


# -- synthetic acceptance ----------------------------------------------------------------------
def test_synthetic_matches_reference(gen):
    counts = [3, 0, 5, 1, 4, 5, 2]
    cu, draft, _, _, bonus, uniform, _, out = _random_batch(gen, counts, 9, 5, False)
    replacement = torch.randint(0, 9, draft.shape, generator=gen, dtype=torch.int32)
    rates = torch.tensor([0.9, 0.7, 0.5, 0.3])  # position 4 is past the rates: rejected
    args = (cu, draft, replacement, bonus, uniform, rates)
    want = rejection.rejection_synthetic_sample_torch(out.clone(), *args)
    assert torch.equal(K.rejection_synthetic_sample(out, *args), want)
    assert (want[:, 5] == P).all()


def test_synthetic_acceptance_follows_the_rates():
    """Conditional rates c_j give P(at least j + 1 accepted) = prod c_0..c_j, whatever the tokens."""
    gen = torch.Generator().manual_seed(1718)
    spec = 3
    unconditional = torch.tensor([0.8, 0.5, 0.2], dtype=torch.float64)
    conditional = (unconditional / torch.cat([unconditional.new_ones(1), unconditional[:-1]])).float()
    cu = torch.arange(1, DRAWS + 1, dtype=torch.int32) * spec
    draft = torch.randint(0, 50, (DRAWS * spec,), generator=gen, dtype=torch.int32)
    uniform = torch.rand(DRAWS * spec, generator=gen, dtype=torch.float64)
    out = torch.full((DRAWS, spec + 1), P, dtype=torch.int32)
    rejection.rejection_synthetic_sample_torch(
        out, cu, draft, draft + 100, torch.zeros(DRAWS, dtype=torch.int32), uniform, conditional
    )
    accepted = ((out != P).sum(1) - 1).to(torch.int64)
    observed = torch.bincount(accepted, minlength=spec + 1).double()
    at_least = torch.cat([unconditional.new_ones(1), unconditional])
    expected = (at_least - torch.cat([unconditional, unconditional.new_zeros(1)])) * DRAWS
    stat, dof, p_value = _chi2(observed, expected)
    print(f"synthetic: chi2={stat:.1f} dof={dof} p={p_value:.3f}")
    assert stat < 3 * dof + 30


def test_bad_shapes_are_named():
    cu = torch.tensor([1, 2], dtype=torch.int32)
    draft, probs = torch.tensor([1, 2]), torch.full((2, 4), 0.25)
    out = torch.full((2, 2), P, dtype=torch.int32)
    greedy = torch.zeros(2, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"inv_q must be \[B, V\] = \(2, 4\), got \(2, 3\)"):
        K.rejection_block_sample(out, cu, draft, None, probs, cu, torch.rand(2), torch.ones(2, 3), greedy)
    with pytest.raises(ValueError, match=r"conditional_rates must be \[S\] with S >= 1, got \(0,\)"):
        K.rejection_synthetic_sample(out, cu, draft, draft, cu, torch.rand(2), torch.zeros(0))
