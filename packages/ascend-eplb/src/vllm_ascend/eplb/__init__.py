"""Expert-parallel load balancing for vLLM Ascend: policies, placement utilities and the
rebalance lifecycle. Public names load lazily, so importing the package is cheap."""

from __future__ import annotations

from vllm_ascend.core.lazy import lazy_exports

_EXPORTS = {
    "EplbPolicy": "vllm_ascend.eplb.policy.base",
    "PolicyFactory": "vllm_ascend.eplb.policy.factory",
    "DefaultEplb": "vllm_ascend.eplb.policy.default",
    "RandomLoadBalance": "vllm_ascend.eplb.policy.random",
    "SwiftBalanceEplb": "vllm_ascend.eplb.policy.swift",
    "FlashLB": "vllm_ascend.eplb.policy.flashlb",
    "generate_global_placement": "vllm_ascend.eplb.placement",
    "generate_log2phy_map": "vllm_ascend.eplb.placement",
    "init_eplb_config": "vllm_ascend.eplb.config",
    "expert_file_to_tensor": "vllm_ascend.eplb.expert_map_file",
    "EplbInputError": "vllm_ascend.eplb.validation",
    "EplbWorker": "vllm_ascend.eplb.worker",
    "EplbProcess": "vllm_ascend.eplb.worker",
    "EplbUpdator": "vllm_ascend.eplb.updator",
    "VllmEplbAdaptor": "vllm_ascend.eplb.adaptor",
    "D2DExpertWeightLoader": "vllm_ascend.eplb.d2d",
    "AscendEPLBController": "vllm_ascend.eplb.controller",
    "EplbMetrics": "vllm_ascend.eplb.metrics",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
