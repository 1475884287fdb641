"""Hardware profiles, the run-time device config and core's adaptor selection."""

from __future__ import annotations

import types

import pytest
import torch

from vllm_ascend.core.device import config as device_config
from vllm_ascend.core.device.adaptor.base import DeviceOpError
from vllm_ascend.core.device.config import (
    DeviceConfigError,
    check_ascend_device_type,
    clear_device_caches,
    get_current_hardware_profile,
    get_device_adaptor,
    get_device_config,
    get_hardware_profile,
    resolve_device_config,
)
from vllm_ascend.core.device.detection import DeviceMode
from vllm_ascend.core.device.family import AscendDeviceType
from vllm_ascend.core.device.profile import (
    A2_PROFILE,
    A5_PROFILE,
    BUILTIN_PROFILES,
    P310_BASE_PROFILE,
    REFERENCE_PROFILE,
    CPUBindingMode,
    HardwareCapability,
    ProfileError,
    emulating_profile,
)
from vllm_ascend.kernels.device.a5 import A5DeviceAdaptor
from vllm_ascend.kernels.device.npu import A2A3DeviceAdaptor
from vllm_ascend.kernels.device.reference import ReferenceDeviceAdaptor


@pytest.fixture(autouse=True)
def fresh_caches():
    clear_device_caches()
    yield
    clear_device_caches()


@pytest.fixture
def reference(monkeypatch):
    monkeypatch.setenv("VLLM_ASCEND_DEVICE", "reference")


def on_npu(monkeypatch, soc: str) -> None:
    """Pretend the runtime reported ``soc`` (no torch_npu needed)."""
    config = resolve_device_config(DeviceMode.NPU, soc_name=soc)
    monkeypatch.setattr(device_config, "get_device_config", lambda: config)


def test_supports_capabilities_by_member_and_name():
    assert A2_PROFILE.supports(HardwareCapability.BF16) and A2_PROFILE.supports("bf16")
    assert not A2_PROFILE.supports("fp8") and A5_PROFILE.supports("fp8") and A5_PROFILE.supports("mxfp")
    assert get_hardware_profile("A3").supports("mc2")
    with pytest.raises(
        ProfileError, match=r"unknown capability 'warp'; allowed: bf16, fp8, mxfp, int4, triton"
    ):
        A2_PROFILE.supports("warp")


def test_profiles_differ_along_the_orthogonal_dimensions():
    a2, a5 = get_hardware_profile(AscendDeviceType.A2), get_hardware_profile("Ascend950PR_9599")
    assert a2.as_dict()["adaptor_family"] == "a2a3" and a5.as_dict()["adaptor_family"] == "a5"
    assert a2.as_dict()["cpu_binding"] == "topo_affinity" and a5.as_dict()["cpu_binding"] == "cpu_pools_950"
    assert a5.supports("mxfp") and not a2.supports("mxfp")
    assert get_hardware_profile("Ascend910_9392").name == "Atlas A3"
    assert a2.as_dict()["supported_dtypes"] == ["float16", "bfloat16", "float32"]


def test_reference_profile_carries_what_the_platform_reads():
    p = get_hardware_profile("reference")
    assert p is REFERENCE_PROFILE
    assert (
        p.torch_device, p.dist_backend, p.eager_only, p.eager_by_default, p.async_scheduling, p.cpu_binding
    ) == ("cpu", "gloo", False, True, True, CPUBindingMode.AVERAGE)  # fmt: skip
    assert p.preferred_block_size % p.block_size_multiple == 0
    assert p.device_type is None and p.supports("graph_capture")
    assert p.supports("triton")  # V2's kernels run there (their torch references)


def test_profile_fields_are_validated():
    with pytest.raises(
        ProfileError,
        match=r"HardwareProfile.cpu_binding='average' is invalid; "
        r"allowed values: none, average, topo_affinity, cpu_pools_950",
    ):
        A2_PROFILE.with_changes(cpu_binding="average")
    with pytest.raises(ProfileError, match=r"HardwareProfile.capabilities has non-capabilities \['bf16'\]"):
        A2_PROFILE.with_changes(capabilities=frozenset({"bf16"}))
    with pytest.raises(
        ProfileError, match="preferred_block_size=24 must be a positive multiple of block_size_multiple=16"
    ):
        A2_PROFILE.with_changes(preferred_block_size=24)
    with pytest.raises(ProfileError, match="the BF16 capability and supported_dtypes disagree"):
        A2_PROFILE.with_changes(supported_dtypes=("float16",))


def test_reference_device_config_profile_and_adaptor(reference):
    config = get_device_config()
    assert config.mode.value == "reference" and config.device_type is None and config.torch_device == "cpu"
    assert get_current_hardware_profile() is REFERENCE_PROFILE
    adaptor = get_device_adaptor()
    assert type(adaptor) is ReferenceDeviceAdaptor and get_device_adaptor() is adaptor  # cached
    assert check_ascend_device_type("reference") is config
    with pytest.raises(DeviceConfigError, match="expected the A2 family, running on the reference device"):
        check_ascend_device_type("A2")


def test_inactive_platform_has_no_device_config(monkeypatch):
    monkeypatch.setenv("VLLM_ASCEND_DEVICE", "off")
    with pytest.raises(DeviceConfigError, match="the Ascend platform is not active: VLLM_ASCEND_DEVICE=off"):
        get_device_config()


@pytest.mark.parametrize(
    ("soc", "family", "adaptor_cls"),
    [
        ("Ascend910B2", "A2", A2A3DeviceAdaptor),
        ("Ascend910_9382", "A3", A2A3DeviceAdaptor),
        ("Ascend950PR_9599", "A5", A5DeviceAdaptor),
    ],
)
def test_npu_family_resolved_at_run_time_picks_its_adaptor(monkeypatch, soc, family, adaptor_cls):
    on_npu(monkeypatch, soc)
    config = check_ascend_device_type(family)
    assert config.device_type.value == family and config.soc_name == soc
    assert type(get_device_adaptor()) is adaptor_cls
    with pytest.raises(DeviceConfigError, match=f"expected the 310P family, running on {family} \\({soc}\\)"):
        check_ascend_device_type("310P")


def test_310p_without_its_overlay_names_the_missing_distribution(monkeypatch):
    monkeypatch.setattr(device_config, "active_overlays", dict)  # as if vllm-ascend-310p were absent
    on_npu(monkeypatch, "Ascend310P3")
    assert get_hardware_profile("310P") is P310_BASE_PROFILE  # core's baseline
    assert not P310_BASE_PROFILE.supports("bf16") and "bfloat16" not in P310_BASE_PROFILE.supported_dtypes
    with pytest.raises(
        DeviceConfigError,
        match=r"install the vllm-ascend-310p distribution \(pip install 'vllm-ascend\[310p\]'\)",
    ):
        check_ascend_device_type()
    with pytest.raises(
        DeviceOpError,
        match="no device adaptor for the 310p family is installed: install the vllm-ascend-310p",
    ):
        get_device_adaptor()


def test_npu_adaptor_without_torch_npu_is_a_clear_error():
    with pytest.raises(
        DeviceOpError, match=r"the NPU device adaptor needs torch_npu .*VLLM_ASCEND_DEVICE=reference"
    ):
        A2A3DeviceAdaptor().rms_norm(torch.ones(2, 4), torch.ones(4), 1e-6)


@pytest.mark.parametrize(
    ("name", "module"),
    [
        ("AscendDeviceType", "family"),
        ("HardwareProfile", "profile"),
        ("get_hardware_profile", "config"),
        ("get_current_hardware_profile", "config"),
        ("DeviceConfig", "config"),
        ("get_device_config", "config"),
        ("get_device_adaptor", "config"),
    ],
)
def test_lazy_exports_from_vllm_ascend_core(name, module):
    import importlib

    import vllm_ascend.core as core

    assert name in dir(core)
    assert getattr(core, name) is getattr(importlib.import_module(f"vllm_ascend.core.device.{module}"), name)


def test_expecting_reference_on_an_npu_is_an_error(monkeypatch):
    on_npu(monkeypatch, "Ascend910B4")
    with pytest.raises(
        DeviceConfigError, match=r"expected the reference device, running on A2 \(Ascend910B4\)"
    ):
        check_ascend_device_type("reference")


def test_every_family_but_310p_captures_graphs():
    for profile in (*BUILTIN_PROFILES.values(), REFERENCE_PROFILE):
        is_310p = profile.device_type is not None and profile.device_type.value == "310P"
        assert profile.supports(HardwareCapability.GRAPH_CAPTURE) is not is_310p, profile.name
        assert profile.eager_only is is_310p, profile.name


def test_quant_weight_format_is_nz_on_a2_a3_310p_and_nd_on_a5_and_reference():
    formats = {t.value: p.quant_weight_format for t, p in BUILTIN_PROFILES.items()}
    assert formats == {"A2": "NZ", "A3": "NZ", "A5": "ND", "310P": "NZ"}
    assert (
        REFERENCE_PROFILE.quant_weight_format == "ND" and A2_PROFILE.as_dict()["quant_weight_format"] == "NZ"
    )
    assert P310_BASE_PROFILE.quant_weight_format == "NZ"
    with pytest.raises(
        ProfileError,
        match=r"HardwareProfile.quant_weight_format='FRACTAL' is invalid; allowed values: ND, NZ",
    ):
        A2_PROFILE.with_changes(quant_weight_format="FRACTAL")


def test_npu_profiles_carry_core_counts_and_unified_buffer_and_show_them():
    counts = {t.value: (p.cube_cores, p.vector_cores, p.ub_bytes) for t, p in BUILTIN_PROFILES.items()}
    assert counts == {
        "A2": (24, 48, 192 * 1024),
        "A3": (24, 48, 192 * 1024),
        "A5": (32, 64, 256 * 1024),
        "310P": (8, 7, 256 * 1024),
    }
    shown = A2_PROFILE.as_dict()
    assert (shown["cube_cores"], shown["vector_cores"], shown["ub_bytes"]) == (24, 48, 196608)
    assert REFERENCE_PROFILE.as_dict()["vector_cores"] is None  # the cpu has no vector cores or UB


@pytest.mark.parametrize("field", ["cube_cores", "vector_cores", "ub_bytes"])
@pytest.mark.parametrize("value", [0, -4, 2.5, True, "48"])
def test_core_counts_must_be_positive_ints(field, value):
    with pytest.raises(
        ProfileError, match=rf"HardwareProfile.{field}={value!r} must be a positive int or None"
    ):
        A2_PROFILE.with_changes(**{field: value})


def test_adaptors_report_core_counts_where_the_runtime_has_them(monkeypatch):
    from vllm_ascend.kernels.device import npu as npu_adaptor

    props = {0: types.SimpleNamespace(cube_core_num=20, vector_core_num=40), 1: types.SimpleNamespace()}
    runtime = types.SimpleNamespace(get_device_properties=lambda i: props[i])
    monkeypatch.setattr(npu_adaptor, "torch_npu_runtime", lambda: runtime)
    assert A2A3DeviceAdaptor().core_counts(0) == (20, 40)  # e.g. an Ascend910B4
    assert A5DeviceAdaptor().core_counts(0) == (20, 40)
    assert A2A3DeviceAdaptor().core_counts(1) is None  # an older torch_npu without the properties
    assert ReferenceDeviceAdaptor().core_counts() is None


def test_moe_communication_is_profile_data_validated_by_name():
    """Which MoE exchanges a family runs is data the runner reads (no family names in its selection)."""
    assert A2_PROFILE.moe_comm_fallback == "allgather" and A2_PROFILE.mc2_min_ep_ranks == 16
    assert REFERENCE_PROFILE.moe_comm_methods == ("allgather", "alltoall", "mc2")
    assert BUILTIN_PROFILES[AscendDeviceType._310P].moe_comm_methods == ("allgather",)
    assert emulating_profile(BUILTIN_PROFILES[AscendDeviceType._310P]).moe_comm_methods == ("allgather",)
    with pytest.raises(
        ProfileError, match=r"moe_comm_methods=\('alltoall',\) is invalid: it needs 'allgather'"
    ):
        REFERENCE_PROFILE.with_changes(moe_comm_methods=("alltoall",))
    with pytest.raises(ProfileError, match="allowed values: allgather, alltoall, mc2"):
        REFERENCE_PROFILE.with_changes(moe_comm_methods=("allgather", "ring"))
    assert REFERENCE_PROFILE.with_changes(
        capabilities=frozenset({HardwareCapability.BF16})
    ).moe_comm_methods_available == (
        "allgather",
        "alltoall",
    )
    with pytest.raises(
        ProfileError, match="moe_comm_fallback='mc2' is invalid; allowed values: allgather, alltoall"
    ):
        REFERENCE_PROFILE.with_changes(moe_comm_fallback="mc2")
    with pytest.raises(
        ProfileError, match="moe_comm_fallback='alltoall' is invalid; allowed values: allgather"
    ):
        REFERENCE_PROFILE.with_changes(moe_comm_methods=("allgather",))
    with pytest.raises(ProfileError, match="mc2_min_ep_ranks=0 must be an int >= 1"):
        REFERENCE_PROFILE.with_changes(mc2_min_ep_ranks=0)
