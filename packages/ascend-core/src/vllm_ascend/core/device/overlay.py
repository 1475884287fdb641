"""Device overlays: a sibling distribution replaces one family's profile and adaptor.

A sibling registers ``"module:OVERLAY"`` under any name in
:data:`vllm_ascend.core.registry.DEVICE_OVERLAYS` from its extension's ``register()``; the object
must be a :class:`DeviceOverlay`. Two overlays for the same family are an error.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_ascend.core.device.adaptor.base import BaseDeviceAdaptor
from vllm_ascend.core.device.family import AscendDeviceType
from vllm_ascend.core.device.profile import HardwareProfile


class OverlayError(ValueError):
    """A malformed overlay, or two overlays claiming one family."""


@dataclass(frozen=True)
class DeviceOverlay:
    """What a sibling provides for one family: its profile and its adaptor class."""

    family: AscendDeviceType
    profile: HardwareProfile
    adaptor: type[BaseDeviceAdaptor]
    description: str = ""
    #: The adaptor of the reference device emulating this family (``VLLM_ASCEND_REFERENCE_FAMILY``): torch
    #: on the cpu with the family's op semantics and limits; None keeps core's reference adaptor.
    reference_adaptor: type[BaseDeviceAdaptor] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.family, AscendDeviceType):
            allowed = ", ".join(m.value for m in AscendDeviceType)
            raise OverlayError(f"DeviceOverlay.family={self.family!r} is invalid; allowed values: {allowed}")
        if not isinstance(self.profile, HardwareProfile):
            raise OverlayError(
                f"DeviceOverlay.profile must be a HardwareProfile, got {type(self.profile).__name__}"
            )
        if self.profile.device_type is not self.family:
            raise OverlayError(
                f"DeviceOverlay for {self.family.value} carries a profile for {self.profile.device_type!r}"
            )
        for attr in ("adaptor", "reference_adaptor"):
            value = getattr(self, attr)
            if attr == "reference_adaptor" and value is None:
                continue
            if not (isinstance(value, type) and issubclass(value, BaseDeviceAdaptor)):
                raise OverlayError(
                    f"DeviceOverlay.{attr} must be a BaseDeviceAdaptor subclass, got {value!r}"
                )


def active_overlays() -> dict[AscendDeviceType, DeviceOverlay]:
    """Family → overlay for every overlay the loaded extensions registered."""
    from vllm_ascend.core.extensions import load_extensions
    from vllm_ascend.core.registry import DEVICE_OVERLAYS

    load_extensions()
    found: dict[AscendDeviceType, tuple[str, DeviceOverlay]] = {}
    for name in DEVICE_OVERLAYS.names():
        overlay = DEVICE_OVERLAYS.get(name)
        if not isinstance(overlay, DeviceOverlay):
            raise OverlayError(
                f"device overlay {name!r} (registered by {DEVICE_OVERLAYS.owner(name)}) is a "
                f"{type(overlay).__name__}, expected vllm_ascend.core.device.overlay.DeviceOverlay"
            )
        if overlay.family in found:
            other = found[overlay.family][0]
            raise OverlayError(
                f"device overlays {other!r} and {name!r} both claim family {overlay.family.value}"
            )
        found[overlay.family] = (name, overlay)
    return {family: overlay for family, (_, overlay) in found.items()}
