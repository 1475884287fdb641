"""A hybrid Gated DeltaNet model (tiny Qwen3-Next) served on the reference device: greedy tokens equal HF's.

The GDN layers run vllm_ascend.kernels (conv1d, GDN gating, the gated delta rule) over vLLM's mamba-style state
cache, with prefix caching on (vLLM's default: recurrent states kept at block boundaries, moved between blocks
by the kernels' state copies); other models with mamba-style state are refused at config time.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_ascend.testing.tiny_models import build_tiny_model, mamba_spec, qwen3_next_spec

from .conftest import MAX_NEW_TOKENS, RUNNER_PROMPTS


@pytest.fixture(scope="module")
def tiny_qwen3_next(tiny_models_root: Path) -> Path:
    return build_tiny_model(qwen3_next_spec(), tiny_models_root)


@pytest.fixture(scope="module")
def next_prompts(tiny_qwen3_next: Path) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen3_next)
    return [tokenizer(text)["input_ids"] for text in RUNNER_PROMPTS]


@pytest.fixture(scope="module")
def next_hf(tiny_qwen3_next: Path, next_prompts: list[list[int]]) -> list[list[int]]:
    from vllm_ascend.testing.hf_reference import hf_greedy

    return hf_greedy(tiny_qwen3_next, next_prompts, MAX_NEW_TOKENS).token_ids


@pytest.fixture(scope="module")
def next_llm(tiny_qwen3_next: Path):
    """One engine for the module: 16 tokens per step, so the long prompts are prefilled in chunks mixed
    with other requests' decodes; prefix caching left at vLLM's default (on: ``mamba_cache_mode="align"``)."""
    import gc

    from vllm import LLM

    llm = LLM(
        model=str(tiny_qwen3_next),
        dtype="float32",
        block_size=16,
        max_model_len=256,
        kv_cache_memory_bytes=64 << 20,
        seed=0,
        max_num_batched_tokens=16,
        max_num_seqs=4,
    )
    yield llm
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()


def _greedy(llm, prompts: list[list[int]]) -> list[list[int]]:
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=MAX_NEW_TOKENS, temperature=0.0, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


# Runs before the module's engine exists: vLLM's process-wide parallel groups belong to one engine at a time.
def test_qwen3_next_on_the_310p_family_matches_hf_float16(tiny_qwen3_next, next_prompts, monkeypatch):
    """310P has no Triton: the GDN layers' conv1d, gating and delta rule run their torch implementations,
    in float16, beside the 310P attention backend; greedy tokens equal HF's float16 ones."""
    import torch
    from vllm import LLM, SamplingParams

    from vllm_ascend.core.device.config import clear_device_caches
    from vllm_ascend.testing.hf_reference import hf_greedy

    monkeypatch.setenv("VLLM_ASCEND_REFERENCE_FAMILY", "310p")
    clear_device_caches()
    llm = LLM(
        model=str(tiny_qwen3_next),
        dtype="float16",
        block_size=16,
        max_model_len=256,
        kv_cache_memory_bytes=32 << 20,
        seed=0,
        max_num_batched_tokens=16,
        max_num_seqs=4,
    )
    try:
        params = SamplingParams(max_tokens=MAX_NEW_TOKENS, temperature=0.0, ignore_eos=True)
        outputs = llm.generate([{"prompt_token_ids": p} for p in next_prompts], params, use_tqdm=False)
        expected = hf_greedy(tiny_qwen3_next, next_prompts, MAX_NEW_TOKENS, dtype=torch.float16).token_ids
        assert [list(o.outputs[0].token_ids) for o in outputs] == expected
    finally:
        llm.llm_engine.engine_core.shutdown()
        monkeypatch.undo()
        clear_device_caches()


def test_qwen3_next_batch_with_chunked_prefill_matches_hf(next_llm, next_prompts, next_hf):
    lengths = [len(p) for p in next_prompts]
    assert max(lengths) > 16 > min(lengths), lengths  # some prompts need several prefill steps
    assert len({tuple(t) for t in next_hf}) == len(next_hf), next_hf  # a meaningful comparison
    for ids in next_hf:
        assert len(set(ids)) >= MAX_NEW_TOKENS // 3, ids
    assert _greedy(next_llm, next_prompts) == next_hf


def test_qwen3_next_states_are_per_request(next_llm, next_prompts, next_hf):
    """Alone, then again after a batch: a sequence's conv/recurrent state never leaks into another's."""
    assert _greedy(next_llm, next_prompts[1:2]) == next_hf[1:2]
    assert _greedy(next_llm, next_prompts[::-1]) == next_hf[::-1]


def test_qwen3_next_keeps_states_at_block_boundaries(next_llm):
    cache = next_llm.llm_engine.vllm_config.cache_config
    assert cache.enable_prefix_caching and cache.mamba_cache_mode == "align"
    # The 16 asked for is raised so that an attention page holds one layer's recurrent state.
    assert cache.mamba_block_size == cache.block_size == 32


def test_qwen3_next_prefix_hit_reuses_the_recurrent_state(next_llm, tiny_qwen3_next):
    """A request, then one sharing more than two blocks of its prompt: the second starts from the first's
    cached states (conv and recurrent, copied into its own block) and both give HF's tokens; the same second
    prompt under another ``cache_salt`` (the control: no reuse) computes everything and gives the same tokens.
    The second's decode crosses a block boundary (its running state moves to a new block mid-generation)."""
    from transformers import AutoTokenizer
    from vllm import SamplingParams

    from vllm_ascend.testing.hf_reference import hf_greedy

    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen3_next)
    shared = (
        "snow wind stone light shadow morning evening winter summer red green blue yellow black white " * 3
    )
    first = tokenizer(shared + "quick slow small")["input_ids"]
    second = tokenizer(shared + "large bright dark warm cold old new first last runs")["input_ids"]
    common = next(i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b)
    hit = min(common, len(second) - 1) // 32 * 32
    assert hit >= 64, (common, len(second))
    assert len(second) // 32 != (len(second) + MAX_NEW_TOKENS - 1) // 32, len(second)

    params = SamplingParams(max_tokens=MAX_NEW_TOKENS, temperature=0.0, ignore_eos=True)
    runs = [
        next_llm.generate([{"prompt_token_ids": p, **extra}], params, use_tqdm=False)[0]
        for p, extra in ((first, {}), (second, {}), (second, {"cache_salt": "control"}))
    ]
    assert [r.num_cached_tokens for r in runs] == [0, hit, 0]
    expected = hf_greedy(tiny_qwen3_next, [first, second], MAX_NEW_TOKENS).token_ids
    assert [list(r.outputs[0].token_ids) for r in runs] == [expected[0], expected[1], expected[1]]
    assert expected[0] != expected[1]


def test_other_state_space_models_are_refused_at_config_time(tiny_models_root: Path):
    from vllm import LLM

    model = build_tiny_model(mamba_spec(), tiny_models_root)
    with pytest.raises(Exception) as err:
        LLM(model=str(model), dtype="float32", max_model_len=256, kv_cache_memory_bytes=64 << 20)
    message = str(err.value)
    assert "validation error for VllmConfig" in message  # raised while the config is built, before any load
    assert "architecture MambaForCausalLM is not supported yet by vllm-ascend" in message
    assert "out of scope of this release except Qwen3NextForCausalLM" in message
    assert "vllm_ascend.kernels.causal_conv1d_fn, causal_conv1d_update, fused_gdn_gating" in message
