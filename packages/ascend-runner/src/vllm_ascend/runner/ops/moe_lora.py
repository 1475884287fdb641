"""Fused-MoE LoRA on ``AscendMoERunner``: vLLM 0.32's MoE LoRA layers without their modular kernel.

vLLM's ``FusedMoEWithLoRA`` (per-expert adapters: ``experts.<e>.gate_proj`` / ``up_proj`` / ``down_proj``, and
PEFT ``target_parameters`` adapters on transformers-5 3D experts with ``enable_mixed_moe_lora_format``) and
``FusedMoE3DWithLoRA`` (models declaring 3D expert weights) hold the adapters' stacked weights — ``w13_lora_a``
``[slots, E, rank, H]``, ``w13_lora_b`` ``[slots, E, I (or 2I), rank]``, ``w2_lora_a`` ``[slots, E, rank, I]``,
``w2_lora_b`` ``[slots, E, H, rank]`` — and load, slice and set them; they then hand a LoRA context to a
modular Triton kernel, which our monolithic runner does not have. The Ascend layers below keep vLLM's weight
handling and instead give the runner an :class:`ExpertLoRA`: after each grouped matmul the runner adds, per
(token, expert) row, ``x @ A^T @ B^T`` of the token's adapter and the row's expert (vLLM folds the scaling into
B when it loads an adapter), through the kernels' LoRA shrink/expand with the row index ``slot * E + expert``
over the stacked weights viewed as ``[slots * E, ...]``.

Registered ahead of vLLM's classes in ``vllm.lora.utils._all_lora_classes`` by the op registry. Core's
platform refuses expert/data parallelism and shared-outer adapters (``enable_moe_shared_loras``) for MoE LoRA;
each layer refuses by name: expert parallelism, data parallelism, quantized experts and gpt-oss-style experts
(``swigluoai`` activation or expert biases). On one rank an expert-placement schedule may compute an expert in
another slot (or several): rows take their adapter by logical expert.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
from vllm.lora.layers.base import BaseLayerWithLoRA
from vllm.lora.layers.fused_moe import FusedMoE3DWithLoRA, FusedMoEWithLoRA
from vllm.lora.layers.utils import _get_lora_device
from vllm.lora.punica_wrapper.punica_base import PunicaWrapperBase
from vllm.model_executor.layers.fused_moe.activation import MoEActivation
from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import UnquantizedFusedMoEMethod

from vllm_ascend.kernels.lora import lora_expand, lora_shrink
from vllm_ascend.runner.ops.moe import AscendMoERunner


def add_expert_lora(
    out: torch.Tensor,
    x: torch.Tensor,
    lora_a: tuple[torch.Tensor, ...],
    lora_b: tuple[torch.Tensor, ...],
    row_slots: torch.Tensor,
) -> None:
    """``out[n, slice_i] += x[n] @ A_i[s, e]^T @ B_i[s, e]^T`` for each row ``n`` with ``row_slots[n] = s * E + e
    >= 0``; in place, rows with ``-1`` untouched.

    ``lora_a``: per output slice ``[slots, E, rank, in]``; ``lora_b``: ``[slots, E, width_i, rank]``, the slices
    laid side by side in ``out``'s columns (gate then up for a 2D gated w13; one slice otherwise).
    """
    offset = 0
    for a, b in zip(lora_a, lora_b, strict=True):
        slots, experts, rank, width = a.shape[0], a.shape[1], a.shape[2], b.shape[2]
        buffer = torch.zeros(x.shape[0], rank, dtype=torch.float32, device=x.device)
        lora_shrink(x, a.reshape(slots * experts, rank, a.shape[3]), buffer, row_slots, 1.0)
        lora_expand(buffer, b.reshape(slots * experts, width, rank), out, row_slots, offset, True)
        offset += width


@dataclass(frozen=True)
class ExpertLoRA:
    """One MoE layer's adapter weights (stacked by slot, filled in place by vLLM) and the punica wrapper that
    holds the step's token -> slot mapping; what ``AscendMoERunner`` applies to its expert rows."""

    w13_a: tuple[torch.Tensor, ...]
    w13_b: tuple[torch.Tensor, ...]
    w2_a: tuple[torch.Tensor, ...]
    w2_b: tuple[torch.Tensor, ...]
    punica: PunicaWrapperBase

    def row_slots(
        self, local_ids: torch.Tensor, logical_ids: torch.Tensor, num_local: int
    ) -> torch.Tensor | None:
        """``slot * E + expert`` of each row ``moe_init_routing`` sorts ``local_ids [T, k]`` into (by local slot,
        ties by ``t*k + j``), -1 for rows without an adapter or on another rank; ``None`` when vLLM's prefill
        metadata (every step of its V1 and V2 runners) says no token of the step has one, read without a device
        sync. ``expert`` is the row's logical expert (``logical_ids [T, k]``): adapters are
        per logical expert, whatever physical slot a placement schedule computes it in."""
        if self.punica.is_prefill and self.punica.no_lora:
            return None
        num_tokens, k = local_ids.shape
        mapped = self.punica.token_lora_indices[:num_tokens].to(local_ids.device, torch.int64)
        token_slots = torch.full((num_tokens,), -1, dtype=torch.int64, device=local_ids.device)
        token_slots[: mapped.shape[0]] = mapped
        ids = torch.where(local_ids < 0, num_local, local_ids).reshape(-1)
        order = torch.argsort(ids, stable=True)
        slot, expert = token_slots[order // k], logical_ids.reshape(-1)[order].to(torch.int64)
        experts = self.w13_a[0].shape[1]
        return torch.where((slot >= 0) & (ids[order] < num_local), slot * experts + expert, -1)

    def add_w13(self, out: torch.Tensor, x: torch.Tensor, row_slots: torch.Tensor) -> None:
        """The adapters' gate/up delta on the first grouped matmul's ``[rows, 2I]`` output."""
        add_expert_lora(out, x, self.w13_a, self.w13_b, row_slots)

    def add_w2(self, out: torch.Tensor, x: torch.Tensor, row_slots: torch.Tensor) -> None:
        """The adapters' down delta on the second grouped matmul's ``[rows, H]`` output."""
        add_expert_lora(out, x, self.w2_a, self.w2_b, row_slots)


def _check_runner(runner: AscendMoERunner) -> None:
    """Refuse, by name, the MoE layers whose expert rows this LoRA path does not serve."""
    moe = runner.moe_config
    refused = {
        f"expert parallelism (ep_size={moe.ep_size}; allowed: 1)": moe.ep_size != 1,
        f"data parallelism (dp_size={moe.dp_size}; allowed: 1)": moe.dp_size != 1,
        f"quantized experts ({type(runner.routed_experts.quant_method).__name__}; allowed: unquantized)": (
            not isinstance(runner.routed_experts.quant_method, UnquantizedFusedMoEMethod)
        ),
        f"activation {runner.routed_experts.activation.value} (allowed: silu)": (
            runner.routed_experts.activation is not MoEActivation.SILU
        ),
        "expert biases (allowed: none)": moe.has_bias,
    }
    bad = [what for what, flag in refused.items() if flag]
    if bad:
        raise NotImplementedError(
            f"{runner.layer_name}: fused-MoE LoRA on Ascend does not support {', '.join(bad)}"
        )


def _init_without_kernel(layer: Any, base_layer: AscendMoERunner, w13_slices: int) -> None:
    """What vLLM's ``FusedMoEWithLoRA.__init__`` sets, less its modular kernel and LoRA CUDA streams."""
    _check_runner(base_layer)
    BaseLayerWithLoRA.__init__(layer)
    layer.base_layer = base_layer
    layer.moe_config = base_layer.moe_config
    layer._shared_experts = base_layer._shared_experts
    base_layer.routed_experts.lora_base_layer_prefix = "base_layer."
    parallel = layer.moe_config.moe_parallel_config
    layer.tp_size, layer.tp_rank = parallel.tp_size, parallel.tp_rank
    layer.device = _get_lora_device(base_layer)
    layer._w13_slices = w13_slices
    layer.enable_moe_shared_loras = False
    layer.n_slices = layer.local_num_experts * (w13_slices + 1)


def _attach(layer: Any, punica_wrapper: PunicaWrapperBase) -> None:
    """Keep the mapping and hand the runner its :class:`ExpertLoRA` (a plain object: no module cycle)."""
    BaseLayerWithLoRA.set_mapping(layer, punica_wrapper)
    layer.base_layer.expert_lora = ExpertLoRA(
        layer.w13_lora_a_stacked,
        layer.w13_lora_b_stacked,
        layer.w2_lora_a_stacked,
        layer.w2_lora_b_stacked,
        punica_wrapper,
    )


class _OnAscendMoERunner:
    """What both Ascend MoE LoRA layers share: the runner gets the adapters at ``set_mapping``; a layer replaces
    an ``AscendMoERunner`` whose packed modules number its ``_PACKED`` (vLLM's rule between 2D and 3D)."""

    _PACKED: int

    def set_mapping(self, punica_wrapper: PunicaWrapperBase) -> None:
        _attach(self, punica_wrapper)

    @classmethod
    def can_replace_layer(
        cls, source_layer: nn.Module, lora_config: Any, packed_modules_list: list, model_config: Any = None
    ) -> bool:
        return isinstance(source_layer, AscendMoERunner) and len(packed_modules_list) == cls._PACKED


class AscendFusedMoEWithLoRA(_OnAscendMoERunner, FusedMoEWithLoRA):
    """vLLM's 2D MoE LoRA layer (separate gate and up adapters per expert) on ``AscendMoERunner``."""

    _PACKED = 2

    def __init__(self, base_layer: AscendMoERunner) -> None:
        _init_without_kernel(self, base_layer, 2 if base_layer.moe_config.is_act_and_mul else 1)


class AscendFusedMoE3DWithLoRA(_OnAscendMoERunner, FusedMoE3DWithLoRA):
    """vLLM's 3D MoE LoRA layer (one fused gate-up adapter per expert) on ``AscendMoERunner``."""

    _PACKED = 1

    def __init__(self, base_layer: AscendMoERunner) -> None:
        _init_without_kernel(self, base_layer, 1)


# vLLM's LoRA manager builds warm-up (dummy) adapters by the class *name* of its MoE layers.
AscendFusedMoEWithLoRA.__name__ = FusedMoEWithLoRA.__name__
AscendFusedMoE3DWithLoRA.__name__ = FusedMoE3DWithLoRA.__name__

#: Registered ahead of vLLM's LoRA classes (``vllm.lora.utils._all_lora_classes``) by the op registry.
LORA_LAYERS: tuple[type[BaseLayerWithLoRA], ...] = (AscendFusedMoEWithLoRA, AscendFusedMoE3DWithLoRA)
