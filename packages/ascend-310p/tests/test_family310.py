"""The reference device emulating 310P: the profile every reader sees, the doctor's account of it, and the
kernels' refusal of Triton there."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from vllm_ascend.ascend310p.overlay import PROFILE_310P, Ascend310PReferenceAdaptor
from vllm_ascend.core.device.config import (
    clear_device_caches,
    get_current_hardware_profile,
    get_device_adaptor,
    get_device_config,
)
from vllm_ascend.core.device.family import AscendDeviceType
from vllm_ascend.kernels._backend import KernelBackendError, use_triton


@pytest.fixture
def family_310p(monkeypatch):
    monkeypatch.setenv("VLLM_ASCEND_DEVICE", "reference")
    monkeypatch.setenv("VLLM_ASCEND_REFERENCE_FAMILY", "310P")
    clear_device_caches()
    yield
    clear_device_caches()


def test_every_reader_gets_the_310p_profile_on_the_cpu(family_310p):
    config = get_device_config()
    profile = get_current_hardware_profile()
    assert config.emulates is AscendDeviceType._310P
    assert config.describe() == "the reference device (emulating 310P)"
    assert profile.name == "reference (torch cpu) as Atlas 310P"
    assert profile.device_type is AscendDeviceType._310P and profile.torch_device == "cpu"
    assert profile.supported_dtypes == ("float16",) and profile.eager_only
    assert profile.quant_weight_format == "NZ" and profile.worker == "310p"
    assert profile.capabilities == PROFILE_310P.capabilities
    assert type(get_device_adaptor()) is Ascend310PReferenceAdaptor


def test_kernels_run_torch_and_refuse_triton_on_310p(family_310p, monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setenv("VLLM_ASCEND_KERNEL_BACKEND", "auto")
    assert use_triton(cpu) is False
    monkeypatch.setenv("VLLM_ASCEND_KERNEL_BACKEND", "triton")
    with pytest.raises(
        KernelBackendError,
        match=r"VLLM_ASCEND_KERNEL_BACKEND=triton but Triton cannot run here: reference \(torch cpu\) as "
        r"Atlas 310P has no Triton",
    ):
        use_triton(cpu)


def test_doctor_shows_what_serving_on_310p_does():
    env = {**os.environ, "VLLM_ASCEND_DEVICE": "reference", "VLLM_ASCEND_REFERENCE_FAMILY": "310p"}
    env.pop("VLLM_ASCEND_DISABLED_EXTENSIONS", None)
    code = "from vllm_ascend.core.doctor import collect, render, exit_code; r = collect(); print(render(r)); print(exit_code(r))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[-1] == "0"
    assert (
        "profile           reference (torch cpu) as Atlas 310P (VLLM_ASCEND_REFERENCE_FAMILY: emulating 310P): "
        "cpu-binding=average, dist=gloo, dtypes=float16, block=128, eager-only"
    ) in lines
    assert "capabilities      sparse_weight" in lines
    assert (
        "adaptor           vllm_ascend.ascend310p.overlay.Ascend310PReferenceAdaptor (310P-reference)"
        in lines
    )
    assert "worker            310p" in lines
    assert (
        "graphs            none: eager only (cudagraph_mode / compilation other than NONE are refused)"
        in lines
    )
    assert "kernels           torch implementations only (no Triton on this family)" in lines
    assert "quant weights     NZ layout, sparse/compressed int8 (W8A8S/W8A8SC)" in lines
    row = next(line for line in lines if line.startswith("ascend310p "))
    assert "workers:310p -> vLLM parallel_config.worker_cls on 310P (reached)" in row
    assert "device_overlays:310p" in row


def test_platform_names_the_310p_backend_and_refuses_mla(family_310p):
    from vllm.v1.attention.selector import AttentionSelectorConfig

    from vllm_ascend.core.platform import ReferencePlatform
    from vllm_ascend.runner.attention.support import AttentionConfigError

    selector = AttentionSelectorConfig(head_size=64, dtype=torch.float16, kv_cache_dtype=None, block_size=16)
    assert ReferencePlatform.get_attn_backend_cls(None, selector) == (
        "vllm_ascend.ascend310p.attention.backend.AscendAttentionBackend310"
    )
    with pytest.raises(AttentionConfigError, match=r"use_mla=True .* is not supported on Atlas 310P"):
        ReferencePlatform.get_attn_backend_cls(None, selector._replace(use_mla=True))
    with pytest.raises(AttentionConfigError, match=r"use_sparse=True .* is not supported on Atlas 310P"):
        ReferencePlatform.get_attn_backend_cls(None, selector._replace(use_mla=True, use_sparse=True))
