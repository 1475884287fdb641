"""ReferencePlatform.check_and_update_config: worker choice, eager mode, clear errors."""

from __future__ import annotations

import pytest
from vllm.config import CacheConfig, CompilationMode, CUDAGraphMode, VllmConfig

from vllm_ascend.core import platform as platform_module
from vllm_ascend.core.platform import ReferencePlatform, RunnerNotInstalledError
from vllm_ascend.core.registry import WORKERS


def test_reference_device_config(monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "2")
    config = VllmConfig()
    assert config.parallel_config.worker_cls == "vllm_ascend.runner.worker.NPUWorker"
    assert config.scheduler_config.async_scheduling is True  # vLLM's default, as on the NPU families
    assert config.compilation_config.mode == CompilationMode.NONE
    assert config.compilation_config.cudagraph_mode == CUDAGraphMode.NONE
    assert config.compilation_config.cudagraph_capture_sizes == []
    assert config.cache_config.block_size == 128
    assert config.cache_config.kv_cache_memory_bytes == 2 << 30
    assert ReferencePlatform.device_type == "cpu" and ReferencePlatform.dist_backend == "gloo"
    assert ReferencePlatform.is_pin_memory_available() is False
    assert ReferencePlatform.opaque_attention_op() is True
    assert ReferencePlatform.get_current_memory_usage() > 0


def test_attention_backend_and_kernel_overrides_come_from_the_worker():
    from vllm.v1.attention.selector import AttentionSelectorConfig

    selector = AttentionSelectorConfig(head_size=64, dtype=None, kv_cache_dtype=None, block_size=16)
    assert ReferencePlatform.get_attn_backend_cls(None, selector).endswith("AscendAttentionBackend")
    assert ReferencePlatform.get_attn_backend_cls(None, selector._replace(use_mla=True)).endswith(
        "AscendMLABackend"
    )
    assert ReferencePlatform.get_attn_backend_cls(
        None, selector._replace(use_mla=True, use_sparse=True)
    ).endswith("AscendSFABackend")
    with pytest.raises(ValueError, match="use_sparse=True is not supported by this Ascend worker"):
        ReferencePlatform.get_attn_backend_cls(None, selector._replace(use_sparse=True))


def test_block_size_must_be_a_multiple_of_16():
    with pytest.raises(ValueError, match=r"cache_config.block_size=8 .*allowed: multiples of 16"):
        VllmConfig(cache_config=CacheConfig(block_size=8))


def test_missing_runner_is_named(monkeypatch):
    config = VllmConfig()
    config.parallel_config.worker_cls = "auto"
    entry = WORKERS.entry("default")
    WORKERS.unregister("default")
    monkeypatch.setattr("vllm_ascend.core.extensions.load_extensions", lambda: None)
    try:
        with pytest.raises(RunnerNotInstalledError, match="`vllm-ascend-runner` is not installed"):
            ReferencePlatform.check_and_update_config(config)
    finally:
        WORKERS.register("default", entry.value)
    assert platform_module.RUNNER_DIST == "vllm-ascend-runner"


def test_breakable_cuda_graphs_are_switched_off_and_the_profile_default_applies(monkeypatch):
    """vLLM enables its CUDA-only breakable graphs for DeepSeek-V3.2 (and turns compilation off for them): the
    platform switches them off and the reference device runs eagerly, as it does by default."""
    import os

    monkeypatch.setenv("VLLM_USE_BREAKABLE_CUDAGRAPH", "1")
    config = VllmConfig()
    assert os.environ["VLLM_USE_BREAKABLE_CUDAGRAPH"] == "0"
    assert config.compilation_config.mode == CompilationMode.NONE
    assert config.compilation_config.cudagraph_mode == CUDAGraphMode.NONE


def test_compiled_graphs_split_around_the_runners_opaque_ops():
    from vllm.config import CompilationConfig

    from vllm_ascend.runner.attention.mla.sparse import DSA_INDEXER_OP

    compiled = VllmConfig(compilation_config=CompilationConfig(mode=CompilationMode.VLLM_COMPILE))
    ops = compiled.compilation_config.splitting_ops
    assert DSA_INDEXER_OP in ops and "vllm::unified_mla_attention_with_output" in ops
    assert DSA_INDEXER_OP not in (VllmConfig().compilation_config.splitting_ops or [])
