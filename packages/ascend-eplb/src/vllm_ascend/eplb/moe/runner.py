"""``AscendMoERunner``: vLLM 0.32's ``MoERunner`` with routing and experts through the device adaptor.

Per forward: gate → ``moe_gating_top_k`` (logical ids) → log2phy (physical slot per token) →
``moe_init_routing`` → ``grouped_matmul`` (w13) → ``swiglu`` → ``grouped_matmul`` (w2) →
``moe_finalize_routing``. Tokens per physical slot are added to ``moe_load`` on real forwards only
(never on dummy/profile runs, which have no attention metadata).
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np
import torch
from vllm.config import get_current_vllm_config
from vllm.forward_context import get_forward_context, is_forward_context_available
from vllm.model_executor.layers.fused_moe.activation import MoEActivation
from vllm.model_executor.layers.fused_moe.router.fused_topk_router import FusedTopKRouter
from vllm.model_executor.layers.fused_moe.runner.moe_runner import MoERunner

from vllm_ascend.core.device.adaptor import get_device_adaptor
from vllm_ascend.eplb.moe.host import HostPlacement, physical_maps

#: One placement per model: ``id(vllm_config) -> (weak ref to the config, its HostPlacement)``.
_HOSTS: dict[int, tuple[weakref.ref[Any], HostPlacement]] = {}


def host_for(vllm_config: Any, num_experts: int) -> HostPlacement:
    """The :class:`HostPlacement` of the model being built under ``vllm_config``."""
    for key in [k for k, (ref, _) in _HOSTS.items() if ref() is None]:
        del _HOSTS[key]
    entry = _HOSTS.get(id(vllm_config))
    if entry is not None and entry[0]() is vllm_config:
        return entry[1]
    from vllm_ascend.core.config import get_ascend_config

    host = HostPlacement(get_ascend_config().eplb_config, num_experts)
    _HOSTS[id(vllm_config)] = (weakref.ref(vllm_config), host)
    return host


def _is_real_forward() -> bool:
    return is_forward_context_available() and get_forward_context().attn_metadata is not None


class AscendMoERunner(MoERunner):
    """Softmax/sigmoid top-k routing over unquantized SwiGLU experts, with EPLB expert maps.

    Attributes used by EPLB (set on the first forward): ``expert_map [ranks, n]`` (local slot or -1),
    ``log2phy [ranks, n]`` (physical slot each rank routes each logical expert to) and
    ``moe_load [ranks * slots]`` (tokens routed to each physical slot).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._check_supported()
        self.host = host_for(get_current_vllm_config(), self.moe_config.num_logical_experts)
        self.moe_index = self.host.register(self)
        self._expert_map: torch.Tensor | None = None
        self.log2phy: torch.Tensor | None = None
        self.moe_load: torch.Tensor | None = None

    def _check_supported(self) -> None:
        unsupported = {
            "shared_experts": self._shared_experts is not None,
            "routed_input_transform": self.routed_input_transform is not None,
            "routed_output_transform": self.routed_output_transform is not None,
            "router": not isinstance(self.router, FusedTopKRouter),
            "activation": self.routed_experts.activation is not MoEActivation.SILU,
            "has_bias": self.moe_config.has_bias,
            "tp_size/ep_size > 1": self.moe_config.tp_size > 1 or self.moe_config.ep_size > 1,
            "quantization": self.routed_experts.quant_method.__class__.__name__
            != "UnquantizedFusedMoEMethod",
        }
        bad = [name for name, flag in unsupported.items() if flag]
        if bad:
            raise NotImplementedError(
                f"{self.layer_name}: the Ascend reference MoE runner supports unquantized SiLU-gated experts "
                f"with top-k routing in one process; unsupported here: {bad} "
                f"(router {type(self.router).__name__}, activation {self.routed_experts.activation})"
            )

    @property
    def is_monolithic(self) -> bool:
        return False

    @property
    def expert_map(self) -> torch.Tensor | None:
        """``[ranks, n]`` local slot of each logical expert on each rank of the placement, -1 where absent."""
        return self._expert_map

    # placement -------------------------------------------------------------------------------
    def install_placement(self, rank_table: np.ndarray) -> None:
        """Give each physical slot a copy of its logical expert's weights; set the maps."""
        phys = torch.as_tensor(rank_table.reshape(-1), dtype=torch.long)
        for param in (self.routed_experts.w13_weight, self.routed_experts.w2_weight):
            param.data = param.data[phys].clone()
        self._expert_map, self.log2phy = physical_maps(rank_table)
        self.moe_load = torch.zeros(phys.numel(), dtype=torch.int64)

    def move_experts(self, moves: list[tuple[int, int]], rank_table: np.ndarray) -> None:
        """Copy weights ``src → dst`` (physical slots, sources read before any write); switch the maps."""
        for param in (self.routed_experts.w13_weight, self.routed_experts.w2_weight):
            sources = {src: param.data[src].clone() for src, _ in moves}
            for src, dst in moves:
                param.data[dst].copy_(sources[src])
        self._expert_map, self.log2phy = physical_maps(rank_table)

    # forward ---------------------------------------------------------------------------------
    def _forward_impl(
        self,
        hidden_states: torch.Tensor,
        router_logits: torch.Tensor,
        shared_experts_input: torch.Tensor | None,
        input_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if not self.host.installed:
            self.host.install()
        assert self.log2phy is not None and self.moe_load is not None
        if self.gate is not None:
            router_logits, _ = self.gate(hidden_states)
        adaptor = get_device_adaptor()
        router = self.router
        weights, logical = adaptor.moe_gating_top_k(
            router_logits, router.top_k, renormalize=router.renormalize, scoring=router.scoring_func
        )
        ranks = self.log2phy.shape[0]
        token_rank = torch.arange(hidden_states.shape[0], device=hidden_states.device) % ranks
        physical = self.log2phy[token_rank[:, None], logical.long()]
        sorted_x, row_idx, counts = adaptor.moe_init_routing(hidden_states, physical, self.moe_load.numel())
        w13 = self.routed_experts.w13_weight.transpose(1, 2)
        w2 = self.routed_experts.w2_weight.transpose(1, 2)
        act = adaptor.swiglu(adaptor.grouped_matmul(sorted_x, w13, counts))
        out = adaptor.moe_finalize_routing(adaptor.grouped_matmul(act, w2, counts), row_idx, weights)
        if _is_real_forward():
            self.moe_load += counts.to(self.moe_load.device)
            if self.moe_index == len(self.host.layers) - 1:
                self.host.end_of_forward()
        return out
