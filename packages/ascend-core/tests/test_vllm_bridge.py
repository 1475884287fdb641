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
            assert register_quant_methods_with_vllm() == ["ascend-probe"]
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
