"""AscendSampler310: CDF sampling from host uniforms — its law, seeded reproducibility, greedy rows."""

from __future__ import annotations

import os

os.environ.setdefault("VLLM_ASCEND_DEVICE", "reference")  # the platform vLLM resolves in the samplers
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from types import SimpleNamespace

import pytest
import torch
from scipy.stats import chisquare
from vllm.v1.sample.logits_processor import LogitsProcessors
from vllm.v1.sample.logits_processor.builtin import MinPLogitsProcessor
from vllm.v1.sample.metadata import SamplingMetadata

from vllm_ascend.ascend310p.sample.sampler import (
    AscendSampler310,
    _generate_request_uniforms_310p,
    _prepare_cpu_generators_310p,
    _sample_from_cdf_310p,
    fill_exponential_310p,
)
from vllm_ascend.runner.sample.sampler import AscendSampler

V = 12
N = 20_000  # draws per distribution test, one row each, in one call
P_MIN = 1e-3
BASE = torch.tensor([0.3, -1.2, 1.1, 0.0, 2.0, -0.4, 0.8, -2.0, 1.6, 0.5, -0.9, 1.3])


def _metadata(batch: int, **overrides) -> SamplingMetadata:
    fields = dict(
        temperature=torch.ones(batch),
        all_greedy=False,
        all_random=True,
        top_p=None,
        top_k=None,
        generators={},
        max_num_logprobs=None,
        logprob_token_ids=None,
        no_penalties=True,
        prompt_token_ids=None,
        frequency_penalties=torch.zeros(batch),
        presence_penalties=torch.zeros(batch),
        repetition_penalties=torch.ones(batch),
        output_token_ids=[[] for _ in range(batch)],
        spec_token_ids=[[] for _ in range(batch)],
        allowed_token_ids_mask=None,
        bad_words_token_ids={},
        logitsprocs=LogitsProcessors(),
    )
    fields.update(overrides)
    return SamplingMetadata(**fields)


def _min_p_processors(batch: int, min_p: float) -> LogitsProcessors:
    config = SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=batch))
    processor = MinPLogitsProcessor(config, torch.device("cpu"), False)  # type: ignore[arg-type]
    processor.min_p = torch.full((batch,), min_p)
    processor.min_p_count = batch
    return LogitsProcessors([processor])


def _assert_follows(tokens: torch.Tensor, expected: torch.Tensor) -> None:
    """Tokens never outside ``expected``'s support, and χ² of the counts against it with p > P_MIN."""
    counts = torch.bincount(tokens.view(-1), minlength=expected.numel()).double()
    support = expected > 0
    assert counts[~support].sum() == 0, f"masked tokens drawn: {counts[~support].tolist()}"
    observed = counts[support]
    law = expected[support].double()
    result = chisquare(observed.numpy(), (law / law.sum() * observed.sum()).numpy())
    assert result.pvalue > P_MIN, (observed.tolist(), expected[support].tolist(), result)


def _kept(probs: torch.Tensor, top_k: int | None, top_p: float | None, min_p: float | None) -> torch.Tensor:
    """The renormalised distribution over the tokens each filter keeps, by their definitions."""
    keep = torch.ones_like(probs, dtype=torch.bool)
    order = probs.argsort(descending=True)
    if top_k is not None:
        keep[order[top_k:]] = False
    if top_p is not None:
        masked = torch.where(keep, probs, 0.0)
        mass = (masked[order] / masked.sum()).cumsum(0)
        first_enough = int((mass < top_p).sum())  # the smallest prefix holding at least top_p
        keep[order[first_enough + 1 :]] = False
    if min_p is not None:
        keep &= probs >= min_p * probs.max()
    kept = torch.where(keep, probs, 0.0)
    return kept / kept.sum()


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p", "min_p"),
    [(1.0, None, None, None), (0.7, None, None, None), (1.0, 5, None, None), (1.0, None, 0.8, None),
     (1.0, None, None, 0.15), (1.3, 7, 0.9, 0.05)],
)  # fmt: skip
def test_random_rows_follow_the_filtered_softmax(temperature, top_k, top_p, min_p):
    torch.manual_seed(20)
    md = _metadata(
        N,
        temperature=torch.full((N,), temperature),
        top_k=None if top_k is None else torch.full((N,), top_k, dtype=torch.int64),
        top_p=None if top_p is None else torch.full((N,), top_p),
        logitsprocs=_min_p_processors(N, min_p) if min_p is not None else LogitsProcessors(),
    )
    tokens = AscendSampler310()(BASE.repeat(N, 1), md).sampled_token_ids
    assert tokens.shape == (N, 1) and tokens.dtype == torch.int32
    expected = _kept(torch.softmax(BASE / temperature, 0), top_k, top_p, min_p)
    filtered = (top_k, top_p, min_p) != (None, None, None)
    assert int((expected > 0).sum()) < V if filtered else V  # the filters mask some tokens here
    _assert_follows(tokens, expected)


def test_cdf_inversion_edges_never_return_a_zero_probability_token():
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.5, 0.0]]).repeat(5, 1)
    uniforms = torch.tensor([0.0, 0.4999, 0.5, 0.99999, 1.0 - 2.0**-40], dtype=torch.float64)
    assert _sample_from_cdf_310p(probs, uniforms).tolist() == [1, 1, 3, 3, 3]
    last_masked = torch.tensor([[0.25, 0.75, 0.0]])  # u -> 1 lands past the cdf: last positive token
    assert _sample_from_cdf_310p(last_masked, torch.tensor([1.0])).tolist() == [1]


def _seeded_run(seeds: list[int | None], logits: torch.Tensor, steps: int, sampler=None) -> torch.Tensor:
    """``[steps, B]`` tokens of a batch with the given per-row seeds (``None``: unseeded)."""
    sampler = sampler or AscendSampler310()
    generators = {i: torch.Generator().manual_seed(s) for i, s in enumerate(seeds) if s is not None}
    md = _metadata(len(seeds), generators=generators)
    return torch.stack([sampler(logits.clone(), md).sampled_token_ids.view(-1) for _ in range(steps)])


def test_seeded_rows_reproduce_across_instances_and_batches():
    flat = torch.randn(64, generator=torch.Generator().manual_seed(0)) * 0.3
    alone = _seeded_run([7], flat.repeat(1, 1), 8)[:, 0]
    assert len(set(alone.tolist())) > 1  # the stream continues across steps
    assert torch.equal(_seeded_run([7], flat.repeat(1, 1), 8)[:, 0], alone)  # another instance
    mixed = _seeded_run([None, 3, 7, None], flat.repeat(4, 1), 8)
    assert torch.equal(mixed[:, 2], alone)  # same tokens whatever else is in the batch, at any row
    assert not torch.equal(_seeded_run([8], flat.repeat(1, 1), 8)[:, 0], alone)
    assert not torch.equal(mixed[:, 1], alone)


def test_host_generators_are_cached_per_request_generator():
    request = torch.Generator().manual_seed(11)
    first = _prepare_cpu_generators_310p({0: request, 5: torch.Generator()}, 2)
    assert list(first) == [0]  # rows past the batch are ignored
    assert _prepare_cpu_generators_310p({3: request}, 4)[3] is first[0]


def test_request_uniforms_skip_rows_without_draws():
    gens = {1: torch.Generator().manual_seed(1), 2: torch.Generator().manual_seed(2)}
    cpu = _prepare_cpu_generators_310p(gens, 3)
    before = cpu[1].get_state()
    u = _generate_request_uniforms_310p([2, 0, 3], cpu, torch.device("cpu"), pin_memory=False)
    assert u.shape == (5,) and u.dtype == torch.float64 and bool(((u >= 0) & (u < 1)).all())
    assert torch.equal(cpu[1].get_state(), before)  # row 1 has no draws: its stream is untouched
    again = _prepare_cpu_generators_310p({2: torch.Generator().manual_seed(2)}, 3)
    assert torch.equal(_generate_request_uniforms_310p([0, 0, 3], again, torch.device("cpu"), False), u[2:])


def test_fill_exponential_is_host_drawn_positive_and_seeded_per_row():
    def draw(seed):
        out = torch.empty(4, 1000)
        return fill_exponential_310p(out, {1: torch.Generator().manual_seed(seed)}, pin_memory=False)

    a, b = draw(5), draw(5)
    assert torch.equal(a[1], b[1]) and not torch.equal(a[0], b[0])
    assert not torch.equal(draw(6)[1], a[1])
    assert bool((a > 0).all()) and abs(float(a.mean()) - 1.0) < 0.06
    with pytest.raises(ValueError, match=r"floating tensor, got dtype torch\.int64"):
        fill_exponential_310p(torch.empty(2, 3, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"row_generators has row 4; out has rows 0\.\.1"):
        fill_exponential_310p(torch.empty(2, 3), {4: torch.Generator()})


def test_greedy_rows_take_the_argmax_in_a_mixed_batch():
    logits = torch.randn(6, 32, generator=torch.Generator().manual_seed(3)) * 3
    temperature = torch.tensor([0.0, 1.0, 0.0, 0.8, 0.0, 1.5])
    md = _metadata(6, temperature=temperature, all_random=False)
    out = AscendSampler310()(logits.clone(), md).sampled_token_ids.view(-1)
    greedy = temperature == 0
    assert out[greedy].tolist() == logits.argmax(-1)[greedy].tolist()


@pytest.mark.parametrize("mode", ["raw_logprobs", "processed_logprobs"])
def test_all_greedy_batches_and_logprobs_equal_the_runner_sampler(mode):
    logits = torch.randn(5, 40, generator=torch.Generator().manual_seed(4)) * 2
    md = _metadata(5, temperature=torch.zeros(5), all_greedy=True, all_random=False, max_num_logprobs=3)
    ours, theirs = AscendSampler310(mode)(logits.clone(), md), AscendSampler(mode)(logits.clone(), md)
    assert torch.equal(ours.sampled_token_ids, theirs.sampled_token_ids)
    assert ours.sampled_token_ids.view(-1).tolist() == logits.argmax(-1).tolist()
    for field in ("logprob_token_ids", "logprobs", "selected_token_ranks"):
        assert torch.equal(getattr(ours.logprobs_tensors, field), getattr(theirs.logprobs_tensors, field))


def test_random_batch_logprobs_equal_the_runner_sampler():
    """Processed logprobs of a random batch (full rows, -1) do not depend on the draw: equal to the parent's."""
    logits = torch.randn(4, 40, generator=torch.Generator().manual_seed(5)) * 2
    md = _metadata(4, top_k=torch.full((4,), 6, dtype=torch.int64), max_num_logprobs=-1)
    ours = AscendSampler310("processed_logprobs")(logits.clone(), md)
    theirs = AscendSampler("processed_logprobs")(logits.clone(), md)
    assert torch.equal(ours.logprobs_tensors.logprobs, theirs.logprobs_tensors.logprobs)
    assert int(torch.isfinite(ours.logprobs_tensors.logprobs).sum()) == 4 * 6
    kept = torch.isfinite(ours.logprobs_tensors.logprobs).gather(1, ours.sampled_token_ids.long())
    assert bool(kept.all())  # every sampled token is inside its row's top-6
