"""Device adaptors: one per family, plus the plain-PyTorch reference."""

from __future__ import annotations

import functools

from vllm_ascend.core.device.adaptor.base import OPS, BaseDeviceAdaptor, DeviceOpError
from vllm_ascend.core.device.profile import DeviceAdaptorFamily


def adaptor_class_for(family: DeviceAdaptorFamily) -> type[BaseDeviceAdaptor]:
    """Core's adaptor class for an adaptor family (310P has none in core: it comes from its overlay)."""
    if family is DeviceAdaptorFamily.REFERENCE:
        from vllm_ascend.core.device.adaptor.reference import ReferenceDeviceAdaptor

        return ReferenceDeviceAdaptor
    if family is DeviceAdaptorFamily.A2A3:
        from vllm_ascend.core.device.adaptor.npu import A2A3DeviceAdaptor

        return A2A3DeviceAdaptor
    if family is DeviceAdaptorFamily.A5:
        from vllm_ascend.core.device.adaptor.a5 import A5DeviceAdaptor

        return A5DeviceAdaptor
    raise DeviceOpError(
        f"no core adaptor for the {family.value} family: install the vllm-ascend-310p distribution "
        "(pip install 'vllm-ascend[310p]')"
    )


@functools.cache
def get_device_adaptor() -> BaseDeviceAdaptor:
    """The adaptor of the current device (an overlay's when one covers the family), one per process."""
    from vllm_ascend.core.device.config import get_device_config
    from vllm_ascend.core.device.overlay import active_overlays

    config = get_device_config()
    overlay = active_overlays().get(config.device_type) if config.device_type is not None else None
    cls = overlay.adaptor if overlay is not None else adaptor_class_for(config.profile.adaptor_family)
    return cls()


__all__ = ["OPS", "BaseDeviceAdaptor", "DeviceOpError", "adaptor_class_for", "get_device_adaptor"]
