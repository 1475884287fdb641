"""N-gram speculative decoding on the reference device: the runner drafts with the proposer core's
``SPEC_DECODE_METHODS`` registry holds (``vllm_ascend.specdecode.ngram.NgramProposer``), the drafts are
verified by ``AscendRejectionSampler`` on ``vllm_ascend.kernels``, and the tokens are exactly those of
plain greedy decoding. These are features of the V1 runner (vLLM's V2 runner drafts with its own
speculators, on the V2 kernels: ``test_runner_v2.py``), so the module runs on V1."""

from __future__ import annotations

import pytest

import vllm_ascend.kernels as kernels

pytestmark = pytest.mark.usefixtures("v1_runner")

PROMPTS = [list(range(10, 30)) * 3, [5, 6, 7, 8] * 10, [40, 41, 42, 43, 44, 40, 41, 42] * 4]
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 2}


def _outputs(llm, **params):
    from vllm import SamplingParams

    outputs = llm.generate(
        [{"prompt_token_ids": p} for p in PROMPTS], SamplingParams(ignore_eos=True, **params), use_tqdm=False
    )
    return [o.outputs[0] for o in outputs]


def _tokens(llm, **params):
    return [list(o.token_ids) for o in _outputs(llm, **params)]


def _chosen_logprobs(outputs):
    return [[step[t].logprob for step, t in zip(o.logprobs, o.token_ids, strict=True)] for o in outputs]


def _spy_drafts(monkeypatch, proposer_cls) -> list[int]:
    """From now on, per ``propose`` call of ``proposer_cls``: the number of requests that got a draft."""
    drafted: list[int] = []
    real = proposer_cls.propose

    def propose(self, *args, **kwargs):
        drafts = real(self, *args, **kwargs)
        drafted.append(sum(1 for d in drafts if d))
        return drafts

    monkeypatch.setattr(proposer_cls, "propose", propose)
    return drafted


def _spy_verification(monkeypatch) -> dict[str, list[int]]:
    """From now on, per verification call: the rows that accepted at least one draft token."""
    seen: dict[str, list[int]] = {"greedy": [], "random": []}

    def spy(name, real):
        def call(output, *args):
            result = real(output, *args)
            seen[name].append(int(((output != kernels.PLACEHOLDER_TOKEN_ID).sum(1) >= 2).sum()))
            return result

        return call

    monkeypatch.setattr(kernels, "rejection_greedy_sample", spy("greedy", kernels.rejection_greedy_sample))
    monkeypatch.setattr(kernels, "rejection_random_sample", spy("random", kernels.rejection_random_sample))
    return seen


def test_ngram_drafts_are_verified_on_our_kernels(make_llm, tiny_qwen3, monkeypatch):
    from vllm_ascend.core.registry import SPEC_DECODE_METHODS
    from vllm_ascend.runner.sample.rejection_sampler import AscendRejectionSampler
    from vllm_ascend.specdecode.ngram import NgramProposer

    plain = _outputs(make_llm(tiny_qwen3), temperature=0.0, max_tokens=48, logprobs=2)
    want = [list(o.token_ids) for o in plain]
    spec = make_llm(tiny_qwen3, speculative_config=NGRAM)
    runner = spec.collective_rpc(lambda wrapper: wrapper.worker)[0].model_runner
    assert type(runner.rejection_sampler) is AscendRejectionSampler
    assert SPEC_DECODE_METHODS.get("ngram") is NgramProposer
    assert type(runner.drafter) is NgramProposer  # not vLLM's numba proposer
    assert (runner.drafter.min_n, runner.drafter.max_n, runner.drafter.k) == (2, 3, 3)
    assert runner.kernel_warmup_results == {"sampling": True, "penalties": True, "rejection": True}

    seen = _spy_verification(monkeypatch)  # after the engine's warm-up
    drafted = _spy_drafts(monkeypatch, NgramProposer)
    got = _outputs(spec, temperature=0.0, max_tokens=48, logprobs=2)
    assert [list(o.token_ids) for o in got] == want
    assert drafted and sum(drafted) > 0, drafted  # vLLM's runner called our proposer, which drafted
    for a, b in zip(_chosen_logprobs(got), _chosen_logprobs(plain), strict=True):
        assert a == pytest.approx(b, abs=1e-4)  # logprobs of verified tokens: those of plain decoding
    assert seen["greedy"] and sum(seen["greedy"]) > 0, seen  # some drafts were accepted
    assert not seen["random"]

    params = dict(temperature=0.8, top_k=20, top_p=0.9, seed=3, max_tokens=24)
    first = _tokens(spec, **params)
    assert seen["random"]
    assert _tokens(spec, **params) == first  # seeded: reproducible
    assert all(0 <= t < 512 for row in first for t in row)


def test_block_and_entropy_verification_through_vllm(make_llm, tiny_qwen3, monkeypatch):
    """``rejection_sampler_config.verify_method`` reaches the sampler; greedy output is plain
    decoding's; random requests are verified by the method's kernel, reproducibly when seeded."""
    from vllm_ascend.runner.sample.rejection_sampler import Verification

    want = _tokens(make_llm(tiny_qwen3), temperature=0.0, max_tokens=48)
    for method in ("block", "entropy"):
        spec = make_llm(
            tiny_qwen3,
            speculative_config=NGRAM,
            additional_config={"rejection_sampler_config": {"verify_method": method, "posterior_alpha": 0.5}},
        )
        runner = spec.collective_rpc(lambda wrapper: wrapper.worker)[0].model_runner
        assert runner.rejection_sampler.verification == Verification(method, 0.09, 0.5)
        with monkeypatch.context() as patch:
            seen = _spy_verification(patch)
            name = f"rejection_{method}_sample"
            calls: list[int] = []
            real = getattr(kernels, name)
            patch.setattr(kernels, name, lambda *args, real=real, calls=calls: calls.append(1) or real(*args))
            assert _tokens(spec, temperature=0.0, max_tokens=48) == want, method
            assert sum(seen["greedy"]) > 0 and not calls  # greedy rows: argmax verification, drafts accepted
            params = dict(temperature=0.8, seed=5, max_tokens=48)
            first = _tokens(spec, **params)
            assert calls and not seen["random"]  # random rows: the method's kernel, not token-wise rejection
            assert _tokens(spec, **params) == first


def test_penalised_greedy_with_drafts_decodes_as_without(make_llm, tiny_qwen3, monkeypatch):
    """Penalties under speculative decoding read the batch's kept counts: a draft position's target logits
    count the drafts before it, the bonus token all of them, and only accepted tokens enter the counts,
    so penalised greedy decoding gives the plain (draft-free) tokens. (Penalties that favour repeats, so that
    the prompt's n-grams keep being accepted.)"""
    params = dict(
        temperature=0.0, max_tokens=40, repetition_penalty=0.8, frequency_penalty=-0.2, presence_penalty=-0.1
    )
    want = _tokens(make_llm(tiny_qwen3), **params)
    spec = make_llm(tiny_qwen3, speculative_config=NGRAM)
    seen = _spy_verification(monkeypatch)
    assert _tokens(spec, **params) == want
    assert seen["greedy"] and sum(seen["greedy"]) > 0, seen  # some drafts were accepted
    assert want != _tokens(spec, temperature=0.0, max_tokens=40)  # the penalties changed the decoding
