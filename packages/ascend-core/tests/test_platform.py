"""The platforms: one shared base whose behaviour comes from the active profile and adaptor."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("vllm")

from vllm_ascend.core import platform as platform_module
from vllm_ascend.core.config import ConfigError
from vllm_ascend.core.device.adaptor.base import BaseDeviceAdaptor, DeviceOpError
from vllm_ascend.core.device.config import clear_device_caches, get_device_adaptor
from vllm_ascend.core.device.family import AscendDeviceType
from vllm_ascend.core.device.profile import (
    BUILTIN_PROFILES,
    REFERENCE_PROFILE,
    HardwareCapability,
)
from vllm_ascend.core.platform import AscendPlatform, NPUPlatform, ReferencePlatform
from vllm_ascend.core.registry import SPEC_DECODE_METHODS, registering_as
from vllm_ascend.kernels.device.npu import A2A3DeviceAdaptor
from vllm_ascend.kernels.device.reference import (
    ReferenceDeviceAdaptor,
    ReferenceEvent,
    ReferenceStream,
)

PLATFORMS = (NPUPlatform, ReferencePlatform)
NO_BF16 = REFERENCE_PROFILE.with_changes(
    name="reference without bf16",
    capabilities=frozenset({HardwareCapability.INT4}),
    supported_dtypes=("float16", "float32"),
)


@pytest.fixture
def reference(monkeypatch):
    monkeypatch.setenv("VLLM_ASCEND_DEVICE", "reference")
    clear_device_caches()
    yield
    clear_device_caches()


def use_profile(monkeypatch, profile):
    monkeypatch.setattr(platform_module, "get_current_hardware_profile", lambda: profile)


def test_both_platforms_share_the_base_and_nothing_branches_on_reference():
    for cls in PLATFORMS:
        assert issubclass(cls, AscendPlatform) and cls is not AscendPlatform
        assert not hasattr(cls, "is_reference")
    assert not hasattr(AscendPlatform, "is_reference")
    assert not hasattr(platform_module, "_REFERENCE") and not hasattr(platform_module, "PLATFORM_QUALNAME")
    # what vLLM reads before any device exists: class attributes from the profile's data
    assert (NPUPlatform.device_type, NPUPlatform.dist_backend, NPUPlatform.dispatch_key) == (
        "npu",
        "hccl",
        "PrivateUse1",
    )
    assert (ReferencePlatform.device_type, ReferencePlatform.dist_backend) == (
        REFERENCE_PROFILE.torch_device,
        REFERENCE_PROFILE.dist_backend,
    )


def test_importing_the_platform_detects_nothing():
    code = (
        "import os; os.environ['VLLM_ASCEND_DEVICE'] = 'gpu'\n"
        "import vllm_ascend.core.device.detection as d\n"
        "def boom(*a, **k): raise AssertionError('detect() called at import')\n"
        "d.detect = boom\n"
        "import vllm_ascend.core.platform as p\n"
        "print(p.ReferencePlatform.device_type, p.NPUPlatform.device_type)\n"
    )
    env = {**os.environ, "VLLM_ASCEND_DEVICE": "gpu"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-2:] == ["cpu", "npu"]


def test_dtype_check_follows_the_active_profile(monkeypatch):
    use_profile(monkeypatch, NO_BF16)
    for cls in PLATFORMS:
        with pytest.raises(ValueError) as info:
            cls.check_if_supports_dtype(torch.bfloat16)
        assert str(info.value) == (
            "model dtype torch.bfloat16 is not supported on reference without bf16; "
            "allowed: torch.float16, torch.float32 (pass dtype=... to convert the checkpoint)"
        )
        cls.check_if_supports_dtype(torch.float16)
    use_profile(monkeypatch, REFERENCE_PROFILE)
    ReferencePlatform.check_if_supports_dtype(torch.bfloat16)


def test_dtype_check_on_the_reference_device(reference):
    assert ReferencePlatform.profile() is REFERENCE_PROFILE
    for name in REFERENCE_PROFILE.supported_dtypes:
        ReferencePlatform.check_if_supports_dtype(getattr(torch, name))
    with pytest.raises(
        ValueError, match=r"model dtype torch.int8 is not supported on reference \(torch cpu\)"
    ):
        ReferencePlatform.check_if_supports_dtype(torch.int8)


@pytest.mark.parametrize(
    "profile", [*BUILTIN_PROFILES.values(), REFERENCE_PROFILE], ids=lambda p: p.name.split(" (")[0]
)
def test_static_graph_support_comes_from_the_profile(monkeypatch, profile):
    use_profile(monkeypatch, profile)
    for cls in PLATFORMS:
        assert cls.support_static_graph_mode() is profile.supports(HardwareCapability.GRAPH_CAPTURE)


def _compilation_request(mode=None, cudagraph_mode=None, enforce_eager=False, custom_ops=()):
    from vllm.config import CompilationConfig

    config = CompilationConfig(custom_ops=list(custom_ops))
    config.mode, config.cudagraph_mode = mode, cudagraph_mode
    return SimpleNamespace(
        use_v2_model_runner=False,
        compilation_config=config,
        model_config=SimpleNamespace(enforce_eager=enforce_eager),
    )


def test_graph_defaults_come_from_the_profile(monkeypatch):
    from vllm.config import CompilationMode, CUDAGraphMode

    use_profile(monkeypatch, REFERENCE_PROFILE)  # eager unless asked
    unasked = _compilation_request()
    ReferencePlatform.apply_config_platform_defaults(unasked)
    cc = unasked.compilation_config
    assert (cc.mode, cc.cudagraph_mode, cc.custom_ops) == (CompilationMode.NONE, CUDAGraphMode.NONE, ["all"])
    asked = _compilation_request(CompilationMode.VLLM_COMPILE, CUDAGraphMode.PIECEWISE, custom_ops=["none"])
    ReferencePlatform.apply_config_platform_defaults(asked)
    cc = asked.compilation_config
    assert (cc.mode, cc.cudagraph_mode, cc.custom_ops) == (
        CompilationMode.VLLM_COMPILE,
        CUDAGraphMode.PIECEWISE,
        ["none"],
    )
    use_profile(monkeypatch, BUILTIN_PROFILES[next(iter(BUILTIN_PROFILES))])  # an NPU family: graph mode
    monkeypatch.setattr(NPUPlatform, "adaptor", classmethod(lambda cls: A2A3DeviceAdaptor()))
    npu = _compilation_request()
    NPUPlatform.apply_config_platform_defaults(npu)  # vLLM compiles; graphs PIECEWISE (FULL needs the update)
    assert (npu.compilation_config.mode, npu.compilation_config.cudagraph_mode) == (
        None,
        CUDAGraphMode.PIECEWISE,
    )
    with pytest.raises(
        ConfigError,
        match=r"cudagraph_mode=FULL_DECODE_ONLY is not supported yet by vllm-ascend .* on A2/A3 \(the captured "
        r"fused attention would keep its capture's sequence lengths.*allowed: PIECEWISE, NONE",
    ):
        NPUPlatform.apply_config_platform_defaults(
            _compilation_request(cudagraph_mode=CUDAGraphMode.FULL_DECODE_ONLY)
        )
    monkeypatch.setattr(ReferencePlatform, "adaptor", classmethod(lambda cls: ReferenceDeviceAdaptor()))
    use_profile(monkeypatch, REFERENCE_PROFILE)
    full = _compilation_request(cudagraph_mode=CUDAGraphMode.FULL_DECODE_ONLY)
    ReferencePlatform.apply_config_platform_defaults(full)  # the reference graphs take the update
    assert full.compilation_config.cudagraph_mode == CUDAGraphMode.FULL_DECODE_ONLY


def test_graphs_and_compilation_are_refused_where_the_profile_has_none(monkeypatch):
    from vllm.config import CompilationMode, CUDAGraphMode

    p310 = [p for p in BUILTIN_PROFILES.values() if not p.supports(HardwareCapability.GRAPH_CAPTURE)]
    assert [p.name for p in p310] == ["Atlas 310P (baseline; install vllm-ascend-310p)"]
    use_profile(monkeypatch, p310[0])
    with pytest.raises(ConfigError, match=r"cudagraph_mode=FULL_DECODE_ONLY is not supported on Atlas 310P.*"
                       r"captures no device graphs; allowed: NONE \(or enforce_eager=True\)"):  # fmt: skip
        NPUPlatform.apply_config_platform_defaults(
            _compilation_request(cudagraph_mode=CUDAGraphMode.FULL_DECODE_ONLY)
        )
    with pytest.raises(ConfigError, match=r"compilation_config.mode=VLLM_COMPILE is not supported on Atlas 310P.*"
                       r"runs eagerly only; allowed: NONE"):  # fmt: skip
        NPUPlatform.apply_config_platform_defaults(_compilation_request(mode=CompilationMode.VLLM_COMPILE))
    eager = _compilation_request(CompilationMode.VLLM_COMPILE, CUDAGraphMode.PIECEWISE, enforce_eager=True)
    NPUPlatform.apply_config_platform_defaults(eager)  # enforce_eager wins: eager, no error
    assert (eager.compilation_config.mode, eager.compilation_config.cudagraph_mode) == (
        CompilationMode.NONE,
        CUDAGraphMode.NONE,
    )


def test_vllm_cuda_fusion_switches_are_turned_off():
    from vllm.config import CompilationConfig

    config = CompilationConfig()
    config.pass_config.fuse_norm_quant = config.pass_config.enable_qk_norm_rope_fusion = True
    AscendPlatform._hand_fusion_to_ascend_passes(SimpleNamespace(compilation_config=config))
    assert not config.pass_config.fuse_norm_quant and not config.pass_config.enable_qk_norm_rope_fusion
    assert config.pass_config.eliminate_noops  # not a CUDA kernel choice: left as it is


def test_device_facts_come_from_the_adaptor(reference):
    adaptor = get_device_adaptor()
    assert type(adaptor) is ReferenceDeviceAdaptor and ReferencePlatform.adaptor() is adaptor
    assert ReferencePlatform.get_device_name() == adaptor.device_name() == "Ascend reference device (cpu)"
    assert ReferencePlatform.is_pin_memory_available() is False
    assert ReferencePlatform.get_device_total_memory() == adaptor.total_memory() > 0
    assert ReferencePlatform.get_current_memory_usage() > 0
    ReferencePlatform.manual_seed_all(7)
    first = torch.rand(4)
    ReferencePlatform.manual_seed_all(7)
    assert torch.equal(first, torch.rand(4))


def test_reference_adaptor_runtime(monkeypatch):
    adaptor = ReferenceDeviceAdaptor()
    assert adaptor.torch_device(3) == torch.device("cpu")
    adaptor.set_device(torch.device("cpu"))
    adaptor.synchronize()
    adaptor.empty_cache()
    api = adaptor.stream_api()
    assert set(api) == {"Stream", "Event", "current_stream", "stream", "set_stream", "Tensor.record_stream"}
    assert (api["Stream"], api["Event"]) == (ReferenceStream, ReferenceEvent)
    stream = api["current_stream"]()
    assert isinstance(stream, ReferenceStream) and stream.device == torch.device("cpu")
    assert isinstance(stream.record_event(), ReferenceEvent)
    monkeypatch.setattr(torch.accelerator, "synchronize", torch.accelerator.synchronize)
    monkeypatch.setattr(torch.accelerator, "empty_cache", torch.accelerator.empty_cache)
    adaptor.install_runtime_shims()
    adaptor.install_runtime_shims()  # idempotent
    torch.accelerator.synchronize()
    torch.accelerator.empty_cache()


def test_npu_adaptor_runtime_needs_torch_npu():
    assert not issubclass(A2A3DeviceAdaptor, ReferenceDeviceAdaptor)
    assert A2A3DeviceAdaptor.TORCH_OPS == frozenset({"kv_load"})
    adaptor = A2A3DeviceAdaptor()
    # kv_load is device-agnostic torch code: it runs (and agrees with the reference) without torch_npu
    key_cache, value_cache = torch.arange(24.0).view(3, 2, 2, 2), -torch.arange(24.0).view(3, 2, 2, 2)
    args = (key_cache, value_cache, torch.tensor([[2, 0]]), torch.tensor([3]))
    keys, values = adaptor.kv_load(*args)
    assert torch.equal(keys, torch.cat([key_cache[2], key_cache[0][:1]]))
    expected = ReferenceDeviceAdaptor().kv_load(*args)
    assert torch.equal(keys, expected[0]) and torch.equal(values, expected[1])
    assert adaptor.call_counts["kv_load"] == 1
    assert adaptor.pin_memory_available() is True
    for call in (adaptor.synchronize, adaptor.empty_cache, adaptor.stream_api, adaptor.device_name):
        with pytest.raises(DeviceOpError, match=r"the NPU device adaptor needs torch_npu"):
            call()


def test_an_adaptor_must_implement_the_runtime():
    class OpsOnly(BaseDeviceAdaptor):
        family = "ops only"

    missing = OpsOnly.__abstractmethods__
    assert {
        "torch_device",
        "stream_api",
        "graph_pool_handle",
        "install_runtime_shims",
        "pin_memory_available",
    } <= missing
    with pytest.raises(TypeError, match="abstract"):
        OpsOnly()


@pytest.fixture
def spec_methods(core_only):
    """SPEC_DECODE_METHODS with no sibling proposer registered."""
    return core_only(SPEC_DECODE_METHODS)


def test_speculative_method_must_be_registered(spec_methods):
    """On the V1 runner (which drafts with the registry's proposers); V2 drafts with vLLM's speculators."""
    v2_config = SimpleNamespace(speculative_config=SimpleNamespace(method="eagle3"), use_v2_model_runner=True)
    ReferencePlatform._check_speculative_method(v2_config)  # not refused: nothing of the registry is read
    vllm_config = SimpleNamespace(
        speculative_config=SimpleNamespace(method="eagle3"), use_v2_model_runner=False
    )
    with pytest.raises(ConfigError) as info:
        ReferencePlatform._check_speculative_method(vllm_config)
    assert str(info.value) == (
        "speculative_config.method = 'eagle3' is not supported yet by vllm-ascend; "
        "supported: none (install vllm-ascend[specdecode] for 'ngram')"
    )
    with registering_as("vllm-ascend-testdist"):
        spec_methods.register("ngram", "collections:OrderedDict")
    with pytest.raises(ConfigError, match=r"'eagle3' is not supported yet by vllm-ascend; supported: ngram$"):
        NPUPlatform._check_speculative_method(vllm_config)
    NPUPlatform._check_speculative_method(
        SimpleNamespace(speculative_config=SimpleNamespace(method="ngram"), use_v2_model_runner=False)
    )
    NPUPlatform._check_speculative_method(SimpleNamespace(speculative_config=None))


def _pooling_config(attn_type, chunked, budget, runner="pooling"):
    return SimpleNamespace(
        model_config=SimpleNamespace(
            runner_type=runner, attn_type=attn_type, max_model_len=128, architecture="BertModel"
        ),
        scheduler_config=SimpleNamespace(enable_chunked_prefill=chunked, max_num_batched_tokens=budget),
    )


def test_chunked_prefill_that_could_split_an_encoder_only_prompt_is_refused():
    """vLLM only warns when chunked prefill is asked for an encoder-only pooling model; a chunk of a
    bidirectional prompt would attend to itself only, so the platform refuses it by name."""
    with pytest.raises(ConfigError, match=r"enable_chunked_prefill=True with max_num_batched_tokens=16 < "
                       r"max_model_len=128 .*BertModel.*allowed: enable_chunked_prefill=False"):  # fmt: skip
        ReferencePlatform._check_encoder_only_chunking(_pooling_config("encoder_only", True, 16))
    # Served: no chunking, a budget that holds any prompt, causal decoders (LAST pooling chunks), generation.
    for config in (
        _pooling_config("encoder_only", False, 128),
        _pooling_config("encoder_only", True, 128),
        _pooling_config("decoder", True, 16),
        _pooling_config("encoder_only", True, 16, runner="generate"),
    ):
        ReferencePlatform._check_encoder_only_chunking(config)


def _hybrid_config(arch, hybrid=True, inner_state=True, spec=None, tp=1, prefix_caching=True, connector=None):
    return SimpleNamespace(
        kv_transfer_config=SimpleNamespace(kv_connector=connector) if connector else None,
        model_config=SimpleNamespace(
            architecture=arch, is_hybrid=hybrid, has_inner_state=inner_state, max_model_len=256
        ),
        speculative_config=spec,
        parallel_config=SimpleNamespace(tensor_parallel_size=tp),
        cache_config=SimpleNamespace(
            enable_prefix_caching=prefix_caching, mamba_cache_mode="align", mamba_block_size=16
        ),
    )


@pytest.mark.parametrize(
    ("arch", "hybrid"),
    [("MambaForCausalLM", False), ("NemotronHForCausalLM", True), ("KimiLinearForCausalLM", True)],
)
def test_models_with_mamba_style_state_outside_the_served_set_are_refused(arch, hybrid):
    with pytest.raises(ConfigError) as info:
        ReferencePlatform._check_hybrid_model(_hybrid_config(arch, hybrid=hybrid))
    message = str(info.value)
    assert message.startswith(f"architecture {arch} is not supported yet by vllm-ascend ")
    assert "out of scope of this release except Qwen3NextForCausalLM" in message
    assert "(vllm_ascend.kernels.causal_conv1d_fn, causal_conv1d_update, fused_gdn_gating)" in message


def test_qwen3_next_is_served_with_prefix_caching_and_without_spec_decode_or_tp():
    config = _hybrid_config("Qwen3NextForCausalLM")
    NPUPlatform._check_hybrid_model(config)
    # vLLM's prefix-caching setup is kept: states at block-aligned positions, copied by the runner's kernels.
    assert config.cache_config.enable_prefix_caching is True
    assert config.cache_config.mamba_cache_mode == "align"
    assert config.cache_config.mamba_block_size == 16
    with pytest.raises(
        ConfigError, match=r"speculative decoding with Qwen3NextForCausalLM .*not supported yet"
    ):
        NPUPlatform._check_hybrid_model(
            _hybrid_config("Qwen3NextForCausalLM", spec=SimpleNamespace(method="mtp"))
        )
    with pytest.raises(
        ConfigError, match=r"tensor_parallel_size=2 with Qwen3NextForCausalLM .*supported: 1$"
    ):
        NPUPlatform._check_hybrid_model(_hybrid_config("Qwen3NextForCausalLM", tp=2))
    with pytest.raises(
        ConfigError,
        match=r"kv_transfer_config.kv_connector = 'OffloadingConnector' with Qwen3NextForCausalLM .*supported: no "
        "kv_transfer_config$",
    ):
        NPUPlatform._check_hybrid_model(
            _hybrid_config("Qwen3NextForCausalLM", connector="OffloadingConnector")
        )


def test_models_without_mamba_style_state_are_left_alone():
    config = _hybrid_config("Qwen3ForCausalLM", hybrid=False, inner_state=False, spec=object(), tp=2)
    ReferencePlatform._check_hybrid_model(config)
    assert (
        config.cache_config.enable_prefix_caching is True and config.cache_config.mamba_cache_mode == "align"
    )
    ReferencePlatform._check_hybrid_model(SimpleNamespace(model_config=None))
    assert ReferencePlatform.support_hybrid_kv_cache() and NPUPlatform.support_hybrid_kv_cache()


def test_vit_attention_is_torch_sdpa_and_other_backends_are_refused_by_name():
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    sdpa = AttentionBackendEnum.TORCH_SDPA
    for platform in (ReferencePlatform, NPUPlatform):
        assert platform.get_supported_vit_attn_backends() == [sdpa]
        assert platform.get_vit_attn_backend(64, torch.float16) is sdpa
        assert platform.get_vit_attn_backend(64, torch.float16, sdpa) is sdpa
        with pytest.raises(
            ValueError, match=r"mm_encoder_attn_backend='FLASH_ATTN' is not supported.*TORCH_SDPA"
        ):
            platform.get_vit_attn_backend(64, torch.float16, AttentionBackendEnum.FLASH_ATTN)


def _lora_request(lora=True, moe=False, quantization=None, tp=1, graphs="NONE"):
    from vllm.config import CUDAGraphMode

    return SimpleNamespace(
        lora_config=SimpleNamespace(max_lora_rank=8) if lora else None,
        model_config=SimpleNamespace(
            is_moe=moe, quantization=quantization, architectures=["Qwen3MoeForCausalLM"]
        ),
        parallel_config=SimpleNamespace(tensor_parallel_size=tp),
        compilation_config=SimpleNamespace(cudagraph_mode=CUDAGraphMode[graphs]),
    )


def test_lora_is_served_on_every_family_and_quantized_bases_are_refused(monkeypatch):
    """Every family serves enable_lora (310P, without Triton, on the kernels' torch references; A2 with TP 2 and
    graphs); a quantized base model is refused by name; without LoRA nothing is checked."""
    p310 = next(p for p in BUILTIN_PROFILES.values() if not p.supports(HardwareCapability.TRITON))
    use_profile(monkeypatch, p310)
    NPUPlatform._check_lora(_lora_request())
    NPUPlatform._check_lora(_lora_request(lora=False, quantization="ascend"))
    use_profile(monkeypatch, BUILTIN_PROFILES[AscendDeviceType.A2])
    NPUPlatform._check_lora(_lora_request(tp=2, graphs="FULL_AND_PIECEWISE"))  # served: TP and graphs
    with pytest.raises(ConfigError, match=r"enable_lora with quantization='ascend' .*allowed: None"):
        NPUPlatform._check_lora(_lora_request(quantization="ascend"))


def _transfer_config(backend: str | None, quantization: str | None = None) -> SimpleNamespace:
    transfer = None if backend is None else SimpleNamespace(backend=backend)
    return SimpleNamespace(
        weight_transfer_config=transfer, model_config=SimpleNamespace(quantization=quantization)
    )


def test_weight_transfer_backend_must_be_the_devices_collective_backend(reference, core_only):
    """Served: the name equal to the profile's ``dist_backend`` (gloo here) once a sibling registered its engine;
    vLLM's CUDA backends and the other device's name are refused naming the allowed ones; so are quantized
    models (updates are not re-quantized)."""
    from vllm_ascend.core.registry import WEIGHT_TRANSFER_ENGINES

    engines = core_only(WEIGHT_TRANSFER_ENGINES)
    ReferencePlatform._check_weight_transfer(_transfer_config(None))  # not asked for: nothing checked
    with pytest.raises(ConfigError) as info:
        ReferencePlatform._check_weight_transfer(_transfer_config("gloo"))
    assert "allowed: none (install vllm-ascend-runner) here" in str(info.value)
    with registering_as("vllm-ascend-testdist"):
        engines.register("gloo", "collections:OrderedDict")
        engines.register("hccl", "collections:OrderedDict")
    ReferencePlatform._check_weight_transfer(_transfer_config("gloo"))
    for backend in ("nccl", "ipc", "hccl"):
        with pytest.raises(ConfigError) as info:
            ReferencePlatform._check_weight_transfer(_transfer_config(backend))
        assert str(info.value).startswith(
            f"weight_transfer_config.backend={backend!r} is not served on Ascend (reference (torch cpu)) by "
        )
        assert str(info.value).endswith(
            "; allowed: 'gloo' here (per device: hccl (NPU), gloo (reference device))"
        )
    with pytest.raises(ConfigError) as info:
        ReferencePlatform._check_weight_transfer(_transfer_config("gloo", quantization="ascend"))
    assert "weight_transfer_config with quantization='ascend' is not supported yet" in str(info.value)
    assert str(info.value).endswith("allowed: quantization=None")


def test_stateless_group_of_the_reference_device_is_gloo(reference):
    """The platform's stateless device group comes from the adaptor: gloo on the reference device (a
    one-rank group over a hash store all-reduces); another backend is refused by name."""
    from datetime import timedelta

    import torch.distributed as dist

    store = dist.HashStore()
    group = ReferencePlatform.stateless_init_device_torch_dist_pg("gloo", store, 0, 1, timedelta(seconds=10))
    tensor = torch.ones(3)
    group.allreduce(tensor).wait()
    assert tensor.tolist() == [1.0, 1.0, 1.0] and group.size() == 1
    with pytest.raises(DeviceOpError, match=r"backend='hccl' is not served here; allowed: 'gloo'"):
        ReferencePlatform.stateless_init_device_torch_dist_pg("hccl", store, 0, 1, timedelta(seconds=10))
