"""One engine on the reference device, on the runner vLLM selects (Model Runner V2, async scheduling): our
classes and V2's kernels ran, sampling and logprobs are real (sleep mode: ``test_rl_sleep.py``)."""

from __future__ import annotations

import gc

import pytest
import torch

from .conftest import TINY_ENGINE
from .conftest import worker_of as _worker


@pytest.fixture(scope="module")
def llm(tiny_qwen3):
    from vllm import LLM

    engine = LLM(model=str(tiny_qwen3), **TINY_ENGINE)
    yield engine
    engine.llm_engine.engine_core.shutdown()
    del engine
    gc.collect()


def _generate(llm, prompts, **params):
    from vllm import SamplingParams

    outputs = llm.generate(
        [{"prompt_token_ids": p} for p in prompts], SamplingParams(**params), use_tqdm=False
    )
    return [o.outputs[0] for o in outputs]


def test_our_platform_worker_runner_backend_and_ops_ran(llm, qwen3_prompts):
    from vllm.platforms import current_platform
    from vllm.triton_utils import dispatcher

    from vllm_ascend.core.device.config import get_device_adaptor
    from vllm_ascend.core.platform import ReferencePlatform
    from vllm_ascend.kernels.v2 import v2_kernel_overrides
    from vllm_ascend.runner.attention.impl import AscendAttentionImpl
    from vllm_ascend.runner.kernel_overrides import GridLaunch
    from vllm_ascend.runner.model_runner_v2 import NPUModelRunnerV2
    from vllm_ascend.runner.ops import activation, layernorm, linear, rotary_embedding
    from vllm_ascend.runner.worker import NPUWorker

    assert type(current_platform) is ReferencePlatform
    worker = _worker(llm)
    assert type(worker) is NPUWorker
    runner = worker.model_runner
    assert type(runner) is NPUModelRunnerV2
    assert llm.llm_engine.vllm_config.scheduler_config.async_scheduling
    table = v2_kernel_overrides()
    launched: dict[str, int] = {}
    for name, impl in table.items():  # every V2 kernel is our override, launched with its grid
        host, attr = dispatcher._resolve_kernel(name)
        wrapper = getattr(host, attr)
        assert type(wrapper) is GridLaunch and wrapper._impl is impl, name

        def counting(grid, *args, _impl=impl, _name=name, **kwargs):
            launched[_name] = launched.get(_name, 0) + 1
            return _impl(grid, *args, **kwargs)

        wrapper._impl = counting

    modules = list(runner.model.modules())
    kinds = {type(m) for m in modules}
    expected = {
        layernorm.AscendRMSNorm,
        activation.AscendSiluAndMul,
        rotary_embedding.AscendRotaryEmbedding,
        linear.AscendQKVParallelLinear,
        linear.AscendMergedColumnParallelLinear,
        linear.AscendRowParallelLinear,
        linear.AscendVocabParallelEmbedding,
        linear.AscendParallelLMHead,
    }
    assert expected <= kinds, expected - kinds
    attention_impls = {type(m.impl) for m in modules if type(m).__name__ == "Attention"}
    assert attention_impls == {AscendAttentionImpl}
    assert all(
        type(m.quant_method) is linear.AscendUnquantizedLinearMethod
        for m in modules
        if isinstance(m, linear._AscendLinearMixin)
    )
    assert {m.attn_backend.get_name() for m in modules if type(m).__name__ == "Attention"} == {"CUSTOM"}

    adaptor = get_device_adaptor()
    before = adaptor.call_counts.copy()
    try:
        _generate(llm, qwen3_prompts[:2], max_tokens=3, temperature=0.0, ignore_eos=True)
        _generate(llm, qwen3_prompts[:1], max_tokens=2, temperature=0.8, seed=1)
    finally:
        for name, impl in table.items():
            host, attr = dispatcher._resolve_kernel(name)
            getattr(host, attr)._impl = impl
    for kernel in (
        "input_batch._prepare_prefill_inputs_kernel",
        "input_batch._post_update_kernel",
        "block_table._compute_slot_mappings_kernel",
        "sample.gumbel._gumbel_sample_kernel",
        "sample.gumbel._temperature_kernel",
    ):
        assert launched.get(f"vllm.v1.worker.gpu.{kernel}", 0) > 0, (kernel, launched)
    delta = adaptor.call_counts - before
    layers = len(runner.model.model.layers)
    # 2 requests x 3 steps: one prefill step and two decode steps (the batch runs together).
    for op in ("reshape_and_cache", "fused_infer_attention", "rotary_embedding", "swiglu"):
        assert delta[op] >= 3 * layers, (op, delta)
    assert delta["rms_norm"] > 0 and delta["add_rms_norm"] > 0, delta


def test_logprobs_match_hf_log_softmax(llm, qwen3_prompts, qwen3_hf):
    outputs = _generate(llm, qwen3_prompts, max_tokens=4, temperature=0.0, ignore_eos=True, logprobs=5)
    for out, hf_ids, hf_logits in zip(outputs, qwen3_hf.token_ids, qwen3_hf.logits, strict=True):
        assert list(out.token_ids) == hf_ids[:4]
        for step, step_logprobs in enumerate(out.logprobs):
            ref = torch.log_softmax(hf_logits[step].double(), dim=-1)
            top = torch.topk(ref, 5).indices.tolist()
            assert set(top) <= set(step_logprobs), (step, top, list(step_logprobs))
            for token_id, lp in step_logprobs.items():
                assert abs(lp.logprob - ref[token_id].item()) < 1e-4, (
                    step,
                    token_id,
                    lp.logprob,
                    ref[token_id],
                )
            assert step_logprobs[out.token_ids[step]].rank == 1


def test_seeded_sampling_is_reproducible(llm, qwen3_prompts):
    params = dict(max_tokens=10, temperature=1.0, top_k=50, top_p=0.95, min_p=0.01, ignore_eos=True)
    first = [o.token_ids for o in _generate(llm, qwen3_prompts, seed=1234, **params)]
    again = [o.token_ids for o in _generate(llm, qwen3_prompts, seed=1234, **params)]
    alone = [o.token_ids for o in _generate(llm, qwen3_prompts[2:3], seed=1234, **params)]
    other = [o.token_ids for o in _generate(llm, qwen3_prompts, seed=99, **params)]
    assert first == again
    assert alone == first[2:3]  # the seed, not the batch, decides the tokens
    assert first != other


def test_sampling_parameters_take_effect(llm, qwen3_prompts, qwen3_hf):
    greedy_first = [ids[0] for ids in qwen3_hf.token_ids]
    # top_k=1 is greedy whatever the temperature.
    top1 = _generate(llm, qwen3_prompts, max_tokens=1, temperature=2.0, top_k=1, seed=7)
    assert [o.token_ids[0] for o in top1] == greedy_first
    # A bad word equal to the greedy first token bans it (through the bad-words kernel).
    tokenizer = llm.get_tokenizer()
    row = next(i for i, t in enumerate(greedy_first) if tokenizer(tokenizer.decode([t]))["input_ids"] == [t])
    word = tokenizer.decode([greedy_first[row]])
    banned = _generate(llm, qwen3_prompts[row : row + 1], max_tokens=1, temperature=0.0, bad_words=[word])
    assert banned[0].token_ids[0] != greedy_first[row]
    # A negative logit bias on it does the same (vLLM's logits processor before our sampler).
    biased = _generate(
        llm, qwen3_prompts[:1], max_tokens=1, temperature=0.0, logit_bias={greedy_first[0]: -100.0}
    )
    assert biased[0].token_ids[0] != greedy_first[0]
    # A large repetition penalty prevents repeating any prompt or output token.
    penalised = _generate(llm, qwen3_prompts[:1], max_tokens=8, temperature=0.0, repetition_penalty=50.0,
                          ignore_eos=True)  # fmt: skip
    seen = set(qwen3_prompts[0])
    for token in penalised[0].token_ids:
        assert token not in seen
        seen.add(token)


def test_sleep_without_sleep_mode_is_refused_by_name_and_loses_nothing(llm, qwen3_prompts, qwen3_hf):
    with pytest.raises(Exception, match=r"sleep needs the engine built with enable_sleep_mode=True"):
        llm.sleep(level=1)
    llm.wake_up()  # resumes the scheduler vLLM paused before asking the workers to sleep
    assert not llm.llm_engine.is_sleeping()
    outputs = _generate(llm, qwen3_prompts, max_tokens=12, temperature=0.0, ignore_eos=True)
    assert [list(o.token_ids) for o in outputs] == qwen3_hf.token_ids


@pytest.mark.parametrize("invariant", [False, True])
def test_batch_invariant_variable_reaches_serving_attention(llm, qwen3_prompts, monkeypatch, invariant):
    """``VLLM_ASCEND_BATCH_INVARIANT=1`` changes what serving does: four decoding requests are
    attended one by one (bitwise independent of each other) instead of in one call (one padded group, or
    vLLM's CPU kernel where it serves the cache)."""
    from vllm_ascend.kernels.device import host_attention, reference

    calls: list[list[int]] = []
    attend_group, attend_kernel = reference._attend_group, host_attention.attend

    def spy(*args, **kwargs):
        calls.append(list(args[7]))  # the requests attended together
        return attend_group(*args, **kwargs)

    def kernel_spy(query, key_cache, value_cache, plan, *args, **kwargs):
        starts = plan.starts
        calls.append([b for b in range(len(starts) - 1) if starts[b + 1] > starts[b]])
        return attend_kernel(query, key_cache, value_cache, plan, *args, **kwargs)

    monkeypatch.setenv("VLLM_ASCEND_BATCH_INVARIANT", "1" if invariant else "0")
    monkeypatch.setattr(reference, "_attend_group", spy)
    monkeypatch.setattr(host_attention, "attend", kernel_spy)
    outputs = _generate(llm, qwen3_prompts, max_tokens=3, temperature=0.0)
    assert all(len(o.token_ids) == 3 for o in outputs)
    if invariant:
        assert calls and all(len(reqs) == 1 for reqs in calls), calls
    else:
        assert any(len(reqs) == 4 for reqs in calls), calls  # the decode steps attend all four at once


# Last in the module: the V1 engine this test builds is shut down when it ends, which tears down the process's
# model-parallel groups that the module's shared engine (``llm``) serves on.
def test_v1_runner_keeps_penalty_counts_and_decodes_as_v2(
    llm, v1_runner, make_llm, tiny_qwen3, qwen3_prompts, monkeypatch
):
    """The V1 runner's sampler reads the counts its persistent batch keeps across steps (requests joining
    and leaving a two-row batch, chunked prefill) and decodes with penalties as V2 does (vLLM's own
    kept counts): the same greedy tokens, request by request."""
    from vllm import SamplingParams

    from vllm_ascend.runner.sample.penalty_counts import PenaltyCounts

    penalties = dict(temperature=0.0, repetition_penalty=1.3, frequency_penalty=0.5, presence_penalty=0.4)
    params = [SamplingParams(max_tokens=n, ignore_eos=True, **penalties) for n in (20, 6, 14, 9)]
    prompts = [{"prompt_token_ids": p} for p in qwen3_prompts]
    want = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]
    applied = []
    apply = PenaltyCounts.apply
    monkeypatch.setattr(
        PenaltyCounts, "apply", lambda self, *a, **k: applied.append(self) or apply(self, *a, **k)
    )
    v1 = make_llm(tiny_qwen3, enable_chunked_prefill=True, max_num_batched_tokens=16, max_num_seqs=2)
    got = [list(o.outputs[0].token_ids) for o in v1.generate(prompts, params, use_tqdm=False)]
    assert got == want
    runner = _worker(v1).model_runner
    assert applied and all(counts is runner.input_batch.penalty_counts for counts in applied)
    plain = [
        list(o.outputs[0].token_ids)
        for o in v1.generate(
            prompts,
            [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in (20, 6, 14, 9)],
            use_tqdm=False,
        )
    ]
    assert plain != got  # the penalties changed the decoding
