"""Test helpers: a tiny Qwen3-MoE builder for ``vllm_ascend.runner.testing.tiny_models`` and
expert-map files. Importing this module registers the ``qwen3_moe`` kind (needs the runner's
testing helpers and ``transformers``)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from vllm_ascend.eplb.expert_map_file import save_expert_map
from vllm_ascend.runner.testing.tiny_models import TinyModelSpec, register_model_builder

#: Routed experts and experts per token of the tiny MoE model.
NUM_EXPERTS = 8
TOP_K = 2


def _qwen3_moe_config(spec: TinyModelSpec, vocab_size: int) -> Any:
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(
        vocab_size=vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        moe_intermediate_size=spec.intermediate_size // 2,
        num_experts=NUM_EXPERTS,
        num_experts_per_tok=TOP_K,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_position_embeddings,
        initializer_range=spec.init_std,
        tie_word_embeddings=True,
        rope_theta=10000.0,
        **spec.extra,
    )


register_model_builder("qwen3_moe", _qwen3_moe_config)


def qwen3_moe_spec(**overrides: Any) -> TinyModelSpec:
    """Qwen3-MoE: 8 experts, top-2, 2 layers, hidden 128, 4 heads / 2 KV heads of 32."""
    return replace(TinyModelSpec(kind="qwen3_moe", seed=2), **overrides)


def write_expert_map(rows: list[list[int]], num_layers: int, path: Path) -> Path:
    """Write an expert-map JSON file giving every layer the same ``[ranks][slots]`` placement."""
    table = np.broadcast_to(np.asarray(rows, dtype=np.int64), (num_layers, len(rows), len(rows[0])))
    save_expert_map(table, path)
    return path
