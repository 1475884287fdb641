"""This distribution's descriptor for core's ``vllm_ascend.extensions`` entry-point group."""

from __future__ import annotations

from vllm_ascend.core.extensions import ExtensionDescriptor
from vllm_ascend.eplb._version import __version__

POLICY_PATHS = {
    "random": "vllm_ascend.eplb.policy.random:RandomLoadBalance",
    "default": "vllm_ascend.eplb.policy.default:DefaultEplb",
    "swift": "vllm_ascend.eplb.policy.swift:SwiftBalanceEplb",
    "flashlb": "vllm_ascend.eplb.policy.flashlb:FlashLB",
}


def register() -> None:
    """Fill core's registries with lazy paths (nothing heavy is imported here)."""
    from vllm_ascend.core.registry import EPLB_POLICIES

    for name, path in POLICY_PATHS.items():
        EPLB_POLICIES.register(name, path)
    __import__("vllm_ascend.eplb.moe", fromlist=["register_moe_runner"]).register_moe_runner()


EXTENSION = ExtensionDescriptor(
    name="eplb",
    version=__version__,
    core_requires=">=0.1,<0.2",
    provides=("eplb_policies",),
    register=register,
    description="EPLB policies (random, default, swift, flashlb) and the rebalance lifecycle",
)
