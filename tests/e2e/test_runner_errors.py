"""Configurations the Ascend backend cannot serve fail at engine start with errors naming the field."""

from __future__ import annotations

import pytest

from vllm_ascend.testing.tiny_models import build_tiny_model, qwen3_spec


def test_unsupported_head_size_is_named(make_llm, tiny_models_root):
    model = build_tiny_model(qwen3_spec(head_dim=24, num_layers=1), tiny_models_root)
    with pytest.raises(Exception, match=r"head_size=24 .*allowed: multiples of 16 from 16 to 512"):
        make_llm(model)


def test_unsupported_kv_cache_dtype_is_named(make_llm, tiny_qwen3):
    with pytest.raises(Exception, match=r"kv_cache_dtype='fp8'.*allowed: auto, float16, bfloat16"):
        make_llm(tiny_qwen3, kv_cache_dtype="fp8")


@pytest.mark.parametrize(
    ("additional_config", "match"),
    [
        ({"enable_kv_nz": True}, r"`additional_config.enable_kv_nz` is not supported yet by vllm-ascend"),
        (
            {"ascend_compilation_config": {"enable_npugraph_ex": True}},
            r"additional_config.ascend_compilation_config.*enable_npugraph_ex",
        ),
        (
            {"xlite_graph_config": {"enabled": True}},
            r"`additional_config.xlite_graph_config` is not supported yet by vllm-ascend",
        ),
        (
            {"rejection_sampler_config": {"verify_method": "entropy", "entropy_threshold": 0.5}},
            r"`additional_config.rejection_sampler_config.entropy_threshold` is not supported yet by vllm-ascend",
        ),
        ({"enable_cpu_bindnig": True}, r"unknown option additional_config.enable_cpu_bindnig; did you mean"),
    ],
)
def test_refused_options_fail_at_engine_start(make_llm, tiny_qwen3, additional_config, match):
    """Through vLLM: an option this version does not serve is refused, never accepted and ignored."""
    with pytest.raises(Exception, match=match):
        make_llm(tiny_qwen3, additional_config=additional_config)


def test_refused_environment_variable_fails_at_engine_start(make_llm, tiny_qwen3, monkeypatch):
    monkeypatch.setenv("VLLM_ASCEND_ENABLE_NZ", "1")
    with pytest.raises(Exception, match=r"`VLLM_ASCEND_ENABLE_NZ` is not supported yet by vllm-ascend"):
        make_llm(tiny_qwen3)


def test_unprovided_speculative_method_is_refused(make_llm, tiny_qwen3):
    """Medusa heads are not served: refused when the config is read, naming the methods that are."""
    spec = {"method": "medusa", "model": str(tiny_qwen3), "num_speculative_tokens": 2}
    with pytest.raises(Exception, match=r"speculative_config.method = 'medusa' is not supported yet") as info:
        make_llm(tiny_qwen3, speculative_config=spec)
    for served in ("draft_model", "eagle", "eagle3", "mtp", "ngram", "suffix"):
        assert served in str(info.value)
