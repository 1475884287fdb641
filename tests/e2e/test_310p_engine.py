"""The reference device emulating Atlas 310P (``VLLM_ASCEND_REFERENCE_FAMILY=310p``) serves fp16 models through
vLLM's Model Runner V2 (its kernels on their torch references: 310P has no Triton) with the 310P worker and
attention backend; on V1 (``VLLM_USE_V2_MODEL_RUNNER=0``) through the runner's ``NPUModelRunner`` with its
random draws on the 310P adaptor's host RNG; other dtypes and graphs are refused.

Greedy tokens are compared with HF transformers running the same weights in float16 on the CPU.
"""

from __future__ import annotations

import pytest
import torch

MAX_NEW_TOKENS = 10


@pytest.fixture(scope="module", autouse=True)
def family_310p():
    from vllm_ascend.core.device.config import clear_device_caches

    patch = pytest.MonkeyPatch()
    patch.setenv("VLLM_ASCEND_REFERENCE_FAMILY", "310p")
    clear_device_caches()
    yield
    patch.undo()
    clear_device_caches()


def _llm(model, **overrides):
    """``vllm.LLM`` on a tiny model in float16 (block size 16, 32 MiB KV cache, seed 0)."""
    from vllm import LLM

    kwargs = dict(
        model=str(model),
        dtype="float16",
        block_size=16,
        max_model_len=256,
        kv_cache_memory_bytes=32 << 20,
        seed=0,
    )
    return LLM(**{**kwargs, **overrides})


def _runner(llm):
    return llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner


def _attention_backends(runner) -> set[type]:
    """The attention backend classes a model runner built (V1 and V2 both keep ``attn_groups``)."""
    return {g.backend for groups in runner.attn_groups for g in groups}


def _generate(llm, prompts, max_tokens=MAX_NEW_TOKENS, **params):
    from vllm import SamplingParams

    sampling = SamplingParams(max_tokens=max_tokens, ignore_eos=True, **params)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], sampling, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


def _assert_diverse(token_ids: list[list[int]]) -> None:
    assert len({tuple(t) for t in token_ids}) == len(token_ids), token_ids
    for ids in token_ids:
        assert len(set(ids)) >= MAX_NEW_TOKENS // 3, ids


def test_ngram_drafts_are_verified_on_model_runner_v2(tiny_qwen3):
    """N-gram speculative decoding on Model Runner V2: drafts verified by vLLM's V2 rejection sampler on the
    kernels' torch references (310P has no Triton); some drafts are accepted and the tokens equal plain greedy."""

    from vllm_ascend.runner.model_runner_v2 import NPUModelRunnerV2
    from vllm_ascend.testing.hf_reference import hf_greedy

    prompts = [list(range(10, 30)) * 3, [5, 6, 7, 8] * 10, [40, 41, 42, 43, 44, 40, 41, 42] * 4]
    llm = _llm(
        tiny_qwen3,
        speculative_config={
            "method": "ngram",
            "num_speculative_tokens": 3,
            "prompt_lookup_max": 3,
            "prompt_lookup_min": 2,
        },
        disable_log_stats=False,
    )
    try:
        assert type(_runner(llm)) is NPUModelRunnerV2
        got = _generate(llm, prompts, max_tokens=32, temperature=0.0)
        assert got == hf_greedy(tiny_qwen3, prompts, 32, dtype=torch.float16).token_ids
        metrics = {m.name: m.value for m in llm.get_metrics() if hasattr(m, "value")}
        assert metrics["vllm:spec_decode_num_accepted_tokens"] > 0, metrics
    finally:
        llm.llm_engine.engine_core.shutdown()


def test_draft_model_drafting_for_itself_is_always_accepted(tiny_qwen3, qwen3_prompts):
    """A model-based drafter (vLLM's V2 drafting loop over the 310P attention backend), verified by V2's
    rejection sampler: drafting for itself, every draft is accepted and the tokens equal HF float16's."""

    from vllm_ascend.testing.hf_reference import hf_greedy

    spec = {"method": "draft_model", "model": str(tiny_qwen3), "num_speculative_tokens": 3}
    llm = _llm(
        tiny_qwen3,
        speculative_config=spec,
        disable_log_stats=False,
        max_num_batched_tokens=16,
        # vLLM 0.32's V2 dummy run sizes its batch as min(tokens, max_num_seqs) requests, each with a draft
        # model's extra query slot: with the default 256 sequences a 16-token budget leaves no token to run.
        max_num_seqs=4,
    )
    try:
        got = _generate(llm, qwen3_prompts, temperature=0.0)
        assert got == hf_greedy(tiny_qwen3, qwen3_prompts, MAX_NEW_TOKENS, dtype=torch.float16).token_ids
        metrics = {m.name: m.value for m in llm.get_metrics() if hasattr(m, "value")}
        drafted = metrics["vllm:spec_decode_num_draft_tokens"]
        assert drafted > 0 and metrics["vllm:spec_decode_num_accepted_tokens"] == drafted, metrics
    finally:
        llm.llm_engine.engine_core.shutdown()


def test_v1_on_310p_is_the_runners_model_runner_with_host_random_draws(tiny_qwen3, qwen3_prompts):
    """Where vLLM falls back to V1 (here ``VLLM_USE_V2_MODEL_RUNNER=0``), 310P is served by the runner's own
    ``NPUModelRunner`` (its kernels on their torch references) with the 310P attention backend; its random
    draws (sampling seeds, verification uniforms and exponentials) are the 310P adaptor's host ``random_fill``.
    Greedy tokens equal HF float16's with n-gram drafts verified, and a seeded request samples the same tokens
    alone and in a batch."""
    import vllm.envs as envs

    from vllm_ascend.ascend310p.attention.backend import AscendAttentionBackend310
    from vllm_ascend.core.device.config import get_device_adaptor
    from vllm_ascend.runner.model_runner import NPUModelRunner
    from vllm_ascend.testing.hf_reference import hf_greedy

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
        envs.disable_envs_cache()
        llm = _llm(
            tiny_qwen3,
            max_num_batched_tokens=16,
            max_num_seqs=4,
            speculative_config={
                "method": "ngram",
                "num_speculative_tokens": 3,
                "prompt_lookup_max": 3,
                "prompt_lookup_min": 2,
            },
        )
    envs.disable_envs_cache()
    try:
        runner = _runner(llm)
        assert type(runner) is NPUModelRunner
        assert _attention_backends(runner) == {AscendAttentionBackend310}
        hf = hf_greedy(tiny_qwen3, qwen3_prompts, MAX_NEW_TOKENS, dtype=torch.float16)
        assert _generate(llm, qwen3_prompts, temperature=0.0) == hf.token_ids
        adaptor = get_device_adaptor()
        adaptor.call_counts.clear()
        sampling = dict(temperature=1.0, top_k=20, top_p=0.9, seed=7)
        batched = _generate(llm, qwen3_prompts[:2], **sampling)
        alone = _generate(llm, qwen3_prompts[1:2], **sampling)
        assert batched[1] == alone[0]
        assert adaptor.call_counts["random_fill"] > 0, adaptor.call_counts
    finally:
        llm.llm_engine.engine_core.shutdown()


# Runs before the shared dense engine exists: vLLM's process-wide parallel groups belong to one engine at a time.
def test_qwen3_moe_fp16_matches_hf_fp16(tiny_qwen3_moe, qwen3_moe_prompts):

    from vllm_ascend.runner.ops.moe_comm import MoECommType
    from vllm_ascend.testing.hf_reference import hf_greedy

    llm = _llm(tiny_qwen3_moe)
    try:
        hf = hf_greedy(tiny_qwen3_moe, qwen3_moe_prompts, MAX_NEW_TOKENS, dtype=torch.float16)
        _assert_diverse(hf.token_ids)
        assert _generate(llm, qwen3_moe_prompts, temperature=0.0) == hf.token_ids
        model = _runner(llm).model
        moe_runners = [m for m in model.modules() if hasattr(m, "comm_steps")]
        assert moe_runners and all(r.comm.methods == (MoECommType.ALLGATHER,) for r in moe_runners)
        assert all("310P" in r.comm.device for r in moe_runners)
        assert all(r.comm_steps[MoECommType.ALLGATHER] > 0 for r in moe_runners)
    finally:
        llm.llm_engine.engine_core.shutdown()


@pytest.fixture(scope="module")
def qwen3_310p(tiny_qwen3):
    """One fp16 engine for the dense tests: chunked prefill in 16-token steps, prefix caching on."""

    llm = _llm(
        tiny_qwen3,
        enable_prefix_caching=True,
        max_num_batched_tokens=16,
        max_num_seqs=4,
    )
    yield llm
    llm.llm_engine.engine_core.shutdown()


def test_qwen3_fp16_serves_with_the_310p_worker_and_matches_hf_fp16(qwen3_310p, tiny_qwen3, qwen3_prompts):
    from vllm_ascend.ascend310p.attention.backend import AscendAttentionBackend310
    from vllm_ascend.runner.model_runner_v2 import NPUModelRunnerV2
    from vllm_ascend.testing.hf_reference import hf_greedy

    runner = _runner(qwen3_310p)
    assert type(runner) is NPUModelRunnerV2  # vLLM's Model Runner V2, its kernels on their torch references
    assert _attention_backends(runner) == {AscendAttentionBackend310}
    from vllm_ascend.ascend310p.overlay import Ascend310PReferenceAdaptor
    from vllm_ascend.core.device.config import get_device_adaptor

    adaptor = get_device_adaptor()
    assert type(adaptor) is Ascend310PReferenceAdaptor
    hf = hf_greedy(tiny_qwen3, qwen3_prompts, MAX_NEW_TOKENS, dtype=torch.float16)
    _assert_diverse(hf.token_ids)
    # The long prompts are prefilled over several 16-token steps mixed with decodes (the split-fuse path),
    # then served again from the prefix cache.
    adaptor.call_counts.clear()
    assert _generate(qwen3_310p, qwen3_prompts, temperature=0.0) == hf.token_ids
    paths = ("prompt_attention_310p", "splitfuse_attention_310p", "paged_decode_attention")
    assert all(adaptor.call_counts[p] > 0 for p in paths), adaptor.call_counts
    assert _generate(qwen3_310p, qwen3_prompts, temperature=0.0) == hf.token_ids


def test_seeded_sampling_on_v2_is_reproducible_and_draws_nothing_from_torch(qwen3_310p, qwen3_prompts):
    """V2's Gumbel noise is a counter-based hash of (request seed, position, token) and unseeded requests get
    their seed from the host (vLLM's sampling states): no torch RNG is drawn from and the adaptor's
    ``random_fill`` is never called, so 310P (no device random path) needs nothing more on V2."""
    from vllm_ascend.core.device.config import get_device_adaptor

    adaptor = get_device_adaptor()
    adaptor.call_counts.clear()
    rng_state = torch.random.get_rng_state()
    first = _generate(qwen3_310p, qwen3_prompts[:2], temperature=1.0, top_k=20, top_p=0.9, seed=7)
    assert torch.equal(torch.random.get_rng_state(), rng_state)
    assert adaptor.call_counts["random_fill"] == 0
    alone = _generate(qwen3_310p, qwen3_prompts[1:2], temperature=1.0, top_k=20, top_p=0.9, seed=7)
    other = _generate(qwen3_310p, qwen3_prompts[:2], temperature=1.0, top_k=20, top_p=0.9, seed=8)
    assert first[1] == alone[0]
    assert first != other


def test_lora_adapters_on_310p_match_hf_peft_fp16(tiny_qwen3, qwen3_prompts, qwen3_lora_adapters):
    """Multi-LoRA on 310P (no Triton): the Ascend punica wrapper on the kernels' torch references; base and two
    adapters in one fp16 batch equal HF + PEFT in fp16."""
    from vllm import SamplingParams, TokensPrompt
    from vllm.lora.request import LoRARequest

    from tests.e2e.lora_adapters import hf_greedy
    from vllm_ascend.runner.punica_wrapper import AscendPunicaWrapper

    names = (None, "attn-r8", "mlp-r16")
    want = {
        n: hf_greedy(tiny_qwen3, n and qwen3_lora_adapters[n], qwen3_prompts, torch.float16) for n in names
    }
    assert len({tuple(map(tuple, t)) for t in want.values()}) == len(names)  # the adapters change the output
    llm = _llm(tiny_qwen3, enable_lora=True, max_loras=2, max_lora_rank=16)
    try:
        labels = [n for _ in qwen3_prompts for n in names]
        requests = [
            None if n is None else LoRARequest(n, names.index(n), str(qwen3_lora_adapters[n])) for n in labels
        ]
        outs = llm.generate(
            [TokensPrompt(prompt_token_ids=p) for p in qwen3_prompts for _ in names],
            SamplingParams(temperature=0.0, max_tokens=len(want[None][0]), ignore_eos=True),
            lora_request=requests,
            use_tqdm=False,
        )
        for i, (label, out) in enumerate(zip(labels, outs, strict=True)):
            assert list(out.outputs[0].token_ids) == want[label][i // len(names)], f"adapter {label}"
        wrappers = _runner(llm).lora_manager._adapter_manager.punica_wrapper_mapping.values()
        assert [type(w) for w in wrappers] == [AscendPunicaWrapper]
    finally:
        llm.llm_engine.engine_core.shutdown()


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_other_dtypes_are_refused_naming_the_family(tiny_qwen3, dtype):

    with pytest.raises(
        Exception, match=rf"model dtype torch\.{dtype} is not supported on .*Atlas 310P.*float16"
    ):
        _llm(tiny_qwen3, dtype=dtype)


def test_graph_capture_is_refused(tiny_qwen3):

    with pytest.raises(Exception, match=r"cudagraph_mode"):
        _llm(tiny_qwen3, compilation_config={"cudagraph_mode": "FULL_DECODE_ONLY"})
