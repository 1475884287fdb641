"""Device overlays registered in core's registry replace a family's profile and adaptor."""

from __future__ import annotations

import pytest

from vllm_ascend.core.device import config as device_config
from vllm_ascend.core.device.config import (
    clear_device_caches,
    get_device_adaptor,
    get_hardware_profile,
    resolve_device_config,
)
from vllm_ascend.core.device.detection import DeviceMode
from vllm_ascend.core.device.family import AscendDeviceType
from vllm_ascend.core.device.overlay import DeviceOverlay, OverlayError, active_overlays
from vllm_ascend.core.device.profile import A5_PROFILE, CPUBindingMode
from vllm_ascend.core.registry import DEVICE_OVERLAYS, registering_as
from vllm_ascend.kernels.device.a5 import A5DeviceAdaptor


class TunedA5Adaptor(A5DeviceAdaptor):
    family = "A5 (tuned)"


TUNED_A5 = DeviceOverlay(
    family=AscendDeviceType.A5,
    profile=A5_PROFILE.with_changes(
        name="Ascend 950 (tuned)", cpu_binding=CPUBindingMode.AVERAGE, preferred_block_size=64
    ),
    adaptor=TunedA5Adaptor,
)


@pytest.fixture
def registered():
    names: list[str] = []

    def register(name: str, value: object) -> None:
        with registering_as("vllm-ascend-testdist"):
            DEVICE_OVERLAYS.register(name, value)
        names.append(name)

    clear_device_caches()
    yield register
    for name in names:
        DEVICE_OVERLAYS.unregister(name)
    clear_device_caches()


def test_overlay_replaces_profile_and_adaptor(registered, monkeypatch):
    assert get_hardware_profile("A5").cpu_binding is CPUBindingMode.CPU_POOLS_950
    registered("test_tuned_a5", TUNED_A5)
    assert active_overlays()[AscendDeviceType.A5] is TUNED_A5
    assert get_hardware_profile("A5").name == "Ascend 950 (tuned)"
    config = resolve_device_config(DeviceMode.NPU, soc_name="Ascend950PR_9599")
    assert config.profile.cpu_binding is CPUBindingMode.AVERAGE
    assert config.profile.preferred_block_size == 64
    monkeypatch.setattr(device_config, "get_device_config", lambda: config)
    adaptor = get_device_adaptor()
    assert type(adaptor) is TunedA5Adaptor and adaptor.family == "A5 (tuned)"
    assert get_hardware_profile("A2").name == "Atlas A2"  # other families untouched


def test_lazy_path_overlay_is_resolved(registered):
    registered("test_lazy_a5", f"{__name__}:TUNED_A5")
    assert get_hardware_profile(AscendDeviceType.A5) is TUNED_A5.profile


def test_two_overlays_for_one_family_are_an_error(registered):
    registered("test_a5_one", TUNED_A5)
    registered("test_a5_two", DeviceOverlay(AscendDeviceType.A5, A5_PROFILE, A5DeviceAdaptor))
    with pytest.raises(
        OverlayError, match="device overlays 'test_a5_one' and 'test_a5_two' both claim family A5"
    ):
        active_overlays()


def test_registered_object_must_be_an_overlay(registered):
    registered("test_not_overlay", {"family": "A5"})
    with pytest.raises(
        OverlayError,
        match=r"device overlay 'test_not_overlay' \(registered by vllm-ascend-testdist\) is a dict, expected vllm_ascend.core.device.overlay.DeviceOverlay",
    ):
        active_overlays()


def test_overlay_fields_are_validated():
    with pytest.raises(
        OverlayError, match=r"DeviceOverlay\.family='A5' is invalid; allowed values: A2, A3, A5, 310P"
    ):
        DeviceOverlay("A5", A5_PROFILE, A5DeviceAdaptor)
    with pytest.raises(
        OverlayError, match=r"DeviceOverlay for A3 carries a profile for <AscendDeviceType\.A5"
    ):
        DeviceOverlay(AscendDeviceType.A3, A5_PROFILE, A5DeviceAdaptor)
    with pytest.raises(
        OverlayError, match=r"DeviceOverlay\.adaptor must be a BaseDeviceAdaptor subclass, got <class 'dict'>"
    ):
        DeviceOverlay(AscendDeviceType.A5, A5_PROFILE, dict)
