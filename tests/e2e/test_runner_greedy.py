"""Greedy token ids through vLLM with the plugin on the reference device equal HF transformers': on the runner
vLLM selects (Model Runner V2, async scheduling) and on the V1 runner."""

from __future__ import annotations

import pytest

MAX_NEW_TOKENS = 12


def _greedy(llm, prompts: list[list[int]]) -> list[list[int]]:
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=MAX_NEW_TOKENS, temperature=0.0, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


def _caches_in_host_kernel_layout(worker) -> bool:
    from vllm_ascend.core.sdk import get_device_adaptor
    from vllm_ascend.kernels.device import host_attention

    runner = worker.worker.model_runner
    head_size = runner.model_config.get_head_size()
    views = [get_device_adaptor().kv_cache_views(cache, head_size) for cache in runner.kv_caches]
    return bool(views) and all(host_attention.kernel_views(*v) is not None for v in views)


def _assert_diverse(token_ids: list[list[int]]) -> None:
    # A model that repeats one token would make the comparison meaningless.
    assert len({tuple(t) for t in token_ids}) == len(token_ids), token_ids
    for ids in token_ids:
        assert len(set(ids)) >= MAX_NEW_TOKENS // 3, ids


@pytest.mark.parametrize(
    ("chunked_prefill", "prefix_caching"),
    [(False, False), (True, False), (False, True), (True, True)],
    ids=["plain", "chunked", "prefix-cache", "chunked+prefix-cache"],
)
def test_qwen3_greedy_matches_hf(
    make_llm, tiny_qwen3, qwen3_prompts, qwen3_hf, chunked_prefill, prefix_caching
):
    assert max(len(p) for p in qwen3_prompts) > 32 > min(len(p) for p in qwen3_prompts)
    options = dict(enable_prefix_caching=prefix_caching, enable_chunked_prefill=chunked_prefill)
    if chunked_prefill:
        # 16 tokens per step: the long prompts are prefilled over several steps, mixed with decodes.
        options.update(max_num_batched_tokens=16, max_num_seqs=4)
    llm = make_llm(tiny_qwen3, **options)
    if prefix_caching:
        # Warm the cache with one long prompt: the others then hit its first blocks.
        assert _greedy(llm, qwen3_prompts[1:2]) == qwen3_hf.token_ids[1:2]
    got = _greedy(llm, qwen3_prompts)
    _assert_diverse(qwen3_hf.token_ids)
    assert got == qwen3_hf.token_ids
    if not (prefix_caching or chunked_prefill):
        # The tokens above were attended by vLLM's CPU kernels, over caches in their block layout.
        assert llm.collective_rpc(_caches_in_host_kernel_layout) == [True]
    if prefix_caching:
        assert _greedy(llm, qwen3_prompts) == qwen3_hf.token_ids


def test_llama_untied_greedy_matches_hf(make_llm, tiny_llama, llama_prompts, llama_hf):
    llm = make_llm(tiny_llama, enable_prefix_caching=True, max_num_batched_tokens=16, max_num_seqs=4)
    _assert_diverse(llama_hf.token_ids)
    assert _greedy(llm, llama_prompts) == llama_hf.token_ids


def test_qwen3_greedy_on_the_v1_runner_matches_hf(v1_runner, make_llm, tiny_qwen3, qwen3_prompts, qwen3_hf):
    """The reduced V1 matrix: vLLM's V1 runner (``VLLM_USE_V2_MODEL_RUNNER=0``) with chunked prefill and
    prefix caching gives the same tokens as V2 and HF."""
    from vllm_ascend.runner.model_runner import NPUModelRunner

    llm = make_llm(
        tiny_qwen3,
        enable_prefix_caching=True,
        enable_chunked_prefill=True,
        max_num_batched_tokens=16,
        max_num_seqs=4,
    )
    runner = llm.collective_rpc(lambda wrapper: wrapper.worker)[0].model_runner
    assert type(runner) is NPUModelRunner
    assert _greedy(llm, qwen3_prompts) == qwen3_hf.token_ids
