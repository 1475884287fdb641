"""Top-k expert selection for the Ascend MoE runner: vLLM's router object → the device adaptor's gating op.

``check_router`` refuses, at model build, a router (or a router option) whose semantics the adaptor cannot
reproduce; ``select_experts`` turns one forward's router logits into
``(weights fp32 [T, k], logical ids int32 [T, k])`` exactly as vLLM 0.32's torch routing does:

- ``FusedTopKRouter``: softmax or sigmoid top-k, optional renormalisation;
- ``FusedTopKBiasRouter``: the same with ``e_score_correction_bias`` added for selection only, then
  ``routed_scaling_factor``;
- ``GroupedTopKRouter`` (DeepSeek-V3 style): ``num_expert_group`` groups, ``topk_group`` of them kept
  (scored by their top-2 biased scores with a bias, else by their best score), then renormalisation and
  ``routed_scaling_factor``. When the experts do not split into groups of more than one, vLLM routes
  ungrouped: with the bias like ``FusedTopKBiasRouter``, without it by plain softmax top-k, unscaled.

A model that asks vLLM to scale the MoE output instead (``apply_routed_scale_to_output``) hands the router
a factor of 1.0 and vLLM's runner scales the output; the factor the router holds is the one applied here.
"""

from __future__ import annotations

from typing import Any

import torch
import vllm.envs as vllm_envs
from vllm.model_executor.layers.fused_moe.router.fused_topk_bias_router import FusedTopKBiasRouter
from vllm.model_executor.layers.fused_moe.router.fused_topk_router import FusedTopKRouter
from vllm.model_executor.layers.fused_moe.router.grouped_topk_router import GroupedTopKRouter

from vllm_ascend.core.sdk import DeviceOpError, check_moe_gating, get_device_adaptor

#: vLLM router classes the runner serves.
SUPPORTED_ROUTERS: tuple[type, ...] = (FusedTopKRouter, FusedTopKBiasRouter, GroupedTopKRouter)
#: Scoring functions the adaptor's gating op computes.
SUPPORTED_SCORING: tuple[str, ...] = ("softmax", "sigmoid")


def _unsupported_options(router: Any) -> list[str]:
    """``option=value`` of every option of a supported router that the runner does not reproduce."""
    bad = []
    if router.scoring_func not in SUPPORTED_SCORING:
        bad.append(f"scoring_func={router.scoring_func!r} (supported: {', '.join(SUPPORTED_SCORING)})")
    if getattr(router, "num_fused_shared_experts", 0):
        bad.append(f"num_fused_shared_experts={router.num_fused_shared_experts}")
    if isinstance(router, FusedTopKBiasRouter):
        if router._hash_indices_table is not None:
            bad.append("hash_indices_table (hash routing)")
        if router.bias_vl is not None:
            bad.append("bias_vl (vision routing bias)")
    if isinstance(router, GroupedTopKRouter) and router.skip_padding and vllm_envs.VLLM_MOE_SKIP_PADDING:
        bad.append("skip_padding (padding rows routed to -1)")
    return bad


def _is_grouped(router: Any, num_experts: int) -> bool:
    """vLLM's test for a usable grouping: more experts than groups, split evenly."""
    return num_experts > router.num_expert_group and num_experts % router.num_expert_group == 0


def check_router(router: Any, layer_name: str) -> None:
    """Raise ``NotImplementedError`` naming the router or its options when the runner cannot route like it,
    and ``DeviceOpError`` when its top-k or groups do not fit its experts."""
    if type(router) not in SUPPORTED_ROUTERS:
        raise NotImplementedError(
            f"{layer_name}: the Ascend MoE runner does not support the {type(router).__name__} router; "
            f"supported: {', '.join(cls.__name__ for cls in SUPPORTED_ROUTERS)}"
        )
    bad = _unsupported_options(router)
    if bad:
        raise NotImplementedError(
            f"{layer_name}: the Ascend MoE runner does not support these options of the "
            f"{type(router).__name__} router: {', '.join(bad)}"
        )
    if router.eplb_state is None:  # no redundant experts: the router logits are global_num_experts wide
        num_experts = router.global_num_experts
        kwargs = gating_kwargs(router, num_experts)
        try:
            check_moe_gating(
                torch.empty(0, num_experts),
                router.top_k,
                kwargs.get("bias"),
                kwargs.get("num_groups", 1),
                kwargs.get("topk_groups", 1),
            )
        except DeviceOpError as exc:
            raise DeviceOpError(f"{layer_name}: {type(router).__name__}: {exc}") from exc


def gating_kwargs(router: Any, num_experts: int) -> dict[str, Any]:
    """The adaptor's ``moe_gating_top_k`` options that route like ``router`` over ``num_experts`` logits."""
    kwargs: dict[str, Any] = {"renormalize": router.renormalize, "scoring": router.scoring_func}
    if isinstance(router, FusedTopKRouter):
        return kwargs
    bias = router.e_score_correction_bias
    if bias is not None:
        kwargs["bias"] = bias.data
    if isinstance(router, GroupedTopKRouter):
        if _is_grouped(router, num_experts):
            kwargs.update(num_groups=router.num_expert_group, topk_groups=router.topk_group)
        elif bias is None:  # vLLM's fallback: fused_topk (softmax, no scaling factor)
            return {"renormalize": router.renormalize, "scoring": "softmax"}
    kwargs["routed_scaling_factor"] = router.routed_scaling_factor
    return kwargs


def select_experts(router: Any, router_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The router's top-k experts of every token: ``(weights, logical expert ids)``."""
    return get_device_adaptor().moe_gating_top_k(
        router_logits, router.top_k, **gating_kwargs(router, router_logits.shape[-1])
    )
