"""Drives the rebalance lifecycle from the forward loop."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from vllm_ascend.eplb.adaptor import VllmEplbAdaptor
from vllm_ascend.eplb.config import EplbSettings
from vllm_ascend.eplb.d2d import D2DExpertWeightLoader, ExpertWeightUpdateState
from vllm_ascend.eplb.worker import EplbPlan, EplbProcess, LayerUpdate


class EplbUpdator:
    """Per rank: record expert loads after each real forward, every
    ``expert_heat_collection_interval`` steps hand the loads of all ranks to the EPLB process,
    ``algorithm_execution_interval`` steps later take its plan (all ranks at the same step, so the
    point-to-point moves pair up) and apply it one layer per forward: the transfer is issued in
    :meth:`forward_before` and overlaps the forward; :meth:`forward_end` completes it.

    The first ``num_warmup_iterations`` real forwards are not recorded; dummy/profile runs never are,
    nor are forwards while a plan is being computed or applied.
    """

    def __init__(
        self,
        settings: Any,
        adaptor: VllmEplbAdaptor,
        table: np.ndarray,
        group: Any = None,
        process: EplbProcess | None = None,
        on_plan: Callable[[EplbPlan], None] | None = None,
    ) -> None:
        self.settings = EplbSettings.from_any(settings)
        self.adaptor = adaptor
        self.table = np.array(table, dtype=np.int64)
        self.group = group
        self.process = process or EplbProcess(self.settings.eplb_policy_type)
        self.loader = D2DExpertWeightLoader(adaptor, group)
        self.on_plan = on_plan
        self.step = 0
        self.load = torch.zeros(adaptor.num_moe_layers, adaptor.slots_per_rank, dtype=torch.float64)
        self.collected = 0
        self.submitted_at: int | None = None
        self.pending: deque[LayerUpdate] = deque()
        self.plans_applied = 0

    # forward hooks ---------------------------------------------------------------------------
    def forward_before(self, dummy_run: bool = False) -> None:
        """Start moving the next layer's weights (never during dummy runs)."""
        if dummy_run or not self.pending or self.loader.state is not ExpertWeightUpdateState.WAITING:
            return
        self.loader.generate_expert_d2d_transfer_task(self.pending.popleft())
        self.loader.asyn_expert_weight_transfer()

    def forward_end(self, dummy_run: bool = False, record_load: bool = True) -> None:
        """Finish an in-flight layer move, record this forward's loads, drive the schedule."""
        if dummy_run:
            self.adaptor.clear_all_moe_loads()
            return
        layer = self.loader.update_expert_map_and_weight()
        if layer is not None and not self.pending:
            self.plans_applied += 1
        self.step += 1
        if record_load and self.step > self.settings.num_warmup_iterations and not self.busy:
            self.compute_and_set_moe_load()
        self.adaptor.clear_all_moe_loads()
        self.update_iteration()

    # schedule -------------------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        """A plan is being computed or applied: loads seen now belong to no single placement."""
        return bool(
            self.submitted_at is not None
            or self.pending
            or self.loader.state is not ExpertWeightUpdateState.WAITING
        )

    def compute_and_set_moe_load(self) -> None:
        self.load += self.adaptor.get_rank_expert_workload()
        self.collected += 1

    def update_iteration(self) -> None:
        s = self.settings
        if not self.busy and self.collected >= s.expert_heat_collection_interval:
            self.wakeup_eplb_worker()
        elif (
            self.submitted_at is not None and self.step - self.submitted_at >= s.algorithm_execution_interval
        ):
            plan = self.process.get(timeout=None)
            if plan is None:
                raise RuntimeError("the EPLB worker returned no plan for a submitted workload")
            self.update_expert_weight_flag(plan)

    def gather_loads(self) -> np.ndarray:
        """``[ranks, layers, slots]`` loads of every rank of the group."""
        if not dist.is_initialized() or self.adaptor.world_size == 1:
            return self.load.numpy()[None]
        parts = [torch.empty_like(self.load) for _ in range(self.adaptor.world_size)]
        dist.all_gather(parts, self.load, group=self.group)
        return torch.stack(parts).numpy()

    def wakeup_eplb_worker(self) -> None:
        loads = self.gather_loads()
        self.process.submit(self.table, loads.transpose(1, 0, 2))
        self.submitted_at = self.step
        self.load.zero_()
        self.collected = 0

    def update_expert_weight_flag(self, plan: EplbPlan) -> None:
        """Queue the plan's layer updates (most-improved layer first)."""
        self.submitted_at = None
        if self.on_plan is not None:
            self.on_plan(plan)
        if not plan.changed or not plan.updates or plan.new_table is None:
            return
        self.pending.extend(plan.updates)
        self.table = plan.new_table.copy()
        if self.settings.expert_map_record_path and self.adaptor.rank == 0:
            self.adaptor.export_expert_map(self.table, self.settings.expert_map_record_path)

    def warm_up_eplb(self) -> None:
        """Start the EPLB process, run the policy once on a uniform load and exercise the collective,
        so the first real rebalance pays no start-up cost."""
        uniform = np.ones((self.adaptor.num_moe_layers, self.table.shape[1], self.table.shape[2]))
        self.gather_loads()
        self.process.submit(self.table, uniform)
        self.process.get(timeout=None)

    def shutdown(self) -> None:
        self.process.shutdown()
