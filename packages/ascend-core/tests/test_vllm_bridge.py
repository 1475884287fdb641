"""What siblings put in QUANT_METHODS / MODEL_LOADERS becomes a vLLM quantization method / load format."""

from __future__ import annotations

import pytest

from vllm_ascend.core.registry import MODEL_LOADERS, QUANT_METHODS, registering_as
from vllm_ascend.core.vllm_bridge import (
    reachability,
    register_model_loaders_with_vllm,
    register_quant_methods_with_vllm,
)


@pytest.fixture
def vllm_quantization():
    """vLLM's quantization registry, restored after the test."""
    from vllm.model_executor.layers import quantization

    methods = list(quantization.QUANTIZATION_METHODS)
    custom = dict(quantization._CUSTOMIZED_METHOD_TO_QUANT_CONFIG)
    yield quantization
    quantization.QUANTIZATION_METHODS[:] = methods
    quantization._CUSTOMIZED_METHOD_TO_QUANT_CONFIG.clear()
    quantization._CUSTOMIZED_METHOD_TO_QUANT_CONFIG.update(custom)


def test_quant_methods_become_vllm_quantization_methods(vllm_quantization):
    from vllm.model_executor.layers.quantization.base_config import QuantizationConfig

    class ProbeQuantConfig(QuantizationConfig):
        """Stands for a sibling's config class; only registered, never instantiated."""

    with registering_as("vllm-ascend-probe") as journal:
        QUANT_METHODS.register("ascend-probe", ProbeQuantConfig)
        try:
            assert "ascend-probe" not in vllm_quantization.QUANTIZATION_METHODS
            # "ascend" is always a vLLM name: without the quant sibling it refuses with an install hint.
            expected = (
                ["ascend-probe"]
                if "ascend" in vllm_quantization.QUANTIZATION_METHODS
                else ["ascend-probe", "ascend"]
            )
            assert sorted(register_quant_methods_with_vllm()) == sorted(expected)
            assert vllm_quantization.get_quantization_config("ascend-probe") is ProbeQuantConfig
            assert register_quant_methods_with_vllm() == []  # idempotent
            assert reachability("vllm-ascend-probe") == [
                {
                    "registry": "quant_methods",
                    "name": "ascend-probe",
                    "reached": True,
                    "via": "vLLM quantization 'ascend-probe'",
                }
            ]
        finally:
            for registry, name in journal:
                registry.unregister(name)


def test_a_loader_that_fails_to_import_is_skipped_with_a_warning(caplog):
    with registering_as("vllm-ascend-probe") as journal:
        MODEL_LOADERS.register("broken-probe", "vllm_ascend.no_such_module:Loader")
        try:
            assert "broken-probe" not in register_model_loaders_with_vllm()
            assert "Skipping model loader 'broken-probe' from vllm-ascend-probe" in caplog.text
        finally:
            for registry, name in journal:
                registry.unregister(name)


def test_without_the_quant_sibling_ascend_is_refused_with_an_install_hint(vllm_quantization, core_only):
    """vLLM knows the name ``ascend`` either way; without its sibling every use names the distribution."""
    from vllm_ascend.core.config import ConfigError
    from vllm_ascend.core.quantization import verify_quantization

    core_only(QUANT_METHODS)
    if "ascend" in vllm_quantization.QUANTIZATION_METHODS:
        vllm_quantization.QUANTIZATION_METHODS.remove("ascend")
        vllm_quantization._CUSTOMIZED_METHOD_TO_QUANT_CONFIG.pop("ascend", None)
    assert "ascend" in register_quant_methods_with_vllm()
    placeholder = vllm_quantization.get_quantization_config("ascend")
    hint = r"quantization='ascend' needs the `vllm-ascend-quant` distribution.*pip install 'vllm-ascend\[quant\]'"
    with pytest.raises(ConfigError, match=hint):
        placeholder.from_config({})
    with pytest.raises(ConfigError, match=hint):
        verify_quantization("ascend")
    assert placeholder.override_quantization_method({"quant_method": "gptq"}, None) is None


def test_methods_with_cuda_kernels_are_refused_by_name():
    from vllm_ascend.core.config import ConfigError
    from vllm_ascend.core.quantization import verify_quantization

    with pytest.raises(
        ConfigError, match=r"quantization='awq' is not supported by vllm-ascend.*supported: 'ascend'"
    ):
        verify_quantization("awq")


def test_a_served_suffix_method_needs_no_arctic_inference(monkeypatch, core_only):
    """vLLM refuses ``method="suffix"`` without arctic-inference; once a sibling serves it the check passes."""
    from vllm.config import speculative

    from vllm_ascend.core.registry import SPEC_DECODE_METHODS
    from vllm_ascend.core.vllm_bridge import accept_served_spec_methods_in_vllm

    monkeypatch.setattr(speculative, "has_arctic_inference", lambda: False)
    core_only(SPEC_DECODE_METHODS)
    assert accept_served_spec_methods_in_vllm() is False
    assert speculative.has_arctic_inference() is False
    with registering_as("vllm-ascend-probe") as journal:
        SPEC_DECODE_METHODS.register("suffix", "vllm_ascend.no_such_module:Proposer")
        try:
            assert accept_served_spec_methods_in_vllm() is True
            assert speculative.has_arctic_inference() is True
        finally:
            for registry, name in journal:
                registry.unregister(name)


class _ServesV2:
    @classmethod
    def serves_model_runner_v2(cls) -> bool:
        return True


class _ServesV1Only:
    @classmethod
    def serves_model_runner_v2(cls) -> bool:
        return False


@pytest.mark.parametrize("triton", [True, False], ids=["with-triton", "without-triton"])
@pytest.mark.parametrize(
    ("worker", "answer"),
    [(_ServesV2, True), (_ServesV1Only, False), (object, False)],
    ids=["v2", "v1", "none"],
)
def test_vllms_triton_check_is_answered_by_the_familys_worker(monkeypatch, triton, worker, answer):
    """V2's kernels run their torch references where the profile has no Triton, so the answer is the worker's
    (``serves_model_runner_v2()``, false when it has none) whatever the profile's ``TRITON`` capability."""
    from vllm.config import vllm as vllm_config_module

    from vllm_ascend.core.device import config as device_config
    from vllm_ascend.core.device.family import AscendDeviceType
    from vllm_ascend.core.device.profile import BUILTIN_PROFILES, HardwareCapability
    from vllm_ascend.core.registry import WORKERS
    from vllm_ascend.core.vllm_bridge import serve_model_runner_v2_in_vllm

    base = BUILTIN_PROFILES[AscendDeviceType.A2]
    capabilities = base.capabilities | {HardwareCapability.TRITON}
    if not triton:
        capabilities = capabilities - {HardwareCapability.TRITON}
    profile = base.with_changes(capabilities=capabilities, worker="probe-runner-selection")
    monkeypatch.setattr(device_config, "get_current_hardware_profile", lambda: profile)
    monkeypatch.setattr(vllm_config_module, "HAS_TRITON", not answer)
    with registering_as("vllm-ascend-probe") as journal:
        WORKERS.register("probe-runner-selection", worker)
        try:
            assert serve_model_runner_v2_in_vllm() is answer
            assert vllm_config_module.HAS_TRITON is answer
        finally:
            for registry, name in journal:
                registry.unregister(name)


class ProbeTrainerEngine:
    """Stands for a sibling's trainer-side engine."""


class ProbeEngine:
    """Stands for a sibling's worker-side engine; only registered, never built."""

    trainer_engine = ProbeTrainerEngine


def test_weight_transfer_engines_reach_both_vllm_factories(monkeypatch):
    """Each name reaches vLLM's worker factory (lazily, by path) and its trainer factory (the engine's
    ``trainer_engine``); registering again adds nothing."""
    from vllm.distributed.weight_transfer.factory import (
        WeightTransferEngineFactory,
        WeightTransferTrainerFactory,
    )

    from vllm_ascend.core.registry import WEIGHT_TRANSFER_ENGINES
    from vllm_ascend.core.vllm_bridge import register_weight_transfer_engines_with_vllm

    monkeypatch.setattr(WeightTransferEngineFactory, "_registry", dict(WeightTransferEngineFactory._registry))
    monkeypatch.setattr(
        WeightTransferTrainerFactory, "_registry", dict(WeightTransferTrainerFactory._registry)
    )
    with registering_as("vllm-ascend-probe") as journal:
        WEIGHT_TRANSFER_ENGINES.register("probe-backend", f"{__name__}:ProbeEngine")
        try:
            assert "probe-backend" in register_weight_transfer_engines_with_vllm()
            assert register_weight_transfer_engines_with_vllm() == []
            assert WeightTransferEngineFactory._registry["probe-backend"]() is ProbeEngine
            assert WeightTransferTrainerFactory._registry["probe-backend"]() is ProbeTrainerEngine
            (row,) = reachability("vllm-ascend-probe")
            assert row["registry"] == "weight_transfer_engines" and row["reached"] is False
            assert row["via"] == "vLLM weight_transfer_config.backend 'probe-backend' on no family"
        finally:
            for registry, name in journal:
                registry.unregister(name)
