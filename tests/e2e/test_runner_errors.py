"""Configurations the Ascend backend cannot serve fail at engine start with errors naming the field."""

from __future__ import annotations

import pytest

from vllm_ascend.runner.testing.tiny_models import build_tiny_model, qwen3_spec


def test_unsupported_head_size_is_named(make_llm, tiny_models_root):
    model = build_tiny_model(qwen3_spec(head_dim=24, num_layers=1), tiny_models_root)
    with pytest.raises(Exception, match=r"head_size=24 .*allowed: multiples of 16 from 16 to 512"):
        make_llm(model)


def test_unsupported_kv_cache_dtype_is_named(make_llm, tiny_qwen3):
    with pytest.raises(Exception, match=r"kv_cache_dtype='fp8'.*allowed: auto, float16, bfloat16"):
        make_llm(tiny_qwen3, kv_cache_dtype="fp8")
