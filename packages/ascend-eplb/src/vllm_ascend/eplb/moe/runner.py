"""``AscendMoERunner``: vLLM 0.32's ``MoERunner`` with routing and experts through the device adaptor.

Per forward: gate → ``moe_gating_top_k`` (logical ids) → log2phy (physical slot per token) →
``moe_init_routing`` → ``grouped_matmul`` (w13) → ``swiglu`` → ``grouped_matmul`` (w2) →
``moe_finalize_routing``; quantized experts run their scheme's ``apply`` on the physical ids instead
(every per-expert tensor, scales included, is laid out per physical slot). Tokens per physical slot are added to ``moe_load`` on real forwards only
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
from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import UnquantizedFusedMoEMethod

from vllm_ascend.core.config import get_section
from vllm_ascend.core.device.config import get_device_adaptor
from vllm_ascend.eplb.config import EplbConfig
from vllm_ascend.eplb.movers import LocalWeightMover
from vllm_ascend.eplb.placement import rank_maps
from vllm_ascend.eplb.updator import EplbUpdator

#: One schedule per model: ``id(vllm_config) -> (weak ref to the config, its EplbUpdator)``.
_SCHEDULES: dict[int, tuple[weakref.ref[Any], EplbUpdator]] = {}


def schedule_for(vllm_config: Any) -> EplbUpdator:
    """The :class:`EplbUpdator` of the model being built under ``vllm_config``: every rank's slots live in
    this process, so weights move with a :class:`LocalWeightMover`."""
    for key in [k for k, (ref, _) in _SCHEDULES.items() if ref() is None]:
        del _SCHEDULES[key]
    entry = _SCHEDULES.get(id(vllm_config))
    if entry is not None and entry[0]() is vllm_config:
        return entry[1]
    config = get_section("eplb_config")
    if not isinstance(config, EplbConfig):
        raise TypeError(f"core's eplb_config section is {type(config).__name__}, expected EplbConfig")
    schedule = EplbUpdator(config, LocalWeightMover())
    _SCHEDULES[id(vllm_config)] = (weakref.ref(vllm_config), schedule)
    return schedule


def _start(schedule: EplbUpdator, num_experts: int) -> None:
    """On the first forward (weights are loaded): lay every layer's experts out in physical slots. The
    placement's rank count comes from ``expert_map_path``, else it is 1 (this process is one rank)."""
    table = schedule.config.initial_table(num_experts, len(schedule.layers))
    for layer, rank_table in zip(schedule.layers, table, strict=True):
        if not isinstance(layer, AscendMoERunner):
            raise TypeError(f"the EPLB schedule of a served model holds a {type(layer).__name__}")
        layer.install_placement(rank_table)
    schedule.start(table)


def _real_forward_phase(decode_query_len: int) -> str | None:
    """``decode`` for a real forward whose requests bring at most ``decode_query_len`` new tokens each (1 +
    speculative tokens), else ``prefill``; ``None`` for dummy/profile runs (no attention metadata)."""
    if not is_forward_context_available():
        return None
    metadata = get_forward_context().attn_metadata
    if metadata is None:
        return None
    first = next(iter(metadata.values())) if isinstance(metadata, dict) else metadata
    return "prefill" if int(first.max_query_len) > decode_query_len else "decode"


class AscendMoERunner(MoERunner):
    """Softmax/sigmoid top-k routing over SwiGLU experts (unquantized, or a quant scheme's), with EPLB maps.

    Attributes used by EPLB (set on the first forward): ``expert_map [ranks, n]`` (local slot or -1),
    ``log2phy [ranks, n]`` (physical slot each rank routes each logical expert to) and
    ``moe_load [ranks * slots]`` (tokens routed to each physical slot).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._check_supported()
        vllm_config = get_current_vllm_config()
        spec = vllm_config.speculative_config
        self.decode_query_len = 1 + (spec.num_speculative_tokens or 0) if spec is not None else 1
        self.eplb = schedule_for(vllm_config)
        self.moe_index = self.eplb.register(self)
        self._expert_map: torch.Tensor | None = None
        self.log2phy: torch.Tensor | None = None
        self.moe_load: torch.Tensor | None = None
        self._placed: list[torch.nn.Parameter] = []

    def _check_supported(self) -> None:
        unsupported = {
            "shared_experts": self._shared_experts is not None,
            "routed_input_transform": self.routed_input_transform is not None,
            "routed_output_transform": self.routed_output_transform is not None,
            "router": not isinstance(self.router, FusedTopKRouter),
            "activation": self.routed_experts.activation is not MoEActivation.SILU,
            "has_bias": self.moe_config.has_bias,
            "tp_size/ep_size > 1": self.moe_config.tp_size > 1 or self.moe_config.ep_size > 1,
        }
        bad = [name for name, flag in unsupported.items() if flag]
        if bad:
            raise NotImplementedError(
                f"{self.layer_name}: the Ascend reference MoE runner supports SiLU-gated experts "
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

    # placement (the EplbLayer protocol) ----------------------------------------------------
    def _expert_params(self) -> list[torch.nn.Parameter]:
        """Every per-expert tensor of the experts (weights, and the scales/offsets of a quant scheme)."""
        experts = self.moe_config.num_logical_experts
        return [
            p for p in self.routed_experts.parameters(recurse=False) if p.dim() > 0 and p.shape[0] == experts
        ]

    def install_placement(self, rank_table: np.ndarray) -> None:
        """Give each physical slot (``rank * slots + slot``) a copy of its logical expert's tensors."""
        phys = torch.as_tensor(rank_table.reshape(-1), dtype=torch.long)
        self._placed = self._expert_params()
        for param in self._placed:
            param.data = param.data[phys].clone()
        self.moe_load = torch.zeros(phys.numel(), dtype=torch.int64)

    def expert_weights(self) -> list[torch.Tensor]:
        return [param.data for param in self._placed]

    def set_placement(self, rank_table: np.ndarray) -> None:
        expert_map, log2phy = rank_maps(rank_table)
        self._expert_map = torch.as_tensor(expert_map, dtype=torch.int64)
        self.log2phy = torch.as_tensor(log2phy, dtype=torch.int64)

    # forward ---------------------------------------------------------------------------------
    def _forward_impl(
        self,
        hidden_states: torch.Tensor,
        router_logits: torch.Tensor,
        shared_experts_input: torch.Tensor | None,
        input_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if not self.eplb.started:
            _start(self.eplb, self.moe_config.num_logical_experts)
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
        quant_method = self.routed_experts.quant_method
        if isinstance(quant_method, UnquantizedFusedMoEMethod):
            sorted_x, row_idx, counts = adaptor.moe_init_routing(
                hidden_states, physical, self.moe_load.numel()
            )
            w13 = self.routed_experts.w13_weight.transpose(1, 2)
            w2 = self.routed_experts.w2_weight.transpose(1, 2)
            act = adaptor.swiglu(adaptor.grouped_matmul(sorted_x, w13, counts))
            out = adaptor.moe_finalize_routing(adaptor.grouped_matmul(act, w2, counts), row_idx, weights)
        else:  # a quant scheme's experts: routing and grouped matmuls are the scheme's
            out = quant_method.apply(self.routed_experts, hidden_states, weights, physical)
            counts = torch.bincount(physical.reshape(-1).long(), minlength=self.moe_load.numel())
        phase = _real_forward_phase(self.decode_query_len)
        if phase is not None:
            self.moe_load += counts.to(self.moe_load.device)
            if self.moe_index == len(self.eplb.layers) - 1:
                self.eplb.forward_end(phase)
        return out
