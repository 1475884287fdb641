"""Device adaptors: the op interface (:mod:`.base`), the plain-PyTorch reference and one per NPU family.

The adaptor of the running device comes from :func:`vllm_ascend.core.device.config.get_device_adaptor`.
"""

from __future__ import annotations

from vllm_ascend.core.device.adaptor.base import OPS, BaseDeviceAdaptor, DeviceOpError

__all__ = ["OPS", "BaseDeviceAdaptor", "DeviceOpError"]
