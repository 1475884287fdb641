"""AscendRejectionSampler310: verification with host randomness — the target law is kept, greedy rows
match the argmax, seeded requests reproduce, and every random draw comes from the host."""

from __future__ import annotations

import os

os.environ.setdefault("VLLM_ASCEND_DEVICE", "reference")  # the platform vLLM resolves in the samplers
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from types import SimpleNamespace

import pytest
import torch
from scipy.stats import chisquare
from vllm.v1.sample.logits_processor import LogitsProcessors
from vllm.v1.sample.metadata import SamplingMetadata
from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

from vllm_ascend.ascend310p.sample.rejection_sampler import (
    AscendRejectionSampler310,
    rejection_sample_310p,
)
from vllm_ascend.ascend310p.sample.sampler import AscendSampler310
from vllm_ascend.core.config import clear_ascend_config, init_ascend_config
from vllm_ascend.runner.sample import rejection_sampler as runner_rejection
from vllm_ascend.runner.sample.rejection_sampler import Verification

P = -1
V = 8
N = 20_000  # requests with one draft each, verified in one call
P_MIN = 1e-3
TARGET = torch.softmax(torch.tensor([1.2, -0.3, 0.4, 2.0, -1.0, 0.9, 0.1, -2.0]), 0)
DRAFT = torch.softmax(torch.tensor([0.1, 1.5, -0.2, 1.0, 0.5, -1.0, 1.1, 0.3]), 0)


def _md(temperature: list[float], generators=None) -> SimpleNamespace:
    t = torch.tensor(temperature)
    return SimpleNamespace(
        all_greedy=bool((t == 0).all()),
        all_random=bool((t > 0).all()),
        temperature=t,
        generators=generators or {},
    )


def _one_draft_each(draft: torch.Tensor, draft_probs: torch.Tensor | None) -> torch.Tensor:
    """``[n, 2]`` outputs of ``n`` random requests with one draft each and the target :data:`TARGET`."""
    n = draft.numel()
    return rejection_sample_310p(
        draft.to(torch.int32), [1] * n, 1, torch.arange(1, n + 1, dtype=torch.int32), draft_probs,
        TARGET.log().repeat(n, 1), torch.full((n, 1), 7, dtype=torch.int32), _md([1.0] * n), pin_memory=False,
    )  # fmt: skip


def _assert_law(tokens: torch.Tensor, law: torch.Tensor) -> None:
    """No token outside ``law``'s support, and χ² of the counts against ``law`` with p > P_MIN."""
    counts = torch.bincount(tokens.long(), minlength=law.numel()).double()
    support = law > 0
    assert counts[~support].sum() == 0, counts.tolist()
    expected = law[support].double() / law[support].double().sum() * counts.sum()
    result = chisquare(counts[support].numpy(), expected.numpy())
    assert result.pvalue > P_MIN, (counts.tolist(), expected.tolist(), result)


def _assert_rate(hits: torch.Tensor, rate: float) -> None:
    """The fraction of ``hits`` is within 4 standard errors of ``rate``."""
    got = float(hits.double().mean())
    assert abs(got - rate) < 4 * (rate * (1 - rate) / hits.numel()) ** 0.5, (got, rate)


def test_draft_model_drafts_keep_the_target_law_and_accept_the_overlap():
    torch.manual_seed(310)
    draft = torch.multinomial(DRAFT, N, replacement=True, generator=torch.Generator().manual_seed(1))
    out = _one_draft_each(draft, DRAFT.repeat(N, 1))
    assert out.shape == (N, 2) and out.dtype == torch.int32
    accepted = out[:, 1] != P
    assert bool((out[accepted, 0] == draft.to(torch.int32)[accepted]).all()) and bool(
        (out[accepted, 1] == 7).all()
    )
    _assert_rate(accepted, float(torch.minimum(TARGET, DRAFT).sum()))
    _assert_law(out[:, 0], TARGET)
    _assert_law(out[~accepted, 0], (TARGET - DRAFT).clamp(min=0))  # rejections draw from the residual


def test_ngram_drafts_are_one_hot_and_keep_the_target_law():
    torch.manual_seed(311)
    out = _one_draft_each(torch.full((N,), 5), None)  # q one-hot at 5: accepted with probability p(5)
    _assert_rate(out[:, 1] != P, float(TARGET[5]))
    _assert_law(out[:, 0], TARGET)
    assert not bool((out[out[:, 1] == P, 0] == 5).any())  # a rejected draft is never its own replacement


def test_greedy_rows_match_the_argmax_and_all_greedy_equals_the_runner():
    draft = torch.tensor([3, 4, 6, 2, 1], dtype=torch.int32)
    cu = torch.tensor([2, 4, 5], dtype=torch.int32)
    logits = torch.full((5, V), -30.0)
    logits[0, 3] = logits[1, 5] = 5.0  # row 0: draft 3 accepted, draft 4 replaced by 5
    logits[2, 6] = logits[3, 2] = 40.0  # row 1 (random): p(draft) = 1, both accepted, then the bonus
    logits[4, 1] = 5.0  # row 2: its only draft accepted, then the bonus
    bonus = torch.tensor([[7], [1], [0]], dtype=torch.int32)
    mixed = rejection_sample_310p(draft, [2, 2, 1], 2, cu, None, logits, bonus, _md([0.0, 0.7, 0.0]))
    assert mixed.tolist() == [[3, 5, P], [6, 2, 1], [1, 0, P]]
    state = torch.random.get_rng_state()
    greedy = _md([0.0, 0.0, 0.0])
    ours = rejection_sample_310p(draft, [2, 2, 1], 2, cu, None, logits, bonus, greedy)
    assert torch.equal(torch.random.get_rng_state(), state)  # greedy verification draws nothing
    assert torch.equal(
        ours, runner_rejection.rejection_sample(draft, [2, 2, 1], 2, cu, None, logits, bonus, greedy)
    )
    assert ours.tolist() == [[3, 5, P], [6, 2, 1], [1, 0, P]]


def _seeded_rows(seeds: list[int | None], steps: int) -> torch.Tensor:
    """``[steps, B, 4]`` outputs of requests with three uniform drafts each over a flat target."""
    batch = len(seeds)
    gens = {i: torch.Generator().manual_seed(s) for i, s in enumerate(seeds) if s is not None}
    md = _md([1.0] * batch, gens)
    draft = torch.tensor([0, 1, 2] * batch, dtype=torch.int32)
    cu = torch.arange(3, 3 * batch + 1, 3, dtype=torch.int32)
    logits = torch.zeros(3 * batch, V)
    q = torch.full((3 * batch, V), 0.02)
    q[torch.arange(3 * batch), draft.long()] = 1 - 0.02 * (V - 1)  # drafts overconfident: p/q = 0.146
    bonus = torch.full((batch, 1), 7, dtype=torch.int32)
    return torch.stack(
        [rejection_sample_310p(draft, [3] * batch, 3, cu, q, logits.clone(), bonus, md) for _ in range(steps)]
    )


def test_seeded_requests_reproduce_whatever_the_batch():
    alone = _seeded_rows([9], 6)[:, 0]
    assert len({tuple(r) for r in alone.tolist()}) > 1  # the stream continues across steps
    assert torch.equal(_seeded_rows([9], 6)[:, 0], alone)
    mixed = _seeded_rows([None, 4, 9], 6)
    assert torch.equal(mixed[:, 2], alone)
    assert not torch.equal(_seeded_rows([10], 6)[:, 0], alone)
    assert not torch.equal(mixed[:, 1], alone)


@pytest.mark.parametrize("method", ["block", "entropy"])
def test_block_and_entropy_verification(method):
    draft = torch.tensor([3, 4, 6, 2], dtype=torch.int32)
    logits = torch.full((4, V), -30.0)
    logits[0, 3] = logits[1, 5] = 5.0
    logits[2, 6] = logits[3, 2] = 40.0
    out = rejection_sample_310p(
        draft, [2, 2], 2, torch.tensor([2, 4], dtype=torch.int32), None, logits, torch.tensor([[7], [1]]),
        _md([0.0, 0.7]), verification=Verification(method), pin_memory=False,
    )  # fmt: skip
    assert out.tolist() == [[3, 5, P], [6, 2, 1]]


def test_synthetic_mode_accepts_by_the_rates():
    draft = torch.tensor([3, 4, 6, 2], dtype=torch.int32)
    logits = torch.full((4, V), -30.0)
    logits[0, 1] = logits[1, 5] = logits[2, 0] = 5.0
    logits[3, 2] = logits[3, 7] = 40.0  # random row: mass on 2 (its draft, removed) and 7
    out = rejection_sample_310p(
        draft, [2, 2], 2, torch.tensor([2, 4], dtype=torch.int32), None, logits, torch.tensor([[7], [1]]),
        _md([0.0, 0.7]), synthetic_mode=True, synthetic_conditional_rates=torch.tensor([1.0, 0.0]),
    )  # fmt: skip
    assert out.tolist() == [[3, 5, P], [6, 7, P]]
    with pytest.raises(ValueError, match="synthetic_mode needs synthetic_conditional_rates"):
        rejection_sample_310p(draft, [2, 2], 2, torch.tensor([2, 4]), None, logits, torch.tensor([[7], [1]]),
                              _md([0.0, 0.7]), synthetic_mode=True)  # fmt: skip


def _sampling_metadata(temperature: list[float], generators) -> SamplingMetadata:
    b = len(temperature)
    t = torch.tensor(temperature)
    return SamplingMetadata(
        temperature=t, all_greedy=bool((t == 0).all()), all_random=bool((t > 0).all()), top_p=None, top_k=None,
        generators=generators, max_num_logprobs=None, logprob_token_ids=None, no_penalties=True,
        prompt_token_ids=None, frequency_penalties=torch.zeros(b), presence_penalties=torch.zeros(b),
        repetition_penalties=torch.ones(b), output_token_ids=[[] for _ in range(b)],
        spec_token_ids=[[] for _ in range(b)], allowed_token_ids_mask=None, bad_words_token_ids={},
        logitsprocs=LogitsProcessors(),
    )  # fmt: skip


def _spec_metadata(drafts: list[list[int]]) -> SpecDecodeMetadata:
    """vLLM's layout: each request's target rows, then its bonus row, in one logits tensor."""
    counts = [len(d) for d in drafts]
    starts = torch.tensor([sum(counts[:i]) + i for i in range(len(drafts))])
    target = torch.cat([s + torch.arange(n) for s, n in zip(starts.tolist(), counts, strict=True)])
    return SpecDecodeMetadata(
        draft_token_ids=torch.tensor([t for d in drafts for t in d], dtype=torch.int32),
        num_draft_tokens=counts,
        cu_num_draft_tokens=torch.tensor(counts).cumsum(0).to(torch.int32),
        cu_num_sampled_tokens=(torch.tensor(counts) + 1).cumsum(0).to(torch.int32),
        target_logits_indices=target.to(torch.int32),
        bonus_logits_indices=(starts + torch.tensor(counts)).to(torch.int32),
        logits_indices=torch.arange(sum(counts) + len(drafts), dtype=torch.int32),
    )


@pytest.fixture
def ascend_config():
    init_ascend_config({})
    yield
    clear_ascend_config()


def test_forward_through_vllm_contract_and_seeds(ascend_config, monkeypatch):
    drafts = [[3, 1], [2, 5, 6]]
    metadata = _spec_metadata(drafts)
    logits = torch.randn(7, V, generator=torch.Generator().manual_seed(2))
    logits[0, 3] = logits[1, 4] = 20.0  # greedy row 0: 3 accepted, 1 -> 4, stop
    device_draws = []
    monkeypatch.setattr(
        runner_rejection.DEVICE_RANDOMNESS, "uniforms", lambda *a, **k: device_draws.append(a) or None
    )

    def run():
        sampler = AscendRejectionSampler310(AscendSampler310())
        md = _sampling_metadata([0.0, 0.9], {1: torch.Generator().manual_seed(21)})
        return [sampler(metadata, None, logits.clone(), md).sampled_token_ids for _ in range(4)]

    first, again = run(), run()
    assert device_draws == []  # every draw came from the host
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))  # seeded random row 1 reproduces
    assert len({tuple(out[1].tolist()) for out in first}) > 1
    for out in first:
        assert out.shape == (2, 4) and out.dtype == torch.int32
        assert out[0].tolist() == [3, 4, P, P]
        row = out[1].tolist()
        n = next((i for i, tok in enumerate(row) if tok == P), 4)
        assert (
            n >= 1 and all(tok == P for tok in row[n:]) and row[: max(n - 1, 0)] == [2, 5, 6][: max(n - 1, 0)]
        )
