"""The device this process runs on, resolved at run time (nothing is baked into the wheel).

The top of the device package: it combines detection, the built-in profiles, the overlays that
siblings register and the adaptor classes into the current device's profile and adaptor.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from vllm_ascend.core.device.adaptor.base import BaseDeviceAdaptor, DeviceOpError
from vllm_ascend.core.device.detection import DeviceMode, detect
from vllm_ascend.core.device.family import AscendDeviceType, device_type_from_runtime_soc
from vllm_ascend.core.device.overlay import active_overlays
from vllm_ascend.core.device.profile import (
    BUILTIN_PROFILES,
    REFERENCE_PROFILE,
    DeviceAdaptorFamily,
    HardwareProfile,
    emulating_profile,
)

#: ``VLLM_ASCEND_REFERENCE_FAMILY`` values and the family each names.
REFERENCE_FAMILIES: dict[str, AscendDeviceType] = {
    "a2": AscendDeviceType.A2,
    "a3": AscendDeviceType.A3,
    "a5": AscendDeviceType.A5,
    "310p": AscendDeviceType._310P,
}
_OVERLAY_DISTS = {AscendDeviceType._310P: "vllm-ascend[310p]"}


class DeviceConfigError(RuntimeError):
    """No usable device, or a device that does not match what was expected or installed."""


@dataclass(frozen=True)
class DeviceConfig:
    """The resolved device: mode, family (None on the reference device), runtime SOC name and profile.

    ``emulates``: the family the reference device emulates (``VLLM_ASCEND_REFERENCE_FAMILY``); None on an NPU.
    """

    mode: DeviceMode
    device_type: AscendDeviceType | None
    soc_name: str | None
    profile: HardwareProfile
    emulates: AscendDeviceType | None = None

    @property
    def torch_device(self) -> str:
        return self.profile.torch_device

    def describe(self) -> str:
        """``"the reference device (emulating 310P)"`` or ``"A3 (Ascend910_9392)"``."""
        if self.device_type is None:
            family = self.emulates.value if self.emulates is not None else AscendDeviceType.A2.value
            return f"the reference device (emulating {family})"
        return f"{self.device_type.value} ({self.soc_name})"


def runtime_soc_name() -> str:
    """The SOC name of NPU 0 as torch_npu reports it (imports torch_npu)."""
    import torch
    import torch_npu  # noqa: F401  (registers torch.npu)

    return str(torch.npu.get_device_name(0))


def reference_family() -> AscendDeviceType:
    """The family named by ``VLLM_ASCEND_REFERENCE_FAMILY`` (``a2`` by default)."""
    from vllm_ascend.core import envs

    return REFERENCE_FAMILIES[envs.VLLM_ASCEND_REFERENCE_FAMILY]


def reference_profile(family: AscendDeviceType) -> HardwareProfile:
    """The reference device's profile when it emulates ``family``: A2 is the reference profile itself;
    another family's is :func:`emulating_profile` of that family's (overlay's) profile. A family whose
    profile comes from an overlay that is not installed is refused naming the distribution."""
    if family is AscendDeviceType.A2:
        return REFERENCE_PROFILE
    if family in _OVERLAY_DISTS and family not in active_overlays():
        raise DeviceConfigError(
            f"VLLM_ASCEND_REFERENCE_FAMILY={family.value.lower()} needs the {family.value} overlay: install "
            f"{_OVERLAY_DISTS[family]} (pip install '{_OVERLAY_DISTS[family]}')"
        )
    return emulating_profile(get_hardware_profile(family))


def resolve_device_config(mode: DeviceMode, soc_name: str | None = None) -> DeviceConfig:
    """Build the config for ``mode``; on NPU ``soc_name`` defaults to :func:`runtime_soc_name`."""
    if mode is DeviceMode.REFERENCE:
        family = reference_family()
        return DeviceConfig(mode, None, None, reference_profile(family), emulates=family)
    if mode is DeviceMode.NPU:
        name = soc_name if soc_name is not None else runtime_soc_name()
        family = device_type_from_runtime_soc(name)
        return DeviceConfig(mode, family, name, get_hardware_profile(family))
    raise DeviceConfigError(f"no device config for mode {mode.value!r}")


@functools.cache
def get_device_config() -> DeviceConfig:
    """The current device (cached per process; :func:`clear_device_caches` forgets it)."""
    detection = detect()
    if not detection.active:
        raise DeviceConfigError(f"the Ascend platform is not active: {detection.reason}")
    return resolve_device_config(detection.mode)


def check_ascend_device_type(expected: AscendDeviceType | str | None = None) -> DeviceConfig:
    """Check the running device against ``expected`` (a family or SOC string) and that its family is served.

    Raises :class:`DeviceConfigError` on a mismatch, or when the family needs a sibling overlay that
    is not installed (310P needs ``vllm-ascend-310p``).
    """
    config = get_device_config()
    if expected is not None:
        wants_reference = isinstance(expected, str) and expected.strip().lower() == "reference"
        want = None if wants_reference else AscendDeviceType.parse(expected)
        if config.device_type is not want:
            wanted = "the reference device" if want is None else f"the {want.value} family"
            raise DeviceConfigError(f"expected {wanted}, running on {config.describe()}")
    if config.device_type is AscendDeviceType._310P:
        if AscendDeviceType._310P not in active_overlays():
            raise DeviceConfigError(
                "this is an Atlas 310P device: install the vllm-ascend-310p distribution "
                "(pip install 'vllm-ascend[310p]') for its profile and adaptor"
            )
    return config


def get_hardware_profile(device_type: AscendDeviceType | str) -> HardwareProfile:
    """The profile of a family (an installed overlay's, when one is registered for it).

    ``device_type`` may be an :class:`AscendDeviceType`, its value (``"A3"``), a SOC string, or
    ``"reference"`` for the reference device.
    """
    if isinstance(device_type, str) and device_type.strip().lower() == "reference":
        return REFERENCE_PROFILE
    family = AscendDeviceType.parse(device_type)
    overlay = active_overlays().get(family)
    return overlay.profile if overlay is not None else BUILTIN_PROFILES[family]


def get_current_hardware_profile() -> HardwareProfile:
    """The profile of the device this process runs on (see :func:`get_device_config`)."""
    return get_device_config().profile


def adaptor_class_for(family: DeviceAdaptorFamily) -> type[BaseDeviceAdaptor]:
    """The adaptor class registered for an adaptor family in ``DEVICE_ADAPTORS`` (ascend-kernels registers
    the reference, A2/A3 and A5 ones; 310P's comes from its overlay)."""
    from vllm_ascend.core.extensions import load_extensions
    from vllm_ascend.core.registry import DEVICE_ADAPTORS

    load_extensions()
    if family.value in DEVICE_ADAPTORS:
        cls: type[BaseDeviceAdaptor] = DEVICE_ADAPTORS.get(family.value)
        return cls
    if family is DeviceAdaptorFamily._310P:
        dist = "the vllm-ascend-310p distribution (pip install 'vllm-ascend[310p]')"
    else:
        dist = "the vllm-ascend-kernels distribution, home of the device ops (pip install vllm-ascend)"
    raise DeviceOpError(f"no device adaptor for the {family.value} family is installed: install {dist}")


@functools.cache
def get_device_adaptor() -> BaseDeviceAdaptor:
    """The adaptor of the current device (an overlay's when one covers the family), one per process."""
    config = get_device_config()
    if config.emulates is not None:  # the reference device: the emulated family's overlay may bring its own
        overlay = active_overlays().get(config.emulates)
        cls = overlay.reference_adaptor if overlay is not None else None
        return (cls or adaptor_class_for(DeviceAdaptorFamily.REFERENCE))()
    overlay = active_overlays().get(config.device_type) if config.device_type is not None else None
    cls = overlay.adaptor if overlay is not None else adaptor_class_for(config.profile.adaptor_family)
    return cls()


def clear_device_caches() -> None:
    """Forget the cached device config and adaptor (tests, or after changing VLLM_ASCEND_DEVICE or
    VLLM_ASCEND_REFERENCE_FAMILY)."""
    get_device_config.cache_clear()
    get_device_adaptor.cache_clear()
