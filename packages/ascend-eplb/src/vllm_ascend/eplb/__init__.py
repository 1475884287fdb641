"""Expert-parallel load balancing for vLLM Ascend: settings, policies, placement utilities and the
EPLB schedule. Public names load lazily, so importing the package is cheap."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vllm_ascend.core.sdk import lazy_exports

if TYPE_CHECKING:  # real signatures for type checkers; at runtime the names load lazily
    from vllm_ascend.eplb.config import EplbConfig as EplbConfig
    from vllm_ascend.eplb.config import validate_eplb_config as validate_eplb_config
    from vllm_ascend.eplb.expert_map_file import expert_file_to_tensor as expert_file_to_tensor
    from vllm_ascend.eplb.expert_map_file import save_expert_map as save_expert_map
    from vllm_ascend.eplb.movers import D2DWeightMover as D2DWeightMover
    from vllm_ascend.eplb.movers import EplbLayer as EplbLayer
    from vllm_ascend.eplb.movers import LocalWeightMover as LocalWeightMover
    from vllm_ascend.eplb.movers import WeightMover as WeightMover
    from vllm_ascend.eplb.placement import generate_global_placement as generate_global_placement
    from vllm_ascend.eplb.placement import generate_log2phy_map as generate_log2phy_map
    from vllm_ascend.eplb.policy.base import EplbPolicy as EplbPolicy
    from vllm_ascend.eplb.policy.default import DefaultEplb as DefaultEplb
    from vllm_ascend.eplb.policy.factory import EPLB_POLICIES as EPLB_POLICIES
    from vllm_ascend.eplb.policy.factory import PolicyFactory as PolicyFactory
    from vllm_ascend.eplb.policy.flashlb import FlashLB as FlashLB
    from vllm_ascend.eplb.policy.random import RandomLoadBalance as RandomLoadBalance
    from vllm_ascend.eplb.policy.swift import SwiftBalanceEplb as SwiftBalanceEplb
    from vllm_ascend.eplb.updator import EplbUpdator as EplbUpdator
    from vllm_ascend.eplb.validation import EplbInputError as EplbInputError
    from vllm_ascend.eplb.worker import EplbProcess as EplbProcess
    from vllm_ascend.eplb.worker import EplbWorker as EplbWorker

_EXPORTS = {
    "EplbConfig": "vllm_ascend.eplb.config",
    "validate_eplb_config": "vllm_ascend.eplb.config",
    "EplbPolicy": "vllm_ascend.eplb.policy.base",
    "EPLB_POLICIES": "vllm_ascend.eplb.policy.factory",
    "PolicyFactory": "vllm_ascend.eplb.policy.factory",
    "DefaultEplb": "vllm_ascend.eplb.policy.default",
    "RandomLoadBalance": "vllm_ascend.eplb.policy.random",
    "SwiftBalanceEplb": "vllm_ascend.eplb.policy.swift",
    "FlashLB": "vllm_ascend.eplb.policy.flashlb",
    "generate_global_placement": "vllm_ascend.eplb.placement",
    "generate_log2phy_map": "vllm_ascend.eplb.placement",
    "expert_file_to_tensor": "vllm_ascend.eplb.expert_map_file",
    "save_expert_map": "vllm_ascend.eplb.expert_map_file",
    "EplbInputError": "vllm_ascend.eplb.validation",
    "EplbWorker": "vllm_ascend.eplb.worker",
    "EplbProcess": "vllm_ascend.eplb.worker",
    "EplbUpdator": "vllm_ascend.eplb.updator",
    "EplbLayer": "vllm_ascend.eplb.movers",
    "WeightMover": "vllm_ascend.eplb.movers",
    "LocalWeightMover": "vllm_ascend.eplb.movers",
    "D2DWeightMover": "vllm_ascend.eplb.movers",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
