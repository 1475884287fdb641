"""vllm_ascend.core: the platforms, configuration, device profiles/adaptors and extension registries.

Public names are exported lazily so that ``import vllm_ascend.core`` stays cheap (vLLM calls
into this package during platform detection in every process); the ``TYPE_CHECKING`` imports give
type checkers the real signatures.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vllm_ascend.core._version import __version__
from vllm_ascend.core.lazy import lazy_exports

if TYPE_CHECKING:
    from vllm_ascend.core.config import AscendConfig as AscendConfig
    from vllm_ascend.core.config import ConfigError as ConfigError
    from vllm_ascend.core.config import clear_ascend_config as clear_ascend_config
    from vllm_ascend.core.config import get_ascend_config as get_ascend_config
    from vllm_ascend.core.config import get_section as get_section
    from vllm_ascend.core.config import init_ascend_config as init_ascend_config
    from vllm_ascend.core.device.config import DeviceConfig as DeviceConfig
    from vllm_ascend.core.device.config import get_current_hardware_profile as get_current_hardware_profile
    from vllm_ascend.core.device.config import get_device_adaptor as get_device_adaptor
    from vllm_ascend.core.device.config import get_device_config as get_device_config
    from vllm_ascend.core.device.config import get_hardware_profile as get_hardware_profile
    from vllm_ascend.core.device.family import AscendDeviceType as AscendDeviceType
    from vllm_ascend.core.device.profile import HardwareProfile as HardwareProfile
    from vllm_ascend.core.extensions import ExtensionDescriptor as ExtensionDescriptor
    from vllm_ascend.core.extensions import ExtensionRecord as ExtensionRecord
    from vllm_ascend.core.extensions import ExtensionStatus as ExtensionStatus
    from vllm_ascend.core.extensions import load_extensions as load_extensions
    from vllm_ascend.core.platform import AscendPlatform as AscendPlatform
    from vllm_ascend.core.platform import NPUPlatform as NPUPlatform
    from vllm_ascend.core.platform import ReferencePlatform as ReferencePlatform
    from vllm_ascend.core.registry import Registry as Registry
    from vllm_ascend.core.registry import RegistryError as RegistryError

_LAZY: dict[str, str] = {
    "ExtensionDescriptor": "vllm_ascend.core.extensions",
    "ExtensionRecord": "vllm_ascend.core.extensions",
    "ExtensionStatus": "vllm_ascend.core.extensions",
    "load_extensions": "vllm_ascend.core.extensions",
    "Registry": "vllm_ascend.core.registry",
    "RegistryError": "vllm_ascend.core.registry",
    "AscendPlatform": "vllm_ascend.core.platform",
    "NPUPlatform": "vllm_ascend.core.platform",
    "ReferencePlatform": "vllm_ascend.core.platform",
    "AscendConfig": "vllm_ascend.core.config",
    "ConfigError": "vllm_ascend.core.config",
    "init_ascend_config": "vllm_ascend.core.config",
    "get_ascend_config": "vllm_ascend.core.config",
    "get_section": "vllm_ascend.core.config",
    "clear_ascend_config": "vllm_ascend.core.config",
    "AscendDeviceType": "vllm_ascend.core.device.family",
    "HardwareProfile": "vllm_ascend.core.device.profile",
    "get_hardware_profile": "vllm_ascend.core.device.config",
    "get_current_hardware_profile": "vllm_ascend.core.device.config",
    "DeviceConfig": "vllm_ascend.core.device.config",
    "get_device_config": "vllm_ascend.core.device.config",
    "get_device_adaptor": "vllm_ascend.core.device.config",
}

__all__ = ["__version__", *sorted(_LAZY)]


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
