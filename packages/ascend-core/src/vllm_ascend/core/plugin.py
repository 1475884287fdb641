"""vLLM entry points: ``vllm.platform_plugins`` and ``vllm.general_plugins``.

Both are called by vLLM in every process; they import nothing heavy.
"""

from __future__ import annotations

#: The platform class vLLM loads for each device mode (``vllm_ascend.core.device.detection.DeviceMode``).
PLATFORM_QUALNAMES = {
    "npu": "vllm_ascend.core.platform.NPUPlatform",
    "reference": "vllm_ascend.core.platform.ReferencePlatform",
}


def register() -> str | None:
    """Return ``NPUPlatform`` when an NPU is usable, ``ReferencePlatform`` when the reference device is asked for.

    With neither, return ``None`` so vLLM behaves as if the plugin were absent. vLLM swallows
    exceptions from platform plugins, so configuration errors are also logged here.
    """
    from vllm_ascend.core.device.detection import detect

    try:
        detection = detect()
    except ValueError as exc:
        from vllm_ascend.core.logger import init_logger

        init_logger(__name__).error("vLLM Ascend platform not activated: %s", exc)
        raise
    if detection.active:
        return PLATFORM_QUALNAMES[detection.mode.value]
    if detection.explicitly_requested:
        from vllm_ascend.core.logger import init_logger

        init_logger(__name__).error("vLLM Ascend platform not activated: %s", detection.reason)
        raise RuntimeError(detection.reason)
    return None


def load_extensions() -> None:
    """Load every installed sibling extension (once per process).

    When the platform is active, also hand the siblings' model loaders, quantization methods, KV connectors /
    offloading specs and weight-transfer engines to vLLM so that ``--load-format <name>`` / ``--quantization <name>`` work, let vLLM's speculative config
    accept ``suffix`` without arctic-inference when a sibling serves it, let vLLM select Model Runner V2 where
    the family's worker serves it (``serve_model_runner_v2_in_vllm``), let the API server answer a malformed
    LoRA adapter with 400 (``answer_invalid_lora_adapters_with_400``), and install the device
    adaptor's runtime shims: processes that build no worker (the engine core under the ``mp``
    executor) still call ``torch.accelerator`` at shutdown. Otherwise vLLM sees nothing of the plugin.
    """
    from vllm_ascend.core.device.detection import detect
    from vllm_ascend.core.extensions import load_extensions as _load

    _load()
    try:
        active = detect().active
    except ValueError:
        return
    if active:
        from vllm_ascend.core.device.config import get_device_adaptor
        from vllm_ascend.core.vllm_bridge import (
            accept_served_spec_methods_in_vllm,
            answer_invalid_lora_adapters_with_400,
            register_kv_connectors_with_vllm,
            register_model_loaders_with_vllm,
            register_offload_specs_with_vllm,
            register_quant_methods_with_vllm,
            register_weight_transfer_engines_with_vllm,
            serve_model_runner_v2_in_vllm,
        )

        register_model_loaders_with_vllm()
        register_quant_methods_with_vllm()
        register_kv_connectors_with_vllm()
        register_offload_specs_with_vllm()
        register_weight_transfer_engines_with_vllm()
        accept_served_spec_methods_in_vllm()
        serve_model_runner_v2_in_vllm()
        answer_invalid_lora_adapters_with_400()
        get_device_adaptor().install_runtime_shims()
