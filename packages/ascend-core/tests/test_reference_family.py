"""``VLLM_ASCEND_REFERENCE_FAMILY``: which family's profile (and overlay adaptor) the reference device emulates."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from vllm_ascend.core import envs
from vllm_ascend.core.device.config import (
    clear_device_caches,
    get_device_adaptor,
    get_device_config,
    get_hardware_profile,
)
from vllm_ascend.core.device.family import AscendDeviceType
from vllm_ascend.core.device.profile import (
    REFERENCE_PROFILE,
    HardwareCapability,
    ProfileError,
    emulating_profile,
)
from vllm_ascend.kernels.device.reference import ReferenceDeviceAdaptor


@pytest.fixture(autouse=True)
def reference(monkeypatch):
    monkeypatch.setenv("VLLM_ASCEND_DEVICE", "reference")
    clear_device_caches()
    yield
    clear_device_caches()


def test_default_is_a2_and_keeps_the_reference_profile(monkeypatch):
    monkeypatch.delenv("VLLM_ASCEND_REFERENCE_FAMILY", raising=False)
    config = get_device_config()
    assert config.emulates is AscendDeviceType.A2 and config.profile is REFERENCE_PROFILE
    assert config.describe() == "the reference device (emulating A2)"
    assert type(get_device_adaptor()) is ReferenceDeviceAdaptor


@pytest.mark.parametrize(("value", "family"), [("A3", AscendDeviceType.A3), (" a5 ", AscendDeviceType.A5)])
def test_a3_and_a5_take_their_family_profile_on_the_cpu(monkeypatch, value, family):
    monkeypatch.setenv("VLLM_ASCEND_REFERENCE_FAMILY", value)
    config = get_device_config()
    profile = config.profile
    family_profile = get_hardware_profile(family)
    assert config.emulates is family and config.device_type is None
    assert profile.device_type is family and profile.name == f"reference (torch cpu) as {family_profile.name}"
    assert (profile.torch_device, profile.dist_backend) == ("cpu", "gloo")
    assert profile.supported_dtypes == family_profile.supported_dtypes
    assert profile.quant_weight_format == family_profile.quant_weight_format and profile.worker == "default"
    # What the reference cannot run is not claimed: no fused NPU-only ops, no FP8/MXFP schemes.
    assert profile.capabilities == family_profile.capabilities - {
        HardwareCapability.FUSED_INFER_ATTENTION,
        HardwareCapability.FUSED_MOE_GATING,
        HardwareCapability.FP8,
        HardwareCapability.MXFP,
    }
    assert type(get_device_adaptor()) is ReferenceDeviceAdaptor


def test_an_unknown_family_is_refused_naming_the_allowed_values(monkeypatch):
    monkeypatch.setenv("VLLM_ASCEND_REFERENCE_FAMILY", "910c")
    with pytest.raises(
        envs.EnvError,
        match=r"VLLM_ASCEND_REFERENCE_FAMILY='910c' is invalid; allowed values: a2, a3, a5, 310p",
    ):
        get_device_config()


def test_emulating_a_profile_keeps_its_eager_rule_and_worker():
    p310 = get_hardware_profile("310P")
    emulated = emulating_profile(p310.with_changes(worker="custom"))
    assert (
        emulated.eager_only
        and emulated.worker == "custom"
        and emulated.supported_dtypes == p310.supported_dtypes
    )
    with pytest.raises(ProfileError, match=r"HardwareProfile.worker='' must be a non-empty WORKERS name"):
        REFERENCE_PROFILE.with_changes(worker="")


def test_310p_without_its_overlay_names_the_distribution():
    env = {
        **os.environ,
        "VLLM_ASCEND_DEVICE": "reference",
        "VLLM_ASCEND_REFERENCE_FAMILY": "310P",
        "VLLM_ASCEND_DISABLED_EXTENSIONS": "ascend310p",
    }
    code = (
        "from vllm_ascend.core.device.config import get_device_config\n"
        "try:\n    get_device_config()\nexcept Exception as exc:\n    print(type(exc).__name__, exc)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == (
        "DeviceConfigError VLLM_ASCEND_REFERENCE_FAMILY=310p needs the 310P overlay: install "
        "vllm-ascend[310p] (pip install 'vllm-ascend[310p]')"
    )


def test_310p_refusal_reaches_the_doctor():
    env = {
        **os.environ,
        "VLLM_ASCEND_DEVICE": "reference",
        "VLLM_ASCEND_REFERENCE_FAMILY": "310p",
        "VLLM_ASCEND_DISABLED_EXTENSIONS": "ascend310p",
    }
    code = "from vllm_ascend.core.doctor import collect, exit_code; r = collect(); print(exit_code(r), r['device']['problem'])"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.strip().splitlines()[-1]
    assert out.startswith("1 device reference: DeviceConfigError: VLLM_ASCEND_REFERENCE_FAMILY=310p needs")
    assert "vllm-ascend[310p]" in out
