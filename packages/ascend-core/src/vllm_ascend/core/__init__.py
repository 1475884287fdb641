"""vllm_ascend.core: the platform, configuration, device profiles and extension registries.

Public names are exported lazily so that ``import vllm_ascend.core`` stays cheap (vLLM calls
into this package during platform detection in every process).
"""

from __future__ import annotations

from vllm_ascend.core._version import __version__
from vllm_ascend.core.lazy import lazy_exports

_LAZY: dict[str, str] = {
    "ExtensionDescriptor": "vllm_ascend.core.extensions",
    "ExtensionRecord": "vllm_ascend.core.extensions",
    "ExtensionStatus": "vllm_ascend.core.extensions",
    "load_extensions": "vllm_ascend.core.extensions",
    "Registry": "vllm_ascend.core.registry",
    "RegistryError": "vllm_ascend.core.registry",
    "NPUPlatform": "vllm_ascend.core.platform",
    "AscendConfig": "vllm_ascend.core.config",
    "init_ascend_config": "vllm_ascend.core.config",
    "get_ascend_config": "vllm_ascend.core.config",
    "clear_ascend_config": "vllm_ascend.core.config",
    "AscendDeviceType": "vllm_ascend.core.device.family",
    "HardwareProfile": "vllm_ascend.core.device.profile",
    "get_hardware_profile": "vllm_ascend.core.device.profile",
    "get_current_hardware_profile": "vllm_ascend.core.device.profile",
    "DeviceConfig": "vllm_ascend.core.device.config",
    "get_device_config": "vllm_ascend.core.device.config",
    "get_device_adaptor": "vllm_ascend.core.device.adaptor",
}

__all__ = ["__version__", *sorted(_LAZY)]


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
