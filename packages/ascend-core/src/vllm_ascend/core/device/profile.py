"""Hardware profiles: what differs between device families, as data the platform and runner read.

Shared logic asks the active profile (``profile.supported_dtypes``, ``profile.eager_only``,
``profile.supports(HardwareCapability.GRAPH_CAPTURE)``) instead of testing the family by name.
Capabilities are hardware facts; GRAPH_CAPTURE is set where the plugin captures device graphs (ACL graphs
through ``torch.npu.NPUGraph`` on A2/A3/950; the reference device's replay-by-re-run graphs), not on 310P.
A device overlay registered by a sibling (e.g. ``vllm-ascend-310p``) replaces a family's profile.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from typing import Any

from vllm_ascend.core.device.adaptor.base import WEIGHT_FORMATS
from vllm_ascend.core.device.family import AscendDeviceType


class HardwareCapability(enum.StrEnum):
    BF16 = "bf16"  # bfloat16 compute
    FP8 = "fp8"  # float8 matmul/quant
    MXFP = "mxfp"  # microscaling formats (MXFP8/MXFP4)
    INT4 = "int4"  # int4 weights (W4A8/W4A16)
    TRITON = "triton"  # Triton kernels through triton-ascend
    MC2 = "mc2"  # fused MoE dispatch/combine communication
    FUSED_MOE_GATING = "fused_moe_gating"  # npu_moe_gating_top_k
    FUSED_INFER_ATTENTION = "fused_infer_attention"  # npu_fused_infer_attention_score
    GRAPH_CAPTURE = "graph_capture"  # ACL graph capture/replay
    SPARSE_WEIGHT = "sparse_weight"  # sparse/compressed int8 weights (W8A8S/W8A8SC)


class CPUBindingMode(enum.StrEnum):
    NONE = "none"  # do not bind
    AVERAGE = "average"  # split the visible CPUs evenly across ranks
    TOPO_AFFINITY = "topo_affinity"  # CPUs from npu-smi's NPU-CPU affinity, extended across NUMA nodes
    CPU_POOLS_950 = "cpu_pools_950"  # Ascend 950 dedicated CPU pools


class DeviceAdaptorFamily(enum.StrEnum):
    A2A3 = "a2a3"
    A5 = "a5"
    _310P = "310p"
    REFERENCE = "reference"


_DIMENSIONS = {
    "cpu_binding": CPUBindingMode,
    "adaptor_family": DeviceAdaptorFamily,
}


_HARDWARE_COUNTS = ("cube_cores", "vector_cores", "ub_bytes")
#: MoE token exchanges between expert-parallel ranks (the runner's ``MoECommType`` values).
MOE_COMM_METHODS = ("allgather", "alltoall", "mc2")


class ProfileError(ValueError):
    """An invalid profile field or an unknown capability name."""


@dataclass(frozen=True)
class HardwareProfile:
    """Immutable capabilities and implementation choices of one SoC family (or the reference device)."""

    name: str
    device_type: AscendDeviceType | None
    capabilities: frozenset[HardwareCapability]
    cpu_binding: CPUBindingMode
    adaptor_family: DeviceAdaptorFamily
    torch_device: str = "npu"
    dist_backend: str = "hccl"
    eager_only: bool = False
    #: Run eagerly unless the user asks for compilation or graphs (the reference device: inductor on a
    #: CPU compiles slowly and captures nothing faster); NPU families default to vLLM's graph mode.
    eager_by_default: bool = False
    async_scheduling: bool = True
    preferred_block_size: int = 128
    block_size_multiple: int = 16
    supported_dtypes: tuple[str, ...] = field(default=("float16", "bfloat16", "float32"))
    #: Storage format quantized weights are cast to after loading (``adaptor.cast_weight_format``).
    quant_weight_format: str = "ND"
    #: AI (cube) cores, vector cores and unified-buffer bytes per vector core: what Triton launch
    #: geometry is sized by (None on the reference device, which has none). A device's own count,
    #: where its adaptor reports one (``adaptor.core_counts()``), takes precedence over these.
    cube_cores: int | None = None
    vector_cores: int | None = None
    ub_bytes: int | None = None
    #: The ``WORKERS`` entry that serves this family (a sibling may register its own, e.g. ``"310p"``).
    worker: str = "default"
    #: MoE communication the family runs (``MOE_COMM_METHODS``; ``mc2`` only where the profile also has the MC2
    #: capability: ``moe_comm_methods_available``), the one a step takes when MC2 does not (too many tokens,
    #: or fewer expert-parallel ranks than ``mc2_min_ep_ranks``, from which MC2 beats it), that threshold.
    moe_comm_methods: tuple[str, ...] = MOE_COMM_METHODS
    moe_comm_fallback: str = "alltoall"
    mc2_min_ep_ranks: int = 1

    def __post_init__(self) -> None:
        for attr, enum_cls in _DIMENSIONS.items():
            value = getattr(self, attr)
            if not isinstance(value, enum_cls):
                allowed = ", ".join(m.value for m in enum_cls)
                raise ProfileError(f"HardwareProfile.{attr}={value!r} is invalid; allowed values: {allowed}")
        bad = [c for c in self.capabilities if not isinstance(c, HardwareCapability)]
        if bad:
            raise ProfileError(
                f"HardwareProfile.capabilities has non-capabilities {bad}; allowed: {_capability_names()}"
            )
        if self.preferred_block_size <= 0 or self.preferred_block_size % self.block_size_multiple:
            raise ProfileError(
                f"HardwareProfile.preferred_block_size={self.preferred_block_size} must be a positive multiple "
                f"of block_size_multiple={self.block_size_multiple}"
            )
        if self.quant_weight_format not in WEIGHT_FORMATS:
            raise ProfileError(
                f"HardwareProfile.quant_weight_format={self.quant_weight_format!r} is invalid; "
                f"allowed values: {', '.join(WEIGHT_FORMATS)}"
            )
        for attr in _HARDWARE_COUNTS:
            value = getattr(self, attr)
            if value is not None and (type(value) is not int or value <= 0):
                raise ProfileError(f"HardwareProfile.{attr}={value!r} must be a positive int or None")
        if not isinstance(self.worker, str) or not self.worker.strip():
            raise ProfileError(f"HardwareProfile.worker={self.worker!r} must be a non-empty WORKERS name")
        self._check_moe_comm()
        bf16 = HardwareCapability.BF16 in self.capabilities
        if bf16 != ("bfloat16" in self.supported_dtypes):
            raise ProfileError(f"profile {self.name!r}: the BF16 capability and supported_dtypes disagree")

    def _check_moe_comm(self) -> None:
        unknown = [m for m in self.moe_comm_methods if m not in MOE_COMM_METHODS]
        if unknown or "allgather" not in self.moe_comm_methods:
            raise ProfileError(
                f"HardwareProfile.moe_comm_methods={self.moe_comm_methods!r} is invalid: it needs 'allgather' "
                f"(always possible) and only allowed values: {', '.join(MOE_COMM_METHODS)}"
            )
        fallbacks = [m for m in self.moe_comm_methods if m != "mc2"]
        if self.moe_comm_fallback not in fallbacks:
            raise ProfileError(
                f"HardwareProfile.moe_comm_fallback={self.moe_comm_fallback!r} is invalid; allowed values: "
                f"{', '.join(fallbacks)}"
            )
        if type(self.mc2_min_ep_ranks) is not int or self.mc2_min_ep_ranks < 1:
            raise ProfileError(
                f"HardwareProfile.mc2_min_ep_ranks={self.mc2_min_ep_ranks!r} must be an int >= 1"
            )

    @property
    def moe_comm_methods_available(self) -> tuple[str, ...]:
        """``moe_comm_methods`` without ``mc2`` where the MC2 capability is missing."""
        mc2 = HardwareCapability.MC2 in self.capabilities
        return tuple(m for m in self.moe_comm_methods if m != "mc2" or mc2)

    def supports(self, capability: HardwareCapability | str) -> bool:
        """Whether the family has ``capability`` (enum member or its value, e.g. ``"bf16"``)."""
        if not isinstance(capability, HardwareCapability):
            try:
                capability = HardwareCapability(capability)
            except ValueError:
                raise ProfileError(
                    f"unknown capability {capability!r}; allowed: {_capability_names()}"
                ) from None
        return capability in self.capabilities

    def with_changes(self, **changes: Any) -> HardwareProfile:
        """A copy with some fields replaced (validated again); what overlays use to refine a profile."""
        return replace(self, **changes)

    def as_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "device_type": self.device_type.value if self.device_type else None,
            "capabilities": sorted(c.value for c in self.capabilities),
            **{attr: getattr(self, attr).value for attr in _DIMENSIONS},
            "torch_device": self.torch_device,
            "dist_backend": self.dist_backend,
            "eager_only": self.eager_only,
            "eager_by_default": self.eager_by_default,
            "async_scheduling": self.async_scheduling,
            "preferred_block_size": self.preferred_block_size,
            "block_size_multiple": self.block_size_multiple,
            "supported_dtypes": list(self.supported_dtypes),
            "quant_weight_format": self.quant_weight_format,
            **{attr: getattr(self, attr) for attr in _HARDWARE_COUNTS},
            "worker": self.worker,
            "moe_comm_methods": list(self.moe_comm_methods),
            "moe_comm_fallback": self.moe_comm_fallback,
            "mc2_min_ep_ranks": self.mc2_min_ep_ranks,
        }


def _capability_names() -> str:
    return ", ".join(c.value for c in HardwareCapability)


C = HardwareCapability

KIB = 1024
# Core counts: the ``[SoCInfo]`` section of CANN's ``<arch>-linux/data/platform_config/<soc>.ini``
# (``cube_core_cnt`` / ``vector_core_cnt``), as quoted in the CANN docs of ATC's ``--aicore_num`` and of
# torchair's ``aicore_num`` (24 cube / 48 vector cores). Unified buffer: 192 KiB per vector core on A2/A3
# (triton-ascend's operator-design guide and the Ascend C docs of the 2201 architecture).

A2_PROFILE = HardwareProfile(
    name="Atlas A2",
    device_type=AscendDeviceType.A2,
    capabilities=frozenset(
        {C.BF16, C.INT4, C.TRITON, C.MC2, C.FUSED_MOE_GATING, C.FUSED_INFER_ATTENTION, C.GRAPH_CAPTURE}
    ),
    cpu_binding=CPUBindingMode.TOPO_AFFINITY,
    adaptor_family=DeviceAdaptorFamily.A2A3,
    quant_weight_format="NZ",
    # A2's MC2 beats all-gather from 16 expert-parallel ranks; below, all-gather (HCCS bandwidth).
    moe_comm_fallback="allgather",
    mc2_min_ep_ranks=16,
    # Ascend910B1/B2 (and each die of an A3 Ascend910_93: one device per die). Ascend910B3/B4 have 20 cube
    # and 40 vector cores (Ascend910B4.ini): the adaptor's run-time count covers them.
    cube_cores=24,
    vector_cores=48,
    ub_bytes=192 * KIB,
)

A3_PROFILE = A2_PROFILE.with_changes(
    name="Atlas A3", device_type=AscendDeviceType.A3, moe_comm_fallback="alltoall", mc2_min_ep_ranks=1
)

A5_PROFILE = HardwareProfile(
    name="Ascend 950",
    device_type=AscendDeviceType.A5,
    capabilities=frozenset(
        {
            C.BF16,
            C.FP8,
            C.MXFP,
            C.INT4,
            C.TRITON,
            C.MC2,
            C.FUSED_MOE_GATING,
            C.FUSED_INFER_ATTENTION,
            C.GRAPH_CAPTURE,
        }
    ),
    cpu_binding=CPUBindingMode.CPU_POOLS_950,
    adaptor_family=DeviceAdaptorFamily.A5,
    # Ascend950PR platform_config as quoted in CANN's 950 communication examples (950PR_958b:
    # cube_core_cnt=32, vector_core_cnt=64). UB 256 KiB per vector core for the 3510 architecture: not
    # confirmed from a platform_config file (the run-time count takes precedence for cores).
    cube_cores=32,
    vector_cores=64,
    ub_bytes=256 * KIB,
)

#: Core's baseline for 310P: only hardware facts (sparse int8 weights; no bf16, no Triton, no fused gating); the
#: ``vllm-ascend-310p`` overlay refines it and brings its adaptor.
P310_BASE_PROFILE = HardwareProfile(
    name="Atlas 310P (baseline; install vllm-ascend-310p)",
    device_type=AscendDeviceType._310P,
    capabilities=frozenset({C.SPARSE_WEIGHT}),
    cpu_binding=CPUBindingMode.AVERAGE,
    adaptor_family=DeviceAdaptorFamily._310P,
    eager_only=True,
    supported_dtypes=("float16", "float32"),
    quant_weight_format="NZ",
    moe_comm_methods=("allgather",),  # no all-to-all or MC2 on 310P
    moe_comm_fallback="allgather",
    # Ascend310P3.ini: ai_core_cnt=8, vector_core_cnt=7 (the AI core is unified: cube and vector in one
    # core, so the cube count is the AI-core count). UB 256 KiB per AI core: not confirmed from a
    # platform_config file (310P runs no Triton; the figure only sizes what it would).
    cube_cores=8,
    vector_cores=7,
    ub_bytes=256 * KIB,
)

#: ``VLLM_ASCEND_DEVICE=reference``: torch's cpu device, gloo, eager unless compilation or graphs are asked
#: for (inductor compiles; graphs replay by re-running on their static buffers), async scheduling as vLLM
#: defaults it (the NPU families' path); CPU binding splits the allowed CPUs among local ranks. MC2 dispatch/combine run
#: as fixed-window all-to-alls over gloo. Triton kernels run as their torch references (or Triton's interpreter
#: under ``TRITON_INTERPRET=1``), Model Runner V2's included.
REFERENCE_PROFILE = HardwareProfile(
    name="reference (torch cpu)",
    device_type=None,
    capabilities=frozenset({C.BF16, C.INT4, C.TRITON, C.MC2, C.GRAPH_CAPTURE}),
    cpu_binding=CPUBindingMode.AVERAGE,
    adaptor_family=DeviceAdaptorFamily.REFERENCE,
    torch_device="cpu",
    dist_backend="gloo",
    eager_by_default=True,
    preferred_block_size=128,
)

#: What the reference device honours of a family's capabilities: what it implements in torch (sparse int8
#: weights decompress in torch) and Triton (interpreted where ``TRITON_INTERPRET=1``, else the kernels' torch
#: references); not the fused NPU-only ops.
EMULATED_CAPABILITIES = REFERENCE_PROFILE.capabilities | {C.SPARSE_WEIGHT}


def emulating_profile(family_profile: HardwareProfile) -> HardwareProfile:
    """The reference device emulating ``family_profile``'s family: torch's cpu device and gloo, with the
    family's dtypes, eager-only rule, block sizes, weight layout, worker and the capabilities the
    reference implements (``VLLM_ASCEND_REFERENCE_FAMILY``)."""
    return REFERENCE_PROFILE.with_changes(
        name=f"{REFERENCE_PROFILE.name} as {family_profile.name}",
        device_type=family_profile.device_type,
        capabilities=family_profile.capabilities & EMULATED_CAPABILITIES,
        eager_only=family_profile.eager_only,
        preferred_block_size=family_profile.preferred_block_size,
        block_size_multiple=family_profile.block_size_multiple,
        supported_dtypes=family_profile.supported_dtypes,
        quant_weight_format=family_profile.quant_weight_format,
        worker=family_profile.worker,
        moe_comm_methods=family_profile.moe_comm_methods,
        moe_comm_fallback=family_profile.moe_comm_fallback,
        mc2_min_ep_ranks=family_profile.mc2_min_ep_ranks,
    )


BUILTIN_PROFILES: dict[AscendDeviceType, HardwareProfile] = {
    AscendDeviceType.A2: A2_PROFILE,
    AscendDeviceType.A3: A3_PROFILE,
    AscendDeviceType.A5: A5_PROFILE,
    AscendDeviceType._310P: P310_BASE_PROFILE,
}
