"""Tiny DeepSeek-V2/V3 models (MLA) served by vLLM on the reference device: greedy tokens equal HF fp32.

Each case builds its model in the test (transformers ``DeepseekV3Config`` + ``save_pretrained`` + the
locally trained tokenizer) and runs one engine in float32 with chunked prefill and prefix caching, so the
MLA backend's decompressed prefill (with cached context and prefix-cache hits) and its absorbed latent
decode both produce the tokens compared.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from vllm_ascend.testing.tiny_models import (
    MODEL_BUILDERS,
    TinyModelSpec,
    build_tiny_model,
    common_config,
    register_model_builder,
)

MAX_NEW_TOKENS = 8
PROMPTS = (
    "the quick ascend kernel",
    "river mountain forest ocean cloud rain snow wind stone light shadow morning evening winter summer "
    "red green blue yellow black white quick slow small large bright dark warm cold old new",
    "river mountain forest ocean cloud rain snow wind stone light shadow morning evening winter summer "
    "red green blue yellow black white quick slow small large bright dark warm tensor",
)


def _deepseek_v3_config(spec: TinyModelSpec, vocab_size: int):
    """DeepSeek-V3 with MLA; ``extra`` sets the latent geometry and whether layers are MoE."""
    from transformers import DeepseekV3Config

    return DeepseekV3Config(**deepseek_config_fields(spec, vocab_size))


def deepseek_config_fields(spec: TinyModelSpec, vocab_size: int) -> dict:
    """The config fields of a tiny DeepSeek-V3-family model (V3, V3.2): MLA, MoE with shared experts and
    grouped routing, and ``spec.extra`` (latent geometry, dense layers, the V3.2 indexer)."""
    fields = common_config(spec, vocab_size)
    fields.pop("head_dim")
    fields.update(
        moe_intermediate_size=spec.intermediate_size // 4,
        n_shared_experts=1,
        n_routed_experts=8,
        num_experts_per_tok=2,
        n_group=2,
        topk_group=1,
        # Fields real DeepSeek-V3 checkpoints carry and vLLM reads (HF's config class has neither: the runner's
        # CONFIG_DEFAULTS give a config without them HF's routing; the "hf-config" case leaves them out).
        topk_method="noaux_tc",
        scoring_func="sigmoid",
        routed_scaling_factor=1.5,
        norm_topk_prob=True,
        rope_interleave=True,
        tie_word_embeddings=False,
    )
    fields.update(spec.extra)
    return {name: value for name, value in fields.items() if value is not None or name == "q_lora_rank"}


def _deepseek_v3_weights(spec: TinyModelSpec, model) -> None:
    """A random ``e_score_correction_bias`` per MoE layer (zero in a fresh HF model), so it changes routing."""
    import torch

    gen = torch.Generator().manual_seed(spec.seed)
    with torch.no_grad():
        for module in model.modules():
            bias = getattr(module, "e_score_correction_bias", None)
            if isinstance(bias, torch.Tensor):
                bias.copy_(torch.randn(bias.shape, generator=gen) * 0.1)


def _deepseek_v2_config(spec: TinyModelSpec, vocab_size: int):
    """DeepSeek-V2(-Lite) as HF's DeepseekV2Config writes it: MLA without q-LoRA, greedy softmax routing,
    ``n_group``/``topk_group`` left None."""
    from transformers import DeepseekV2Config

    fields = common_config(spec, vocab_size)
    fields.pop("head_dim")
    fields.update(
        moe_intermediate_size=spec.intermediate_size // 4,
        n_shared_experts=1,
        n_routed_experts=8,
        num_experts_per_tok=2,
        tie_word_embeddings=False,
    )
    return DeepseekV2Config(**fields, **spec.extra)


if "deepseek_v3" not in MODEL_BUILDERS:
    register_model_builder("deepseek_v3", _deepseek_v3_config, _deepseek_v3_weights)
if "deepseek_v2" not in MODEL_BUILDERS:
    register_model_builder("deepseek_v2", _deepseek_v2_config)


def deepseek_v3_spec(**extra) -> TinyModelSpec:
    base = dict(
        q_lora_rank=64,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        qk_nope_head_dim=32,
        v_head_dim=32,
        first_k_dense_replace=2,  # both layers dense
    )
    base.update(extra)
    return replace(TinyModelSpec(kind="deepseek_v3", seed=7, num_kv_heads=4), extra=base)


CASES = {
    "dense-kv512-rope64": deepseek_v3_spec(),
    "dense-kv32-rope16": deepseek_v3_spec(kv_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=16),
    "moe-kv512-rope64": deepseek_v3_spec(first_k_dense_replace=1),
    "v2-lite-hf-config": replace(
        TinyModelSpec(kind="deepseek_v2", seed=5, num_kv_heads=4),
        extra=dict(
            q_lora_rank=None,
            kv_lora_rank=32,
            qk_rope_head_dim=16,
            qk_nope_head_dim=16,
            v_head_dim=32,
            first_k_dense_replace=1,
        ),
    ),
    # A config as HF's DeepseekV3Config writes it: no topk_method / scoring_func.
    "moe-hf-config": deepseek_v3_spec(first_k_dense_replace=1, topk_method=None, scoring_func=None),
    "moe-kv32-rope16-no-q-lora": deepseek_v3_spec(
        kv_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=16, q_lora_rank=None, first_k_dense_replace=1
    ),
}


def _greedy(llm, prompts: list[list[int]]) -> list[list[int]]:
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=MAX_NEW_TOKENS, temperature=0.0, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


@pytest.mark.parametrize("case", list(CASES))
def test_deepseek_mla_greedy_matches_hf(make_llm, tiny_models_root: Path, case: str):
    from transformers import AutoTokenizer

    from vllm_ascend.core.device.config import get_device_adaptor
    from vllm_ascend.testing.hf_reference import hf_greedy

    model_dir = build_tiny_model(CASES[case], tiny_models_root)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = [tokenizer(text)["input_ids"] for text in PROMPTS]
    assert max(len(p) for p in prompts) > 32 > min(len(p) for p in prompts)
    expected = hf_greedy(model_dir, prompts, MAX_NEW_TOKENS).token_ids
    assert len({tuple(t) for t in expected}) == len(expected), expected

    adaptor = get_device_adaptor()
    adaptor.reset_counts()
    # 16 tokens per step: the long prompts are prefilled over several steps (cached context), mixed with
    # decodes; the warm-up prompt leaves its first blocks in the prefix cache for the third prompt.
    llm = make_llm(model_dir, enable_prefix_caching=True, max_num_batched_tokens=16, max_num_seqs=4)
    assert _greedy(llm, prompts[1:2]) == expected[1:2]
    assert _greedy(llm, prompts) == expected
    counts = adaptor.call_counts
    assert counts["mla_prefill_attention"] > 0 and counts["mla_latent_attention"] > 0, counts
    assert counts["mla_cache_write"] > 0 and counts["fused_infer_attention"] == 0, counts
