"""``vllm-ascend doctor`` shows the active hardware profile and device adaptor."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from vllm_ascend.core import doctor
from vllm_ascend.core.device import config as device_config
from vllm_ascend.core.device import overlay
from vllm_ascend.core.device.config import clear_device_caches, resolve_device_config
from vllm_ascend.core.device.detection import DeviceMode

REFERENCE_ADAPTOR = "vllm_ascend.core.device.adaptor.reference.ReferenceDeviceAdaptor"


def run_doctor(*args: str, device: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "VLLM_ASCEND_DEVICE": device}
    return subprocess.run(
        [sys.executable, "-m", "vllm_ascend.core.cli", "doctor", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def test_json_report_has_the_reference_profile_and_adaptor():
    proc = run_doctor("--json", device="reference")
    device = json.loads(proc.stdout)["device"]
    assert proc.returncode == 0, device["problem"]
    assert device["adaptor"] == {"class": REFERENCE_ADAPTOR, "family": "reference"}
    profile = device["profile"]
    assert profile["name"] == "reference (torch cpu)" and profile["eager_only"] is True
    assert (profile["torch_device"], profile["dist_backend"], profile["attention_backend"]) == (
        "cpu",
        "gloo",
        "reference",
    )
    assert device["soc"] is None


def test_table_shows_profile_and_adaptor_lines():
    proc = run_doctor(device="reference")
    assert proc.returncode == 0, proc.stdout
    lines = proc.stdout.splitlines()
    profile = next(line for line in lines if line.startswith("profile "))
    assert profile.startswith(
        "profile           reference (torch cpu): attention=reference, quant=reference, weights=nd"
    )
    assert profile.endswith("dist=gloo, block=128, eager-only")
    assert f"adaptor           {REFERENCE_ADAPTOR} (reference)" in lines


def test_inactive_platform_reports_no_profile():
    proc = run_doctor("--json", device="off")
    device = json.loads(proc.stdout)["device"]
    assert (device["profile"], device["adaptor"]) == (None, None)
    assert not any(line.startswith("profile ") for line in run_doctor(device="off").stdout.splitlines())


@pytest.fixture
def npu():
    """Pretend the runtime reported a SOC; the patch is undone before the caches are cleared."""
    patch = pytest.MonkeyPatch()

    def pretend(soc: str) -> None:
        config = resolve_device_config(DeviceMode.NPU, soc_name=soc)
        patch.setattr(device_config, "get_device_config", lambda: config)

    clear_device_caches()
    yield pretend
    patch.undo()
    clear_device_caches()


def test_npu_details_name_the_family_profile_and_adaptor(npu):
    npu("Ascend910_9392")
    details, problem = doctor._device_details(DeviceMode.NPU)
    assert problem == ""
    assert details["soc"] == "Ascend910_9392" and details["profile"]["name"] == "Atlas A3"
    assert details["adaptor"] == {
        "class": "vllm_ascend.core.device.adaptor.npu.A2A3DeviceAdaptor",
        "family": "A2/A3",
    }
    lines = doctor._profile_lines({"platform": None, "problem": "", **details})
    assert lines[0].startswith("profile           Atlas A3 on Ascend910_9392: attention=fia, quant=aclnn_int")
    assert (
        lines[1]
        == "capabilities      bf16, fused_infer_attention, fused_moe_gating, graph_capture, int4, mc2, triton"
    )


def test_npu_310p_without_overlay_is_a_problem(npu, monkeypatch):
    monkeypatch.setattr(overlay, "active_overlays", dict)
    npu("Ascend310P3")
    details, problem = doctor._device_details(DeviceMode.NPU)
    assert details["profile"] is None
    assert problem.startswith(
        "device npu: DeviceConfigError: this is an Atlas 310P device: install the vllm-ascend-310p"
    )
