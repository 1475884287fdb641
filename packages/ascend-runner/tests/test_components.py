"""Custom-op registration, the KV block zeroer, name patching and the serve command line."""

from __future__ import annotations

import types
from types import SimpleNamespace

import pytest
import torch
from vllm.model_executor.custom_op import op_registry_oot
from vllm.v1.kv_cache_interface import FullAttentionSpec

from vllm_ascend.runner.kv_zeroer import AscendKVBlockZeroer, block_major_view
from vllm_ascend.runner.ops.registry import (
    CUSTOM_OPS,
    PLUGGABLE_LAYERS,
    enable_custom_ops,
    register_custom_ops,
)
from vllm_ascend.runner.patching import replaced_names
from vllm_ascend.runner.serve import server_args, server_env, split_device


def test_custom_op_registration_is_idempotent_and_refuses_conflicts(monkeypatch):
    register_custom_ops()
    register_custom_ops()
    for name, cls in {**CUSTOM_OPS, **PLUGGABLE_LAYERS}.items():
        assert op_registry_oot[name] is cls
    monkeypatch.setitem(op_registry_oot, "RMSNorm", type("OtherRMSNorm", (), {}))
    with pytest.raises(RuntimeError, match=r"'RMSNorm' is already registered to .*OtherRMSNorm"):
        register_custom_ops()
    ops = ["none", "-SiluAndMul"]
    enable_custom_ops(ops)
    assert ops == [
        "none",
        "-SiluAndMul",
        "+RMSNorm",
        "+RotaryEmbedding",
        "+MRotaryEmbedding",
        "+MMEncoderAttention",
        "+ApplyRotaryEmb",
    ]


def test_kv_zeroer_zeroes_only_the_given_blocks_of_every_layer():
    spec = FullAttentionSpec(block_size=4, num_kv_heads=2, head_size=8, dtype=torch.float32)
    flat = torch.ones(2 * 6 * 4 * 2 * 16)
    # Two layers of a token-major pool, viewed [blocks, H, block_size, D + Dv] like vLLM does.
    layers = [flat.view(2, 6, 4, 2, 16)[i].permute(0, 2, 1, 3) for i in range(2)]
    ctx = {f"l{i}": SimpleNamespace(kv_cache=kv) for i, kv in enumerate(layers)}
    group = SimpleNamespace(
        kv_cache_spec=spec, kv_cache_group_id=0, layer_names=["l0", "l1"], kernel_block_stride=0
    )
    zeroer = AscendKVBlockZeroer(torch.device("cpu"), [group], [4], ctx, num_blocks=6)
    assert len(zeroer.caches) == 2 and zeroer.caches[0][0].is_contiguous()
    zeroer.zero_block_ids([1, 4])
    for kv in layers:
        assert (kv[[1, 4]] == 0).all() and (kv[[0, 2, 3, 5]] == 1).all()
    with pytest.raises(ValueError, match=r"block ids must lie in \[0, 6\)"):
        zeroer.zero_block_ids([6])
    assert block_major_view(layers[0]).shape == (6, 4, 2, 16)


def test_kv_zeroer_zeroes_both_regions_of_an_mla_latent_cache():
    """An MLA layer's blocks live in two regions (c_kv, then k_pe): zeroing a block clears its rows in both
    and nothing of the neighbouring blocks."""
    from vllm.v1.kv_cache_interface import MLAAttentionSpec

    from vllm_ascend.core.device.adaptor.mla import latent_cache_parts
    from vllm_ascend.runner.attention.mla.impl import AscendMLAImpl

    spec = MLAAttentionSpec(block_size=4, num_kv_heads=1, head_size=12, dtype=torch.float32)
    cache = torch.ones(6, 4, 12)
    impl = AscendMLAImpl.__new__(AscendMLAImpl)
    impl.kv_lora_rank = 8
    ctx = {"mla": SimpleNamespace(kv_cache=cache, impl=impl)}
    group = SimpleNamespace(
        kv_cache_spec=spec, kv_cache_group_id=0, layer_names=["mla"], kernel_block_stride=0
    )
    zeroer = AscendKVBlockZeroer(torch.device("cpu"), [group], [4], ctx, num_blocks=6)
    assert [tuple(c.shape) for c in zeroer.caches] == [(6, 4, 8), (6, 4, 4)]
    zeroer.zero_block_ids([2])
    for part in latent_cache_parts(cache, 8):
        assert (part[2] == 0).all() and (part[[0, 1, 3, 4, 5]] == 1).all()


def test_region_split_caches_may_not_share_bytes_with_other_layers():
    """vLLM overlays the cache groups of hybrid models in one allocation; an MLA latent cache (two regions)
    there would write across other groups' blocks, so it is refused; side by side it is accepted."""
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheTensor

    from vllm_ascend.runner.model_runner import check_region_split_caches

    mla = SimpleNamespace(impl=SimpleNamespace(cache_block_views=lambda kv: [kv]))
    ctx = {"mla.0": mla, "mla.1": mla, "mamba.0": SimpleNamespace(impl=None)}
    side_by_side = KVCacheTensor(size=4096, layers=["mla.0", "mla.1"], layer_stride=1024, block_stride=256)
    check_region_split_caches(
        KVCacheConfig(num_blocks=4, kv_cache_tensors=[side_by_side], kv_cache_groups=[]), ctx
    )
    overlay = KVCacheTensor(size=4096, layers=["mamba.0"], layer_stride=1024, block_stride=256, offset=1024)
    config = KVCacheConfig(num_blocks=4, kv_cache_tensors=[side_by_side, overlay], kv_cache_groups=[])
    with pytest.raises(ValueError, match=r"mla.1: the MLA latent cache .* cannot share memory with mamba.0"):
        check_region_split_caches(config, ctx)


def test_replaced_names_restores_and_rejects_unknown_names():
    module = types.ModuleType("m")
    module.Thing = int
    with replaced_names(module, {"Thing": float}):
        assert module.Thing is float
    assert module.Thing is int
    with pytest.raises(AttributeError, match="m has no Missing"):
        with replaced_names(module, {"Missing": float}):
            pass


def test_serve_command_line():
    device, rest = split_device(None, ["--port", "8001", "--device", "reference", "--dtype", "float32"])
    assert device == "reference" and rest == ["--port", "8001", "--dtype", "float32"]
    assert server_args("/m", rest) == ["--model", "/m", "--port", "8001", "--dtype", "float32"]
    env = server_env("reference", {})
    assert env["VLLM_ASCEND_DEVICE"] == "reference" and env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    with pytest.raises(ValueError, match="--device='gpu' is invalid; allowed values: auto, npu, reference"):
        server_env("gpu", {})


def test_demo_model_specs_and_builders():
    """The demo's builder, shipped in the runner: specs keyed by content, its dense families, a closed registry."""
    from vllm_ascend.runner.demo_model import (
        MODEL_BUILDERS,
        TinyModelSpec,
        build_tiny_model,
        llama_spec,
        qwen3_spec,
        register_model_builder,
    )

    assert qwen3_spec().key() == qwen3_spec().key() != qwen3_spec(hidden_size=64).key()
    assert llama_spec().kind == "llama" and {"qwen3", "llama"} <= set(MODEL_BUILDERS)
    with pytest.raises(ValueError, match=r"kind 'rwkv' is unknown; allowed: .*llama.*qwen3"):
        build_tiny_model(TinyModelSpec(kind="rwkv"))
    with pytest.raises(ValueError, match="'qwen3' is already registered"):
        register_model_builder("qwen3", lambda spec, vocab: None)
