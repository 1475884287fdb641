"""Tiny random-weight models for tests and benchmarks: every family the tests build, on the demo's builder.

The builder, the spec, the tokenizer and the dense families (``qwen3``, ``llama``) are the runner's
(:mod:`vllm_ascend.runner.demo_model`, what ``vllm-ascend demo`` ships with); this module registers the
other families in the same :data:`MODEL_BUILDERS` table (MoE, GLM-4.5, Qwen3-Next, Mamba) and their specs.
Importing it is what makes those kinds buildable.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from vllm_ascend.runner.demo_model import (
    BUILD_VERSION,
    CHAT_TEMPLATE,
    MODEL_BUILDERS,
    SPECIAL_TOKENS,
    WEIGHT_HOOKS,
    ConfigFactory,
    TinyModelSpec,
    WeightsHook,
    build_tiny_model,
    common_config,
    corpus,
    default_cache_dir,
    llama_spec,
    publish_build,
    qwen3_spec,
    register_model_builder,
    train_tokenizer,
)

__all__ = [
    "BUILD_VERSION",
    "CHAT_TEMPLATE",
    "GLM4_MOE_BIAS_STD",
    "GLM4_MOE_NUM_EXPERTS",
    "GLM4_MOE_NUM_GROUPS",
    "GLM4_MOE_ROUTED_SCALING",
    "GLM4_MOE_TOPK_GROUPS",
    "GLM4_MOE_TOP_K",
    "MODEL_BUILDERS",
    "MOE_NUM_EXPERTS",
    "MOE_TOP_K",
    "SPECIAL_TOKENS",
    "WEIGHT_HOOKS",
    "ConfigFactory",
    "TinyModelSpec",
    "WeightsHook",
    "build_tiny_model",
    "common_config",
    "corpus",
    "default_cache_dir",
    "glm4_moe_spec",
    "llama_spec",
    "mamba_spec",
    "publish_build",
    "qwen2_moe_spec",
    "qwen3_moe_spec",
    "qwen3_next_spec",
    "qwen3_spec",
    "register_model_builder",
    "train_tokenizer",
]


#: Routed experts and experts per token of the tiny MoE model.
MOE_NUM_EXPERTS = 8
MOE_TOP_K = 2


def _qwen3_moe_config(spec: TinyModelSpec, vocab_size: int) -> Any:
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(
        **common_config(spec, vocab_size),
        moe_intermediate_size=spec.intermediate_size // 2,
        num_experts=MOE_NUM_EXPERTS,
        num_experts_per_tok=MOE_TOP_K,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        tie_word_embeddings=True,
        **spec.extra,
    )


def _qwen2_moe_config(spec: TinyModelSpec, vocab_size: int) -> Any:
    """Qwen2-MoE: routed experts plus a gated shared expert in every layer."""
    from transformers import Qwen2MoeConfig

    return Qwen2MoeConfig(
        **common_config(spec, vocab_size),
        moe_intermediate_size=spec.intermediate_size // 2,
        shared_expert_intermediate_size=spec.intermediate_size,
        num_experts=MOE_NUM_EXPERTS,
        num_experts_per_tok=MOE_TOP_K,
        norm_topk_prob=False,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        tie_word_embeddings=True,
        **spec.extra,
    )


#: The tiny GLM-4.5 (``Glm4MoeForCausalLM``): routed experts, expert groups, groups kept per token, experts
#: per token, and the routed scaling factor. Sigmoid scores with ``e_score_correction_bias`` (grouped top-k).
GLM4_MOE_NUM_EXPERTS = 16
GLM4_MOE_NUM_GROUPS = 4
GLM4_MOE_TOPK_GROUPS = 2
GLM4_MOE_TOP_K = 3
GLM4_MOE_ROUTED_SCALING = 2.5
#: Standard deviation of the random ``e_score_correction_bias`` (zero in a fresh HF model).
GLM4_MOE_BIAS_STD = 0.1


def _glm4_moe_config(spec: TinyModelSpec, vocab_size: int) -> Any:
    """GLM-4.5: a dense first layer, then grouped-top-k MoE layers with one shared expert; partial rotary."""
    from transformers import Glm4MoeConfig

    return Glm4MoeConfig(
        **common_config(spec, vocab_size),
        moe_intermediate_size=spec.intermediate_size // 2,
        n_routed_experts=GLM4_MOE_NUM_EXPERTS,
        n_shared_experts=1,
        num_experts_per_tok=GLM4_MOE_TOP_K,
        n_group=GLM4_MOE_NUM_GROUPS,
        topk_group=GLM4_MOE_TOPK_GROUPS,
        routed_scaling_factor=GLM4_MOE_ROUTED_SCALING,
        norm_topk_prob=True,
        first_k_dense_replace=1,
        attention_bias=True,
        tie_word_embeddings=False,
        **spec.extra,
    )


def _glm4_moe_weights(spec: TinyModelSpec, model: Any) -> None:
    """Random ``e_score_correction_bias`` per MoE layer, so the bias changes which experts are chosen."""
    gen = torch.Generator().manual_seed(spec.seed)
    with torch.no_grad():
        for module in model.modules():
            bias = getattr(module, "e_score_correction_bias", None)
            if isinstance(bias, torch.Tensor):
                bias.copy_(torch.randn(bias.shape, generator=gen) * GLM4_MOE_BIAS_STD)


def _qwen3_next_config(spec: TinyModelSpec, vocab_size: int) -> Any:
    """Qwen3-Next: Gated DeltaNet (linear attention) and gated full-attention layers alternating, the first
    half of the layers with a dense MLP, the rest MoE (vLLM's model needs at least one MoE layer)."""
    from transformers import Qwen3NextConfig

    return Qwen3NextConfig(
        **common_config(spec, vocab_size),
        layer_types=["linear_attention", "full_attention"] * (spec.num_layers // 2),
        linear_conv_kernel_dim=4,
        linear_key_head_dim=spec.head_dim,
        linear_value_head_dim=spec.head_dim,
        linear_num_key_heads=spec.num_kv_heads,
        linear_num_value_heads=spec.num_heads,
        partial_rotary_factor=0.5,
        mlp_only_layers=list(range(spec.num_layers // 2)),
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=spec.intermediate_size // 2,
        shared_expert_intermediate_size=spec.intermediate_size // 2,
        tie_word_embeddings=False,
        **spec.extra,
    )


def _mamba_config(spec: TinyModelSpec, vocab_size: int) -> Any:
    """Mamba (attention-free state-space layers only)."""
    from transformers import MambaConfig

    return MambaConfig(
        vocab_size=vocab_size,
        hidden_size=spec.hidden_size,
        num_hidden_layers=spec.num_layers,
        state_size=16,
        initializer_range=spec.init_std,
        tie_word_embeddings=True,
        **spec.extra,
    )


register_model_builder("qwen3_moe", _qwen3_moe_config)
register_model_builder("qwen2_moe", _qwen2_moe_config)
register_model_builder("glm4_moe", _glm4_moe_config, _glm4_moe_weights)
register_model_builder("qwen3_next", _qwen3_next_config)
register_model_builder("mamba", _mamba_config)


def qwen3_moe_spec(**overrides: Any) -> TinyModelSpec:
    """Qwen3-MoE: 8 experts, top-2, 2 layers, hidden 128, 4 heads / 2 KV heads of 32."""
    return replace(TinyModelSpec(kind="qwen3_moe", seed=2), **overrides)


def qwen2_moe_spec(**overrides: Any) -> TinyModelSpec:
    """Qwen2-MoE: 8 experts, top-2, a gated shared expert, 2 layers, hidden 128."""
    return replace(TinyModelSpec(kind="qwen2_moe", seed=3), **overrides)


def glm4_moe_spec(**overrides: Any) -> TinyModelSpec:
    """GLM-4.5: 3 layers (dense, then 2 MoE), 16 experts in 4 groups, 2 groups kept, top-3, random score bias."""
    return replace(TinyModelSpec(kind="glm4_moe", seed=4, num_layers=3), **overrides)


def qwen3_next_spec(**overrides: Any) -> TinyModelSpec:
    """Qwen3-Next: 4 layers (GDN, attention, GDN, attention; dense MLPs then 4-expert top-2 MoE), hidden 64,
    4 heads / 2 KV heads of 16; GDN with 2 key / 4 value heads of 16 and a width-4 conv."""
    return replace(
        TinyModelSpec(
            kind="qwen3_next",
            seed=5,
            hidden_size=64,
            intermediate_size=128,
            num_layers=4,
            num_heads=4,
            num_kv_heads=2,
            head_dim=16,
        ),
        **overrides,
    )


def mamba_spec(**overrides: Any) -> TinyModelSpec:
    """Mamba: 2 attention-free state-space layers, hidden 64."""
    return replace(TinyModelSpec(kind="mamba", seed=6, hidden_size=64, num_layers=2), **overrides)
