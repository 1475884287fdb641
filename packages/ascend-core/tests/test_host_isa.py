"""The reference device loads the vLLM kernel library vLLM's CPU platform picks for the host's ISA.

The selection is checked as if the host had only AVX2, AVX-512 without BF16, AVX-512 + BF16, or were an
Arm CPU (torch's feature probes patched, nothing loaded); the real load is checked in a fresh interpreter
on this host (and the whole demo on an emulated AVX2-only CPU by ``tests/e2e/test_runner_demo.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from vllm.platforms import CpuArchEnum, Platform
from vllm.platforms.cpu import CpuPlatform

from vllm_ascend.core.device import host
from vllm_ascend.core.platform import ReferencePlatform


@pytest.mark.parametrize(
    ("arch", "avx512", "bf16", "expected"),
    [
        (CpuArchEnum.X86, False, False, "vllm._C_AVX2"),
        (CpuArchEnum.X86, True, False, "vllm._C_AVX512"),
        (CpuArchEnum.X86, True, True, "vllm._C"),
        (CpuArchEnum.ARM, False, False, "vllm._C"),
    ],
)
def test_reference_device_picks_vllms_library_for_the_host_isa(monkeypatch, arch, avx512, bf16, expected):
    monkeypatch.setattr(Platform, "get_cpu_architecture", classmethod(lambda cls: arch))
    monkeypatch.setattr(torch.cpu, "_is_avx512_supported", lambda: avx512)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: bf16)
    vllm_choice = host.selected_kernel_library(CpuPlatform.import_kernels)
    assert vllm_choice == expected
    assert host.selected_kernel_library(ReferencePlatform.import_kernels) == vllm_choice
    # the probe loaded nothing and left no finder behind
    assert not any(isinstance(f, host._KernelImportProbe) for f in sys.meta_path)


def test_base_platform_would_load_the_avx512_bf16_build_on_an_avx2_host(monkeypatch):
    """Why the override exists: vLLM's base ``Platform.import_kernels`` ignores the host's ISA."""
    monkeypatch.setattr(Platform, "get_cpu_architecture", classmethod(lambda cls: CpuArchEnum.X86))
    monkeypatch.setattr(torch.cpu, "_is_avx512_supported", lambda: False)
    assert host.selected_kernel_library(Platform.import_kernels) == "vllm._C"
    assert host.selected_kernel_library(ReferencePlatform.import_kernels) == "vllm._C_AVX2"


_LOAD = textwrap.dedent(
    """
    import json
    from vllm.platforms.cpu import CpuPlatform
    from vllm_ascend.core.device import host
    from vllm_ascend.core.platform import ReferencePlatform

    choice = host.selected_kernel_library(CpuPlatform.import_kernels)
    before = host.loaded_kernel_libraries()
    ReferencePlatform.import_kernels()
    print(json.dumps({"choice": choice, "file": host.kernel_library_file(choice), "before": before,
                      "after": host.loaded_kernel_libraries(), "isa": host.host_isa().describe()}))
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_reference_platform_loads_vllms_choice_on_this_host():
    """In a fresh interpreter nothing of vLLM's is mapped; after the reference platform's import exactly the
    file of vLLM's choice for this host is."""
    proc = subprocess.run(
        [sys.executable, "-c", _LOAD],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "VLLM_ASCEND_DEVICE": "off"},
    )
    assert proc.returncode == 0, f"status {proc.returncode}\n{proc.stderr[-3000:]}"
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["choice"] == host.selected_kernel_library(CpuPlatform.import_kernels)
    assert result["file"].endswith(".so") and result["choice"].rsplit(".", 1)[-1] in result["file"]
    assert result["before"] == []
    assert result["after"] == [result["file"]]
    assert result["isa"] == host.host_isa().describe()


def test_selection_is_found_when_the_library_is_loaded_already():
    """Python answers an import of a loaded module from ``sys.modules``; the probe still sees the request."""
    choice = host.selected_kernel_library(CpuPlatform.import_kernels)
    ReferencePlatform.import_kernels()
    loaded = {name: module for name, module in sys.modules.items() if name.startswith("vllm._C")}
    assert host.selected_kernel_library(ReferencePlatform.import_kernels) == choice
    assert {name: module for name, module in sys.modules.items() if name.startswith("vllm._C")} == loaded
