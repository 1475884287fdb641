"""Device family as seen by config checks and MoE communication selection.

The running device is looked up lazily, so config and forward-context logic also work with no
device (the reference device has no family) and callers may pass a family explicitly instead.
"""

from __future__ import annotations

from vllm_ascend.core.device.family import AscendDeviceType


def current_family() -> AscendDeviceType | None:
    """The running device's family; None on the reference device or where no device is active."""
    from vllm_ascend.core.device.config import DeviceConfigError, get_device_config

    try:
        return get_device_config().device_type
    except DeviceConfigError:
        return None
