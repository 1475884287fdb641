"""The 310P overlay: registered through core's extension loading, it replaces core's 310P profile and adaptor."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from vllm_ascend.ascend310p.overlay import OVERLAY, PROFILE_310P, Ascend310PDeviceAdaptor
from vllm_ascend.core.device import config as device_config
from vllm_ascend.core.device.adaptor import OPS
from vllm_ascend.core.device.adaptor.base import DeviceOpError
from vllm_ascend.core.device.config import (
    check_ascend_device_type,
    clear_device_caches,
    get_device_adaptor,
    get_hardware_profile,
    resolve_device_config,
)
from vllm_ascend.core.device.detection import DeviceMode
from vllm_ascend.core.device.family import AscendDeviceType
from vllm_ascend.core.device.overlay import active_overlays
from vllm_ascend.core.device.profile import BUILTIN_PROFILES, HardwareCapability
from vllm_ascend.kernels.device.npu import A2A3DeviceAdaptor
from vllm_ascend.kernels.device.reference import ReferenceDeviceAdaptor


@pytest.fixture
def on_310p():
    clear_device_caches()
    patch = pytest.MonkeyPatch()
    config = resolve_device_config(DeviceMode.NPU, soc_name="Ascend310P3")
    patch.setattr(device_config, "get_device_config", lambda: config)
    yield config
    patch.undo()
    clear_device_caches()


def test_extension_registers_the_overlay_for_310p():
    assert active_overlays()[AscendDeviceType._310P] is OVERLAY
    assert get_hardware_profile("Ascend310P3") is PROFILE_310P
    assert get_hardware_profile("A2") is BUILTIN_PROFILES[AscendDeviceType.A2]


def test_profile_claims_only_what_is_served():
    p = PROFILE_310P
    assert p.name == "Atlas 310P" and p.device_type is AscendDeviceType._310P
    assert not p.supports("bf16") and p.supported_dtypes == ("float16",)
    assert p.capabilities == frozenset({HardwareCapability.SPARSE_WEIGHT})
    assert not p.supports(HardwareCapability.GRAPH_CAPTURE) and not p.supports("triton")
    assert p.eager_only and p.quant_weight_format == "NZ" and p.worker == "310p"
    base = BUILTIN_PROFILES[AscendDeviceType._310P]
    assert (
        p.with_changes(
            name=base.name,
            capabilities=base.capabilities,
            supported_dtypes=base.supported_dtypes,
            worker="default",
        )
        == base
    )


def test_310p_device_gets_the_overlay_adaptor(on_310p):
    assert check_ascend_device_type("310P").profile is PROFILE_310P
    adaptor = get_device_adaptor()
    assert type(adaptor) is Ascend310PDeviceAdaptor and adaptor.family == "310P"


def test_ops_without_a_310p_kernel_run_the_reference_code():
    borrowed = {
        op for op in OPS if getattr(Ascend310PDeviceAdaptor, op) is getattr(ReferenceDeviceAdaptor, op)
    }
    inherited_torch = {op for op in A2A3DeviceAdaptor.TORCH_OPS if op not in Ascend310PDeviceAdaptor.__dict__}
    assert borrowed | inherited_torch == set(Ascend310PDeviceAdaptor.TORCH_OPS)
    torch.manual_seed(0)
    logits, x = torch.randn(5, 8), torch.randn(5, 16)

    def run(a):
        weights, ids = a.moe_gating_top_k(logits, 2)
        return [weights, ids, *a.moe_init_routing(x, ids, 8), *a.dynamic_quant(x), a.swiglu(x)]

    adaptor = Ascend310PDeviceAdaptor()
    for got, want in zip(run(adaptor), run(ReferenceDeviceAdaptor()), strict=True):
        assert torch.equal(got, want)
    assert adaptor.call_counts == {
        "moe_gating_top_k": 1,
        "moe_init_routing": 1,
        "dynamic_quant": 1,
        "swiglu": 1,
    }


def test_reshape_and_cache_runs_in_torch_and_skips_padding():
    key_cache, value_cache = torch.zeros(2, 4, 1, 8), torch.zeros(2, 4, 1, 8)
    key, value = torch.randn(3, 1, 8), torch.randn(3, 1, 8)
    Ascend310PDeviceAdaptor().reshape_and_cache(key, value, key_cache, value_cache, torch.tensor([5, -1, 0]))
    assert torch.equal(key_cache[1, 1], key[0]) and torch.equal(value_cache[0, 0], value[2])
    assert int((key_cache != 0).any(-1).sum()) == 2


def test_attention_is_float16_only():
    adaptor = Ascend310PDeviceAdaptor()
    kc = vc = torch.zeros(2, 4, 1, 8, dtype=torch.bfloat16)
    with pytest.raises(
        DeviceOpError, match=r"Atlas 310P attention runs in float16 only, got query dtype torch\.bfloat16"
    ):
        adaptor.fused_infer_attention(
            torch.zeros(1, 1, 8, dtype=torch.bfloat16),
            kc,
            vc,
            torch.zeros(1, 2, dtype=torch.int32),
            torch.tensor([0, 1]),
            torch.tensor([1]),
            1.0,
        )
    with pytest.raises(
        DeviceOpError, match="the NPU device adaptor needs torch_npu"
    ):  # fp16 goes to the NPU kernel
        adaptor.fused_infer_attention(
            torch.zeros(1, 1, 8).half(),
            kc.half(),
            vc.half(),
            torch.zeros(1, 2, dtype=torch.int32),
            torch.tensor([0, 1]),
            torch.tensor([1]),
            1.0,
        )


def test_disabling_the_extension_falls_back_to_cores_baseline():
    env = {**os.environ, "VLLM_ASCEND_DISABLED_EXTENSIONS": "ascend310p"}
    code = "from vllm_ascend.core.device.config import get_hardware_profile; print(get_hardware_profile('310P').name)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "Atlas 310P (baseline; install vllm-ascend-310p)"
