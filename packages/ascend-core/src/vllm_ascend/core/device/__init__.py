"""Device detection (import-free), families, profiles, overlays and adaptors.

Names are exported lazily: ``detection`` runs inside vLLM's platform detection and must not
pull in torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vllm_ascend.core.lazy import lazy_exports

if TYPE_CHECKING:
    from vllm_ascend.core.device.adaptor.base import BaseDeviceAdaptor as BaseDeviceAdaptor
    from vllm_ascend.core.device.config import DeviceConfig as DeviceConfig
    from vllm_ascend.core.device.config import DeviceConfigError as DeviceConfigError
    from vllm_ascend.core.device.config import check_ascend_device_type as check_ascend_device_type
    from vllm_ascend.core.device.config import clear_device_caches as clear_device_caches
    from vllm_ascend.core.device.config import get_current_hardware_profile as get_current_hardware_profile
    from vllm_ascend.core.device.config import get_device_adaptor as get_device_adaptor
    from vllm_ascend.core.device.config import get_device_config as get_device_config
    from vllm_ascend.core.device.config import get_hardware_profile as get_hardware_profile
    from vllm_ascend.core.device.family import AscendDeviceType as AscendDeviceType
    from vllm_ascend.core.device.family import UnknownSocError as UnknownSocError
    from vllm_ascend.core.device.family import device_type_from_runtime_soc as device_type_from_runtime_soc
    from vllm_ascend.core.device.family import device_type_from_soc_version as device_type_from_soc_version
    from vllm_ascend.core.device.overlay import DeviceOverlay as DeviceOverlay
    from vllm_ascend.core.device.profile import REFERENCE_PROFILE as REFERENCE_PROFILE
    from vllm_ascend.core.device.profile import HardwareCapability as HardwareCapability
    from vllm_ascend.core.device.profile import HardwareProfile as HardwareProfile

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
