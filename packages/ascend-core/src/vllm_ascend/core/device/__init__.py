"""Device detection (import-free), families, profiles, overlays and adaptors.

Names are exported lazily: ``detection`` runs inside vLLM's platform detection and must not
pull in torch.
"""

from __future__ import annotations

from vllm_ascend.core.lazy import lazy_exports

_LAZY: dict[str, str] = {
    "AscendDeviceType": "vllm_ascend.core.device.family",
    "UnknownSocError": "vllm_ascend.core.device.family",
    "device_type_from_soc_version": "vllm_ascend.core.device.family",
    "device_type_from_runtime_soc": "vllm_ascend.core.device.family",
    "HardwareCapability": "vllm_ascend.core.device.profile",
    "HardwareProfile": "vllm_ascend.core.device.profile",
    "REFERENCE_PROFILE": "vllm_ascend.core.device.profile",
    "get_hardware_profile": "vllm_ascend.core.device.config",
    "get_current_hardware_profile": "vllm_ascend.core.device.config",
    "DeviceConfig": "vllm_ascend.core.device.config",
    "DeviceConfigError": "vllm_ascend.core.device.config",
    "get_device_config": "vllm_ascend.core.device.config",
    "check_ascend_device_type": "vllm_ascend.core.device.config",
    "clear_device_caches": "vllm_ascend.core.device.config",
    "DeviceOverlay": "vllm_ascend.core.device.overlay",
    "BaseDeviceAdaptor": "vllm_ascend.core.device.adaptor.base",
    "get_device_adaptor": "vllm_ascend.core.device.config",
}

__all__ = sorted(_LAZY)


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
