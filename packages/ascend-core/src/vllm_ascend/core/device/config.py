"""The device this process runs on, resolved at run time (nothing is baked into the wheel)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from vllm_ascend.core.device.detection import DeviceMode, detect
from vllm_ascend.core.device.family import AscendDeviceType, device_type_from_runtime_soc
from vllm_ascend.core.device.profile import REFERENCE_PROFILE, HardwareProfile, get_hardware_profile


class DeviceConfigError(RuntimeError):
    """No usable device, or a device that does not match what was expected or installed."""


@dataclass(frozen=True)
class DeviceConfig:
    """The resolved device: mode, family (None on the reference device), runtime SOC name and profile."""

    mode: DeviceMode
    device_type: AscendDeviceType | None
    soc_name: str | None
    profile: HardwareProfile

    @property
    def is_reference(self) -> bool:
        return self.mode is DeviceMode.REFERENCE

    @property
    def torch_device(self) -> str:
        return self.profile.torch_device

    def describe(self) -> str:
        """``"the reference device"`` or ``"A3 (Ascend910_9392)"``."""
        if self.device_type is None:
            return "the reference device"
        return f"{self.device_type.value} ({self.soc_name})"


def runtime_soc_name() -> str:
    """The SOC name of NPU 0 as torch_npu reports it (imports torch_npu)."""
    import torch
    import torch_npu  # noqa: F401  (registers torch.npu)

    return str(torch.npu.get_device_name(0))


def resolve_device_config(mode: DeviceMode, soc_name: str | None = None) -> DeviceConfig:
    """Build the config for ``mode``; on NPU ``soc_name`` defaults to :func:`runtime_soc_name`."""
    if mode is DeviceMode.REFERENCE:
        return DeviceConfig(mode, None, None, REFERENCE_PROFILE)
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
        from vllm_ascend.core.device.overlay import active_overlays

        if AscendDeviceType._310P not in active_overlays():
            raise DeviceConfigError(
                "this is an Atlas 310P device: install the vllm-ascend-310p distribution "
                "(pip install 'vllm-ascend[310p]') for its profile and adaptor"
            )
    return config


def clear_device_caches() -> None:
    """Forget the cached device config and adaptor (tests, or after changing VLLM_ASCEND_DEVICE)."""
    from vllm_ascend.core.device.adaptor import get_device_adaptor

    get_device_config.cache_clear()
    get_device_adaptor.cache_clear()
