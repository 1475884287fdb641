"""Expert placement of every MoE layer of one process, and dynamic EPLB driven from the forward loop.

The reference device runs the whole model in one process, so this process hosts every physical slot
of the placement: ``ranks × slots`` expert copies per layer, where ``ranks`` comes from the expert-map
file (its ``device_count``) or is 1. Tokens are dealt round-robin to those ranks (token ``t`` routes
with rank ``t % ranks``'s log2phy row), so replicas really share the traffic, and a rebalance moves
weights between slots inside this process.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np
import torch

from vllm_ascend.eplb.config import EplbInit, EplbSettings, init_eplb_config
from vllm_ascend.eplb.expert_map_file import expert_file_to_tensor
from vllm_ascend.eplb.placement import generate_expert_map, generate_log2phy_map
from vllm_ascend.eplb.worker import EplbPlan, EplbProcess


class HostPlacement:
    """The MoE layers of one model (in construction order), their placement and the EPLB schedule.

    Layers register at construction; :meth:`install` runs once, on the first forward after weight
    loading: it reads the placement (``init_eplb_config``) and gives each layer its physical weights,
    ``expert_map [ranks, n]``, ``log2phy [ranks, n]`` and ``moe_load [ranks * slots]``.
    """

    def __init__(self, settings: Any, num_experts: int) -> None:
        self.settings = EplbSettings.from_any(settings)
        self.num_experts = num_experts
        self.layers: list[Any] = []
        self.init: EplbInit | None = None
        self.table: np.ndarray | None = None
        self.process: EplbProcess | None = None
        if self.settings.dynamic_eplb:
            # The policy runs in its own process, off the forward loop.
            self.process = EplbProcess(self.settings.eplb_policy_type, mode="process")
            weakref.finalize(self, self.process.shutdown)
        self.step = 0
        self.collected = 0
        self.load: np.ndarray | None = None
        self.plan_due = 0  # step at which the submitted plan is applied; 0 when none is pending
        #: Every plan received, ``(step, plan)``, oldest first.
        self.plans: list[tuple[int, EplbPlan]] = []
        #: Every placement applied by dynamic EPLB, ``(step, table)``, oldest first.
        self.rebalances: list[tuple[int, np.ndarray]] = []

    @property
    def installed(self) -> bool:
        return self.init is not None

    def register(self, layer: Any) -> int:
        if self.installed:
            raise RuntimeError("MoE layers must all be built before the first forward")
        self.layers.append(layer)
        return len(self.layers) - 1

    def install(self) -> None:
        path = self.settings.expert_map_path
        ranks = int(expert_file_to_tensor(path)[2]) if path else 1
        self.init = init_eplb_config(self.settings, self.num_experts, ranks, len(self.layers))
        self.table = self.init.global_table.copy()
        for layer_id, layer in enumerate(self.layers):
            layer.install_placement(self.table[layer_id])
        self.load = np.zeros((len(self.layers), self.table.shape[1] * self.table.shape[2]))

    def end_of_forward(self) -> None:
        """After the last MoE layer of a real (non-dummy) forward: record loads, drive the schedule."""
        self.step += 1
        s = self.settings
        if self.process is None:
            return  # static placement: moe_load keeps the running totals
        assert self.table is not None and self.load is not None
        window = np.stack([layer.moe_load.double().numpy() for layer in self.layers])
        for layer in self.layers:
            layer.moe_load.zero_()
        if self.plan_due:
            if self.step >= self.plan_due:
                plan = self.process.get(timeout=None)
                assert plan is not None
                self.plans.append((self.step, plan))
                self._apply(plan)
                self.plan_due = 0
            return
        if self.step <= s.num_warmup_iterations:
            return
        self.load += window
        self.collected += 1
        if self.collected >= s.expert_heat_collection_interval:
            # Copies: the queue pickles in a background thread, after the window below is reset.
            self.process.submit(self.table.copy(), self.load.reshape(self.table.shape).copy())
            self.plan_due = self.step + s.algorithm_execution_interval
            self.load[:] = 0
            self.collected = 0

    def _apply(self, plan: EplbPlan) -> None:
        if not plan.changed or not plan.updates:
            return
        assert self.table is not None
        slots = self.table.shape[2]
        for update in plan.updates:
            layer = self.layers[update.layer_id]
            moves = [
                (t.src_rank * slots + t.src_slot, t.dst_rank * slots + t.dst_slot) for t in update.transfers
            ]
            layer.move_experts(moves, update.new_table)
            self.table[update.layer_id] = update.new_table
        self.rebalances.append((self.step, self.table.copy()))


def physical_maps(rank_table: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """``(expert_map [ranks, n], log2phy [ranks, n])`` of one layer's ``[ranks, slots]`` placement."""
    table = rank_table[None]
    return (
        torch.as_tensor(generate_expert_map(table)[0], dtype=torch.int64),
        torch.as_tensor(generate_log2phy_map(table)[0], dtype=torch.int64),
    )
