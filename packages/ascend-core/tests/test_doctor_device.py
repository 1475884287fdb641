"""``vllm-ascend doctor`` shows the active hardware profile and device adaptor."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from vllm_ascend.core import doctor
from vllm_ascend.core.device import config as device_config
from vllm_ascend.core.device.config import clear_device_caches, resolve_device_config
from vllm_ascend.core.device.detection import DeviceMode

REFERENCE_ADAPTOR = "vllm_ascend.kernels.device.reference.ReferenceDeviceAdaptor"


def run_doctor(*args: str, device: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "VLLM_ASCEND_DEVICE": device}
    return subprocess.run(
        [sys.executable, "-m", "vllm_ascend.core.cli", "doctor", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


@pytest.fixture(scope="module")
def reference_report() -> dict:
    """One ``doctor --json`` run on the reference device (it imports vLLM: slow), shared by the tests."""
    proc = run_doctor("--json", device="reference")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


def test_json_report_has_the_reference_profile_and_adaptor(reference_report):
    device = reference_report["device"]
    assert (device["mode"], device["problem"]) == ("reference", "")
    assert device["platform"] == "vllm_ascend.core.platform.ReferencePlatform"
    assert device["adaptor"] == {"class": REFERENCE_ADAPTOR, "family": "reference"}
    profile = device["profile"]
    assert profile["name"] == "reference (torch cpu)" and profile["eager_only"] is False
    assert (profile["torch_device"], profile["dist_backend"], profile["cpu_binding"]) == (
        "cpu",
        "gloo",
        "average",
    )
    assert "graph_capture" in profile["capabilities"] and profile["eager_by_default"] is True
    assert device["soc"] is None


def test_active_platform_reports_what_each_extension_registered(reference_report):
    for ext in reference_report["extensions"]:
        registered = ext["registered"]
        assert isinstance(registered, list), ext
        for row in registered:
            assert set(row) == {"registry", "name", "reached", "via"}, row
            assert isinstance(row["reached"], bool) and row["via"], row
        if ext["status"] != "loaded":
            assert registered == [], ext  # a failed extension's registrations were rolled back


def test_table_shows_profile_and_adaptor_lines(reference_report):
    lines = doctor.render(reference_report).splitlines()
    profile = next(line for line in lines if line.startswith("profile "))
    assert profile == (
        "profile           reference (torch cpu) (VLLM_ASCEND_REFERENCE_FAMILY: emulating A2): "
        "cpu-binding=average, dist=gloo, "
        "dtypes=float16/bfloat16/float32, block=128, eager unless compilation/graphs are asked for"
    )
    assert "capabilities      bf16, graph_capture, int4, mc2, triton" in lines
    assert f"adaptor           {REFERENCE_ADAPTOR} (reference)" in lines
    assert "platform          vllm_ascend.core.platform.ReferencePlatform" in lines
    assert "worker            default" in lines
    assert "kernels           Triton where it can run, else the torch references" in lines


def test_extension_detail_shows_reachability():
    record = {"reason": "", "provides": ["model_loaders"]}
    assert doctor._detail({**record, "registered": None}) == "provides model_loaders (platform inactive)"
    assert doctor._detail({**record, "registered": []}) == "registers nothing"
    rows = [
        {"registry": "model_loaders", "name": "x", "reached": True, "via": "vLLM load_format 'x'"},
        {"registry": "quant_methods", "name": "q", "reached": False, "via": "vLLM quantization 'q'"},
    ]
    assert doctor._detail({**record, "registered": rows}) == (
        "model_loaders:x -> vLLM load_format 'x' (reached); "
        "quant_methods:q -> vLLM quantization 'q' (NOT REACHED)"
    )
    assert doctor._detail({**record, "reason": "import failed", "registered": None}) == "import failed"


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
        "class": "vllm_ascend.kernels.device.npu.A2A3DeviceAdaptor",
        "family": "A2/A3",
    }
    lines = doctor._profile_lines({"platform": None, "problem": "", **details})
    assert lines[0] == (
        "profile           Atlas A3 on Ascend910_9392: cpu-binding=topo_affinity, dist=hccl, "
        "dtypes=float16/bfloat16/float32, block=128"
    )
    assert (
        lines[1]
        == "capabilities      bf16, fused_infer_attention, fused_moe_gating, graph_capture, int4, mc2, triton"
    )


def test_npu_310p_without_overlay_is_a_problem(npu, monkeypatch):
    monkeypatch.setattr(device_config, "active_overlays", dict)  # as if vllm-ascend-310p were absent
    npu("Ascend310P3")
    details, problem = doctor._device_details(DeviceMode.NPU)
    assert details["profile"] is None
    assert problem.startswith(
        "device npu: DeviceConfigError: this is an Atlas 310P device: install the vllm-ascend-310p"
    )
