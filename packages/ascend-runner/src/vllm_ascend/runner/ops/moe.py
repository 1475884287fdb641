"""``AscendMoERunner``: vLLM 0.32's ``MoERunner`` for every MoE model served on the Ascend platforms.

vLLM's runner keeps what it does around the experts (the gate, shared experts, data-parallel dispatch
and combine, the final tensor-parallel all-reduce); this class replaces the routed-expert step:
``moe_gating_top_k`` (softmax or sigmoid top-k) → logical→physical ids → the experts, unquantized
(``moe_init_routing`` → ``grouped_matmul`` → ``swiglu`` → ``grouped_matmul`` → ``moe_finalize_routing``)
or a quant scheme's (its ``apply``), all through the device adaptor.

Parallelism: with tensor parallel each rank holds every expert's slice of the intermediate size; with
expert parallel (``enable_expert_parallel``) each rank holds its experts (vLLM's expert map) and
computes the tokens' copies routed to them. Tokens are replicated over the ranks (all-gather
communication: vLLM's dispatch gathers data-parallel ranks' tokens), and each rank's partial output is
summed by vLLM's all-reduce. An expert-placement schedule (core's ``MOE_PLACEMENTS``, e.g. EPLB) may lay
experts out in physical slots with replicas; it sees each real forward's load per slot.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from vllm.config import get_current_vllm_config
from vllm.forward_context import get_forward_context, is_forward_context_available
from vllm.model_executor.layers.fused_moe.activation import MoEActivation
from vllm.model_executor.layers.fused_moe.router.fused_topk_router import FusedTopKRouter
from vllm.model_executor.layers.fused_moe.runner.moe_runner import MoERunner, SharedExpertsOrder
from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import UnquantizedFusedMoEMethod

from vllm_ascend.core.device.config import get_device_adaptor
from vllm_ascend.core.registry import MOE_PLACEMENTS


def _placement_schedule(vllm_config: Any, ep_size: int) -> Any:
    """The expert-placement schedule of the model being built (``None`` without one)."""
    if "default" not in MOE_PLACEMENTS:
        return None
    return MOE_PLACEMENTS.get("default")(vllm_config, ep_size)


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
    """Top-k routing over SiLU-gated experts through the device adaptor, on one rank or many.

    With a placement schedule (set on the first forward): ``expert_map [ranks, n]`` (local slot or -1),
    ``log2phy [ranks, n]`` (the physical slot each rank routes each logical expert to) and ``moe_load``
    (tokens routed to each physical slot).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._check_supported()
        vllm_config = get_current_vllm_config()
        spec = vllm_config.speculative_config
        self.decode_query_len = 1 + (spec.num_speculative_tokens or 0) if spec is not None else 1
        self.eplb = _placement_schedule(vllm_config, self.moe_config.ep_size)
        self.moe_index = self.eplb.register(self) if self.eplb is not None else -1
        self._expert_map: torch.Tensor | None = None
        self.log2phy: torch.Tensor | None = None
        self.moe_load: torch.Tensor | None = None
        self._placed: list[torch.nn.Parameter] = []

    def _check_supported(self) -> None:
        unsupported = {
            "routed_input_transform": self.routed_input_transform is not None,
            "routed_output_transform": self.routed_output_transform is not None,
            "router": not isinstance(self.router, FusedTopKRouter),
            "activation": self.routed_experts.activation is not MoEActivation.SILU,
            "has_bias": self.moe_config.has_bias,
        }
        bad = [name for name, flag in unsupported.items() if flag]
        if bad:
            raise NotImplementedError(
                f"{self.layer_name}: the Ascend MoE runner supports SiLU-gated experts with softmax/sigmoid "
                f"top-k routing; unsupported here: {bad} (router {type(self.router).__name__}, activation "
                f"{self.routed_experts.activation})"
            )

    @property
    def is_monolithic(self) -> bool:
        return False

    @property
    def expert_map(self) -> torch.Tensor | None:
        """``[ranks, n]`` local slot of each logical expert on each rank of the placement, -1 where absent."""
        return self._expert_map

    # placement (what a schedule drives) ----------------------------------------------------
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
        assert self.eplb is not None
        expert_map, log2phy = self.eplb.rank_maps(rank_table)
        self._expert_map = torch.as_tensor(expert_map, dtype=torch.int64)
        self.log2phy = torch.as_tensor(log2phy, dtype=torch.int64)

    # forward ---------------------------------------------------------------------------------
    def _apply_quant_method(
        self,
        hidden_states: torch.Tensor,
        router_logits: torch.Tensor,
        shared_experts_input: torch.Tensor | None,
        input_ids: torch.Tensor | None = None,
        shared_experts_overlapping: bool = False,
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        self._maybe_apply_shared_experts(shared_experts_input, SharedExpertsOrder.NO_OVERLAP)
        routed = self._routed_experts(hidden_states, router_logits)
        if shared_experts_overlapping:
            assert self._shared_experts is not None
            self._shared_experts.wait()
        return (self._shared_experts.output if self._shared_experts is not None else None), routed

    def _routed_experts(self, hidden_states: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        """This rank's share of the routed experts' output for every token (summed over ranks by vLLM)."""
        if self.eplb is not None and not self.eplb.started:
            self.eplb.begin(self.moe_config.num_logical_experts)
        adaptor = get_device_adaptor()
        router = self.router
        weights, logical = adaptor.moe_gating_top_k(
            router_logits, router.top_k, renormalize=router.renormalize, scoring=router.scoring_func
        )
        ids = self._local_ids(logical.long(), hidden_states.shape[0])
        if ids is not logical:
            weights = weights.masked_fill(ids < 0, 0.0)
            ids = ids.clamp_min(0)
        num_slots = self.routed_experts.w13_weight.shape[0]
        quant_method = self.routed_experts.quant_method
        if isinstance(quant_method, UnquantizedFusedMoEMethod):
            sorted_x, row_idx, counts = adaptor.moe_init_routing(hidden_states, ids, num_slots)
            w13 = self.routed_experts.w13_weight.transpose(1, 2)
            w2 = self.routed_experts.w2_weight.transpose(1, 2)
            act = adaptor.swiglu(adaptor.grouped_matmul(sorted_x, w13, counts))
            out = adaptor.moe_finalize_routing(adaptor.grouped_matmul(act, w2, counts), row_idx, weights)
        else:  # a quant scheme's experts: routing and grouped matmuls are the scheme's
            out = quant_method.apply(self.routed_experts, hidden_states, weights, ids)
        if self.moe_load is not None and self.eplb is not None:
            phase = _real_forward_phase(self.decode_query_len)
            if phase is not None:
                self.moe_load += torch.bincount(ids.reshape(-1), minlength=self.moe_load.numel())
                if self.moe_index == len(self.eplb.layers) - 1:
                    self.eplb.forward_end(phase)
        return out

    def _local_ids(self, logical: torch.Tensor, num_tokens: int) -> torch.Tensor:
        """Slot ids of this rank's experts: the placement's physical slots (tokens dealt round-robin to its
        ranks), vLLM's expert-parallel map (-1 for other ranks' experts), or the logical ids."""
        if self.log2phy is not None:
            ranks = self.log2phy.shape[0]
            token_rank = torch.arange(num_tokens, device=logical.device) % ranks
            return self.log2phy[token_rank[:, None], logical]
        ep_map = self.routed_experts.expert_map_manager.expert_map if self.moe_config.ep_size > 1 else None
        if ep_map is not None:
            return ep_map.to(logical.device)[logical]
        return logical
