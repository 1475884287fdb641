"""310P's random draws: the adaptor op ``random_fill`` on the host RNG (310P has no device random path for
sampling), its per-request reproducibility, and the runner's V1 samplers drawing through it on 310P."""

from __future__ import annotations

import os

os.environ.setdefault("VLLM_ASCEND_DEVICE", "reference")  # the platform vLLM resolves in the samplers
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from vllm.v1.sample.logits_processor import LogitsProcessors
from vllm.v1.sample.metadata import SamplingMetadata

from vllm_ascend.ascend310p.overlay import (
    Ascend310PDeviceAdaptor,
    Ascend310PReferenceAdaptor,
    cpu_generator_of,
    host_random_fill_310p,
)
from vllm_ascend.core.device.adaptor.base import RANDOM_SEED_BOUND, DeviceOpError
from vllm_ascend.core.device.config import clear_device_caches, get_device_adaptor


@pytest.fixture
def adaptor() -> Ascend310PReferenceAdaptor:
    return Ascend310PReferenceAdaptor()


@pytest.fixture
def family_310p(monkeypatch):
    monkeypatch.setenv("VLLM_ASCEND_DEVICE", "reference")
    monkeypatch.setenv("VLLM_ASCEND_REFERENCE_FAMILY", "310p")
    clear_device_caches()
    yield get_device_adaptor()
    clear_device_caches()


def _seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_both_310p_adaptors_draw_on_the_host():
    for cls in (Ascend310PDeviceAdaptor, Ascend310PReferenceAdaptor):
        assert cls.__dict__["random_fill"].__wrapped__ is host_random_fill_310p  # counted, host drawn


def test_unseeded_rows_come_from_the_global_cpu_rng(adaptor):
    torch.manual_seed(3)
    got = adaptor.random_fill(torch.empty(5, dtype=torch.float64), "uniform")
    torch.manual_seed(3)
    assert torch.equal(got, torch.empty(5, dtype=torch.float64).uniform_())
    assert adaptor.call_counts["random_fill"] == 1


def test_a_seeded_segment_draws_from_its_requests_initial_seed_not_its_device_state(adaptor):
    """The request generator stands for a device generator 310P cannot draw from: its initial seed keys a
    host generator, so advancing the request generator itself changes nothing."""
    request = _seeded(11)
    torch.rand(100, generator=request)  # state moved; the host stream still starts at the seed
    got = adaptor.random_fill(torch.empty(7, dtype=torch.float64), "uniform", {1: request}, counts=[2, 3, 2])
    assert torch.equal(got[2:5], torch.empty(3, dtype=torch.float64).uniform_(generator=_seeded(11)))


def test_seeded_requests_reproduce_whatever_the_batch(adaptor):
    alone = adaptor.random_fill(torch.empty(3, dtype=torch.float64), "uniform", {0: _seeded(5)}, counts=[3])
    batched = adaptor.random_fill(
        torch.empty(6, dtype=torch.float64), "uniform", {2: _seeded(5), 0: _seeded(9)}, counts=[2, 1, 3]
    )
    assert torch.equal(batched[3:6], alone)
    other = adaptor.random_fill(torch.empty(3, dtype=torch.float64), "uniform", {0: _seeded(6)}, counts=[3])
    assert not torch.equal(other, alone)


def test_a_requests_host_stream_continues_across_steps(adaptor):
    request = _seeded(21)
    first = adaptor.random_fill(torch.empty(1, 4), "exponential", {0: request})
    second = adaptor.random_fill(torch.empty(1, 4), "exponential", {0: request})
    assert cpu_generator_of(request) is cpu_generator_of(request)
    stream = torch.empty(2, 4).exponential_(generator=_seeded(21))
    assert torch.equal(first[0], stream[0]) and torch.equal(second[0], stream[1])


def test_segments_without_rows_draw_nothing_from_their_generator(adaptor):
    request = _seeded(4)
    adaptor.random_fill(torch.empty(2, dtype=torch.float64), "uniform", {0: request}, counts=[0, 2])
    nxt = adaptor.random_fill(torch.empty(1, dtype=torch.float64), "uniform", {0: request})
    assert torch.equal(nxt, torch.empty(1, dtype=torch.float64).uniform_(generator=_seeded(4)))


def test_exponentials_stay_positive_and_seeds_in_range(adaptor):
    exp = adaptor.random_fill(torch.empty(64, 512, dtype=torch.float16), "exponential")
    assert bool((exp >= torch.finfo(torch.float16).tiny).all()) and torch.isfinite(exp.reciprocal()).all()
    seeds = adaptor.random_fill(torch.empty(256, dtype=torch.int64), "seed", {3: _seeded(1)})
    assert bool(((seeds >= 0) & (seeds < RANDOM_SEED_BOUND)).all())
    again = adaptor.random_fill(torch.empty(4, dtype=torch.int64), "seed", {3: _seeded(1)})
    assert again[3] == seeds[3]


@pytest.mark.parametrize(
    ("out", "distribution", "generators", "counts", "match"),
    [
        (torch.empty(2), "normal", None, None, "distribution='normal' is invalid"),
        (torch.empty(2), "seed", None, None, "'seed' needs an int64 out"),
        (torch.empty(2, dtype=torch.int64), "uniform", None, None, "needs a floating out"),
        (torch.empty(3), "uniform", None, [1, 1], r"sum to out's 3 rows"),
        (torch.empty(2), "uniform", {2: torch.Generator()}, None, r"generators for segments \[2\]"),
    ],
)
def test_arguments_outside_the_contract_are_refused(adaptor, out, distribution, generators, counts, match):
    with pytest.raises(DeviceOpError, match=match):
        adaptor.random_fill(out, distribution, generators, counts)


def _metadata(batch: int, generators: dict[int, torch.Generator]) -> SamplingMetadata:
    return SamplingMetadata(
        temperature=torch.ones(batch),
        all_greedy=False,
        all_random=True,
        top_p=None,
        top_k=None,
        generators=generators,
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


def test_the_runners_v1_sampler_draws_its_seeds_on_the_310p_host_rng(family_310p):
    """V1 on 310P is the runner's sampler; its only random draw (one seed per row) is the adaptor's host op,
    so a seeded request samples the same tokens alone and in a batch, step after step."""
    from vllm_ascend.runner.sample.sampler import AscendSampler

    assert type(family_310p) is Ascend310PReferenceAdaptor
    logits = torch.randn(3, 50, generator=_seeded(0))

    def steps(rows: list[int], generators: dict[int, torch.Generator]) -> list[list[int]]:
        sampler = AscendSampler()
        md = _metadata(len(rows), generators)
        return [sampler(logits[rows].clone(), md).sampled_token_ids.view(-1).tolist() for _ in range(4)]

    family_310p.call_counts.clear()
    batched = steps([0, 1, 2], {1: _seeded(7)})
    alone = steps([1], {0: _seeded(7)})
    assert [s[1] for s in batched] == [s[0] for s in alone]
    assert family_310p.call_counts["random_fill"] == 8


def test_the_runners_v1_rejection_sampler_verifies_on_the_310p_host_rng(family_310p):
    """Draft verification on V1 draws its uniforms and recovered-token exponentials through the host op: a
    seeded request's outputs do not depend on its batch."""
    from vllm_ascend.runner.sample.rejection_sampler import rejection_sample

    vocab, drafts = 16, 3
    target = torch.randn(drafts, vocab, generator=_seeded(1))

    def verify(num_requests: int, row: int) -> torch.Tensor:
        cu = torch.arange(1, num_requests + 1, dtype=torch.int32) * drafts
        md = _metadata(num_requests, {row: _seeded(13)})
        draft = torch.cat(
            [torch.randint(0, vocab, (drafts,), generator=_seeded(2 + r)) for r in range(num_requests)]
        )
        out = rejection_sample(
            draft.to(torch.int32),
            [drafts] * num_requests,
            drafts,
            cu,
            None,
            target.repeat(num_requests, 1),
            torch.zeros(num_requests, 1, dtype=torch.int32),
            md,
        )
        return out[row]

    family_310p.call_counts.clear()
    alone = verify(1, 0)
    assert family_310p.call_counts["random_fill"] == 2  # uniforms + recovery exponentials
    assert torch.equal(verify(3, 0), alone)
