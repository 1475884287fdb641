"""AscendSampler: greedy, seeded random, top-k, penalties, bad words and logprobs."""

from __future__ import annotations

import types

import pytest
import torch
from vllm.v1.sample.logits_processor import LogitsProcessors
from vllm.v1.sample.metadata import SamplingMetadata

from vllm_ascend.runner.sample.sampler import AscendSampler, bad_words_csr, pad_token_lists, sampling_seeds

B, V = 6, 64


def _metadata(**overrides) -> SamplingMetadata:
    fields = dict(
        temperature=torch.full((B,), 1.0),
        all_greedy=False,
        all_random=True,
        top_p=None,
        top_k=None,
        generators={},
        max_num_logprobs=None,
        logprob_token_ids=None,
        no_penalties=True,
        prompt_token_ids=None,
        frequency_penalties=torch.zeros(B),
        presence_penalties=torch.zeros(B),
        repetition_penalties=torch.ones(B),
        output_token_ids=[[] for _ in range(B)],
        spec_token_ids=[[] for _ in range(B)],
        allowed_token_ids_mask=None,
        bad_words_token_ids={},
        logitsprocs=LogitsProcessors(),
    )
    fields.update(overrides)
    return SamplingMetadata(**fields)


def _logits(seed=0) -> torch.Tensor:
    return torch.randn(B, V, generator=torch.Generator().manual_seed(seed)) * 3


def _sample(md, logits=None):
    return AscendSampler()(logits.clone() if logits is not None else _logits(), md).sampled_token_ids.view(-1)


def test_greedy_is_argmax():
    logits = _logits()
    md = _metadata(temperature=torch.zeros(B), all_greedy=True, all_random=False)
    assert _sample(md, logits).tolist() == logits.argmax(-1).tolist()


def test_seeded_rows_reproduce_and_depend_on_the_seed():
    def run(seeds):
        gens = {i: torch.Generator().manual_seed(s) for i, s in enumerate(seeds)}
        return _sample(_metadata(generators=gens))

    first, again, other = run(range(B)), run(range(B)), run(range(100, 100 + B))
    assert first.tolist() == again.tolist()
    assert first.tolist() != other.tolist()
    assert len(set(first.tolist())) > 1


def test_random_sampling_follows_the_distribution():
    logits = torch.full((B, V), -60.0)  # other tokens: p < 1e-25
    logits[:, 3], logits[:, 7] = 0.0, torch.log(torch.tensor(3.0))  # p(7) = 0.75, p(3) = 0.25
    counts = torch.zeros(V)
    for _ in range(60):
        counts += torch.bincount(_sample(_metadata(), logits), minlength=V)
    assert counts.sum() == counts[3] + counts[7]
    assert 0.6 < counts[7] / counts.sum() < 0.9


def test_top_k_one_and_mixed_greedy_rows_are_greedy():
    logits = _logits(1)
    temperature = torch.tensor([0.0, 1.5, 0.0, 2.0, 1.0, 0.7])
    md = _metadata(temperature=temperature, all_random=False, top_k=torch.ones(B, dtype=torch.int64))
    assert _sample(md, logits).tolist() == logits.argmax(-1).tolist()


def test_repetition_penalty_and_bad_words_change_the_greedy_choice():
    logits = _logits(2)
    best = logits.argmax(-1)
    prompts = best.view(B, 1)
    md = _metadata(
        temperature=torch.zeros(B), all_greedy=True, all_random=False, no_penalties=False,
        prompt_token_ids=prompts, repetition_penalties=torch.full((B,), 1e4),
    )  # fmt: skip
    penalised = _sample(md, logits)
    assert (penalised != best).all()
    words = {0: [[int(best[0])]], 2: [[5, int(best[2])]]}
    outputs = [[] for _ in range(B)]
    outputs[2] = [9, 5]  # ends with the prefix of row 2's two-token bad word
    md = _metadata(
        temperature=torch.zeros(B), all_greedy=True, all_random=False,
        bad_words_token_ids=words, output_token_ids=outputs,
    )  # fmt: skip
    got = _sample(md, logits)
    assert got[0] != best[0] and got[2] != best[2]
    assert got[1] == best[1]


def test_logprobs_are_log_softmax_with_top_k_and_ranks():
    logits = _logits(3)
    md = _metadata(temperature=torch.zeros(B), all_greedy=True, all_random=False, max_num_logprobs=3)
    out = AscendSampler()(logits.clone(), md)
    ref = torch.log_softmax(logits, -1)
    ids = out.logprobs_tensors.logprob_token_ids
    assert ids[:, 0].tolist() == logits.argmax(-1).tolist()
    assert ids[:, 1:].tolist() == torch.topk(ref, 3).indices.tolist()
    torch.testing.assert_close(out.logprobs_tensors.logprobs, ref.gather(1, ids.long()), atol=1e-6, rtol=0)
    assert out.logprobs_tensors.selected_token_ranks.tolist() == [1] * B


def test_helpers():
    assert pad_token_lists([[1, 2], [], [3]], 4, -1, torch.device("cpu")).tolist() == [
        [1, 2], [-1, -1], [3, -1], [-1, -1]
    ]  # fmt: skip
    tokens, offsets, rows = bad_words_csr({2: [[4, 5], [6]], 0: [[7]]}, torch.device("cpu"))
    assert tokens.tolist() == [7, 4, 5, 6] and offsets.tolist() == [0, 1, 3, 4] and rows.tolist() == [0, 2, 2]
    seeds = sampling_seeds(3, {1: torch.Generator().manual_seed(5)}, torch.device("cpu"))
    assert seeds[1] == sampling_seeds(3, {1: torch.Generator().manual_seed(5)}, torch.device("cpu"))[1]


def test_penalties_without_prompt_ids_is_a_clear_error():
    md = _metadata(no_penalties=False, prompt_token_ids=None)
    with pytest.raises(ValueError, match="prompt_token_ids"):
        _sample(md)


def test_held_back_rows_sample_without_touching_their_generator():
    """A discarded prefill chunk leaves the request's generator as it was, so the first kept step
    draws what an unchunked prompt's only step draws (and no offset rewind is needed)."""
    from vllm_ascend.runner.model_runner import generators_held_back

    cpu = torch.device("cpu")
    generators = {0: torch.Generator().manual_seed(7), 2: torch.Generator().manual_seed(9)}
    before = {row: g.get_state().clone() for row, g in generators.items()}
    with generators_held_back(generators, [0, 1]):
        assert set(generators) == {2}
        sampling_seeds(3, generators, cpu)
    assert set(generators) == {0, 2}
    assert torch.equal(generators[0].get_state(), before[0])
    assert not torch.equal(generators[2].get_state(), before[2])
    unchunked = sampling_seeds(1, {0: torch.Generator().manual_seed(7)}, cpu)
    assert torch.equal(sampling_seeds(1, {0: generators[0]}, cpu), unchunked)

    with pytest.raises(RuntimeError, match="step failed"), generators_held_back(generators, [2]):
        raise RuntimeError("step failed")
    assert set(generators) == {0, 2}


def _min_p_processor(values: list[float]):
    from types import SimpleNamespace

    from vllm import SamplingParams
    from vllm.v1.sample.logits_processor import BatchUpdate, MinPLogitsProcessor

    config = SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=len(values)))
    processor = MinPLogitsProcessor(config, torch.device("cpu"), False)
    added = [(row, SamplingParams(min_p=p), [], []) for row, p in enumerate(values)]
    processor.update_state(BatchUpdate(batch_size=len(values), removed=[], added=added, moved=[]))
    return processor


@pytest.mark.parametrize("top_p", [None, 0.9])
def test_temperature_is_no_pass_of_its_own_unless_top_p_needs_it(monkeypatch, top_p):
    """Min-p compares against ``max + T * log(min_p)``, top-k keeps the same tokens and Gumbel sampling
    scales as it reads: the logits are scaled in place only before top-p."""
    import vllm_ascend.runner.sample.sampler as sampler_module
    from vllm_ascend.kernels import min_p, top_k_top_p

    logits = _logits(4)
    temperature = torch.tensor([0.5, 1.5, 0.0, 2.0, 0.8, 1.0])
    min_ps = [0.05, 0.2, 0.1, 0.0, 0.3, 0.1]
    calls: list[str] = []
    real = sampler_module.kernels
    spy = types.SimpleNamespace(
        apply_temperature=lambda *a: calls.append("temperature") or real.apply_temperature(*a),
        apply_min_p=real.apply_min_p,
        apply_top_k_top_p=real.apply_top_k_top_p,
        gumbel_sample=lambda x, t, s, p, scale: (
            calls.append(f"gumbel(scale={scale})") or real.gumbel_sample(x, t, s, p, scale)
        ),
    )
    monkeypatch.setattr(sampler_module, "kernels", spy)
    gens = {i: torch.Generator().manual_seed(i) for i in range(B)}
    md = _metadata(
        temperature=temperature, all_random=False, generators=gens,
        top_k=torch.full((B,), 20), top_p=None if top_p is None else torch.full((B,), top_p),
        logitsprocs=LogitsProcessors([_min_p_processor(min_ps)]),
    )  # fmt: skip
    got = _sample(md, logits)
    fused = top_p is None
    assert calls == (["gumbel(scale=True)"] if fused else ["temperature", "gumbel(scale=False)"])
    # What the explicit pipeline keeps and draws with the same seeds:
    t = torch.where(temperature > 0, temperature, 1.0).unsqueeze(1)
    x = logits / t
    min_p.apply_min_p_torch(x, torch.tensor(min_ps))
    top_k_top_p.apply_top_k_top_p_torch(
        x, torch.full((B,), 20), None if top_p is None else torch.full((B,), top_p)
    )
    kept = torch.isfinite(x)
    picked = kept.gather(1, got.view(-1, 1)).flatten()
    assert picked.all(), (got, kept.sum(1))
    assert got[2] == logits[2].argmax()  # greedy row
