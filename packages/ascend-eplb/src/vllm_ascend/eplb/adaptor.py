"""Bridge between the EPLB lifecycle and a model's MoE layers.

A MoE layer takes part when it carries, per rank: expert weight tensors whose first dimension is
the local slot (``w13_weight``, ``w2_weight`` by default), ``expert_map`` (``[n]`` local slot or -1),
``log2phy`` (``[n]`` physical slot id each logical expert is routed to) and ``moe_load`` (``[slots]``
tokens routed to each local slot since the last clear).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch

from vllm_ascend.eplb.expert_map_file import save_expert_map
from vllm_ascend.eplb.placement import generate_expert_map, generate_log2phy_map

EPLB_ATTRS = ("expert_map", "log2phy", "moe_load")


def unwrap_moe(module: Any) -> Any:
    """The module that carries the EPLB attributes, looking through common wrappers."""
    seen = 0
    while not all(hasattr(module, a) for a in EPLB_ATTRS):
        inner = next(
            (
                getattr(module, a)
                for a in ("base_layer", "moe", "experts", "runner")
                if getattr(module, a, None) is not None
            ),
            None,
        )
        if inner is None or seen > 8:
            raise TypeError(f"{type(module).__name__} is not an EPLB-capable MoE layer (needs {EPLB_ATTRS})")
        module, seen = inner, seen + 1
    return module


class VllmEplbAdaptor:
    """Registered MoE layers of one rank, in layer order."""

    def __init__(
        self,
        rank: int = 0,
        world_size: int = 1,
        tp_size: int = 1,
        weight_names: Sequence[str] = ("w13_weight", "w2_weight"),
    ) -> None:
        self.rank, self.world_size, self.tp_size = rank, world_size, tp_size
        self.weight_names = tuple(weight_names)
        self.layers: list[Any] = []

    @classmethod
    def from_model(cls, model: Any, **kwargs: Any) -> VllmEplbAdaptor:
        """Register every EPLB-capable MoE module of ``model`` in module order."""
        adaptor = cls(**kwargs)
        for _, module in model.named_modules():
            if all(hasattr(module, a) for a in EPLB_ATTRS):
                adaptor.register_layer(module)
        return adaptor

    def register_layer(self, module: Any) -> int:
        layer = unwrap_moe(module)
        missing = [n for n in self.weight_names if not isinstance(getattr(layer, n, None), torch.Tensor)]
        if missing:
            raise TypeError(f"MoE layer {len(self.layers)} lacks expert weight tensors {missing}")
        slots = {getattr(layer, n).shape[0] for n in self.weight_names} | {layer.moe_load.shape[0]}
        if len(slots) != 1 or (self.layers and slots != {self.slots_per_rank}):
            raise ValueError(
                f"MoE layer {len(self.layers)}: expert weights and moe_load disagree on slots {slots}"
            )
        self.layers.append(layer)
        return len(self.layers) - 1

    @property
    def num_moe_layers(self) -> int:
        return len(self.layers)

    @property
    def slots_per_rank(self) -> int:
        return int(self.layers[0].moe_load.shape[0])

    def expert_params(self, layer_id: int) -> list[torch.Tensor]:
        layer = self.layers[layer_id]
        return [
            getattr(layer, n).data if isinstance(getattr(layer, n), torch.nn.Parameter) else getattr(layer, n)
            for n in self.weight_names
        ]

    def get_rank_expert_workload(self) -> torch.Tensor:
        """``[layers, slots]`` loads of this rank since the last clear."""
        return torch.stack([layer.moe_load.detach().to(torch.float64).cpu() for layer in self.layers])

    def clear_all_moe_loads(self) -> None:
        for layer in self.layers:
            layer.moe_load.zero_()

    def do_update_expert_map(self, layer_id: int, expert_map: Iterable[int]) -> None:
        target = self.layers[layer_id].expert_map
        target.copy_(torch.as_tensor(np.asarray(expert_map), dtype=target.dtype))

    def do_update_log2phy_map(self, layer_id: int, log2phy: Iterable[int]) -> None:
        target = self.layers[layer_id].log2phy
        target.copy_(torch.as_tensor(np.asarray(log2phy), dtype=target.dtype))

    def do_update_expert_weight(self, layer_id: int, slot: int, tensors: Sequence[torch.Tensor]) -> None:
        for param, src in zip(self.expert_params(layer_id), tensors, strict=True):
            param[slot].copy_(src)

    def apply_placement(self, table: np.ndarray, layer_ids: Iterable[int] | None = None) -> None:
        """Set expert maps and log2phy maps of this rank from a global ``[layers, ranks, slots]`` table."""
        ids = range(self.num_moe_layers) if layer_ids is None else list(layer_ids)
        emap, l2p = generate_expert_map(table), generate_log2phy_map(table, self.tp_size)
        for li in ids:
            self.do_update_expert_map(li, emap[li, self.rank])
            self.do_update_log2phy_map(li, l2p[li, self.rank])

    def export_expert_map(self, table: np.ndarray, path: str | os.PathLike[str]) -> None:
        save_expert_map(table, path)
