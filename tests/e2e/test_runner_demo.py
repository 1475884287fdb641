"""``vllm-ascend demo`` (README's first command) serves the tiny model and reports a match with HF, on this
host and on an emulated x86-64 CPU with AVX2 but no AVX-512 (``qemu-x86_64 -cpu max``: QEMU's TCG has no
AVX-512), where vLLM's AVX-512 kernel library would die with SIGILL."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from vllm.platforms.cpu import CpuPlatform

from vllm_ascend.core.device.host import host_isa, kernel_library_file, selected_kernel_library


def test_demo_command_matches_hf(tmp_path):
    env = {**os.environ, "VLLM_ASCEND_CACHE_DIR": str(tmp_path)}
    argv = [
        sys.executable,
        "-m",
        "vllm_ascend.core.cli",
        "demo",
        "--max-tokens",
        "6",
        "--cache-dir",
        str(tmp_path),
    ]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, check=False)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr[-3000:]
    assert out.count("[MATCH]") == 4 and "MISMATCH" not in out
    assert "platform  ReferencePlatform (Ascend reference device (cpu))" in out
    assert "worker    NPUWorker / runner NPUModelRunner" in out
    assert "fused_infer_attention=" in out and "token ids identical to HF transformers" in out
    assert any(p.name == "models" for p in tmp_path.iterdir())  # the model was built in the given cache dir
    library = Path(kernel_library_file(selected_kernel_library(CpuPlatform.import_kernels)) or "").name
    assert f"host      {host_isa().describe()}; vLLM kernels {library}\n" in out


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="emulates an x86-64 CPU")
def test_demo_on_an_emulated_avx2_only_cpu(tmp_path):
    qemu = shutil.which("qemu-x86_64")
    if qemu is None:
        pytest.fail("qemu-x86_64 is missing: install Debian's qemu-user (.ci/run does)")
    from vllm_ascend.runner.demo_model import build_tiny_model, qwen3_spec

    build_tiny_model(qwen3_spec(), tmp_path / "models")  # natively: the emulated run only serves it
    argv = [qemu, "-cpu", "max", sys.executable, "-m", "vllm_ascend.runner.demo", "--max-tokens", "2"]
    proc = subprocess.run(
        [*argv, "--cache-dir", str(tmp_path)], capture_output=True, text=True, timeout=1500, check=False
    )
    out = proc.stdout
    assert proc.returncode == 0, f"status {proc.returncode}\n{out[-2000:]}{proc.stderr[-3000:]}"
    assert "host      x86_64: AVX2, no AVX-512 (torch kernels: AVX2); vLLM kernels _C_AVX2.abi3.so\n" in out
    assert out.count("[MATCH]") == 4 and "token ids identical to HF transformers" in out
