"""Asynchronous point-to-point moves of expert weights between ranks (torch.distributed)."""

from __future__ import annotations

import enum
from typing import Any

import torch
import torch.distributed as dist

from vllm_ascend.eplb.adaptor import VllmEplbAdaptor
from vllm_ascend.eplb.placement import generate_expert_map, generate_log2phy_map
from vllm_ascend.eplb.worker import LayerUpdate


class ExpertWeightUpdateState(enum.Enum):
    WAITING = 0  # nothing in flight
    READY = 1  # a layer's task is composed, transfers not issued yet
    TRANSFERRING = 2  # sends/receives issued


class D2DExpertWeightLoader:
    """Moves one layer at a time: compose the task, issue isend/irecv into receive buffers, then
    (after the forward that overlaps the transfer) wait, copy the buffers into place and switch
    the layer's expert map and log2phy map. Old weights stay untouched until every send is done."""

    def __init__(self, adaptor: VllmEplbAdaptor, group: Any = None) -> None:
        self.adaptor = adaptor
        self.group = group
        self.state = ExpertWeightUpdateState.WAITING
        self._update: LayerUpdate | None = None
        self._local: list[tuple[int, list[torch.Tensor]]] = []  # (dst slot, buffers)
        self._reqs: list[Any] = []

    def _peer(self, rank: int) -> int:
        return rank if self.group is None else dist.get_global_rank(self.group, rank)

    def generate_expert_d2d_transfer_task(self, update: LayerUpdate) -> None:
        if self.state is not ExpertWeightUpdateState.WAITING:
            raise RuntimeError(f"a layer update is already {self.state.name.lower()}")
        self._update = update
        self.state = ExpertWeightUpdateState.READY

    def asyn_expert_weight_transfer(self) -> None:
        """Issue this rank's sends and receives for the composed task (in one global order)."""
        update = self._update
        if self.state is not ExpertWeightUpdateState.READY or update is None:
            raise RuntimeError("no composed layer task to transfer")
        me = self.adaptor.rank
        params = self.adaptor.expert_params(update.layer_id)
        self._local, self._reqs = [], []
        for tag, t in enumerate(update.transfers):
            if t.src_rank == me and t.dst_rank == me:
                self._local.append((t.dst_slot, [p[t.src_slot].clone() for p in params]))
            elif t.src_rank == me:
                for k, p in enumerate(params):
                    self._reqs.append(
                        dist.isend(
                            p[t.src_slot].contiguous(),
                            self._peer(t.dst_rank),
                            group=self.group,
                            tag=tag * len(params) + k,
                        )
                    )
            elif t.dst_rank == me:
                bufs = [torch.empty_like(p[t.dst_slot]) for p in params]
                for k, buf in enumerate(bufs):
                    self._reqs.append(
                        dist.irecv(buf, self._peer(t.src_rank), group=self.group, tag=tag * len(params) + k)
                    )
                self._local.append((t.dst_slot, bufs))
        self.state = ExpertWeightUpdateState.TRANSFERRING

    def update_expert_map_and_weight(self) -> int | None:
        """Finish the transfer in flight; returns the updated layer id (``None`` if idle)."""
        if self.state is ExpertWeightUpdateState.WAITING:
            return None
        if self.state is ExpertWeightUpdateState.READY:
            self.asyn_expert_weight_transfer()
        for req in self._reqs:
            req.wait()
        update, me = self._update, self.adaptor.rank
        if update is None:
            raise RuntimeError("a transfer finished without a layer update in flight")
        for slot, bufs in self._local:
            self.adaptor.do_update_expert_weight(update.layer_id, slot, bufs)
        table = update.new_table[None]
        self.adaptor.do_update_expert_map(update.layer_id, generate_expert_map(table)[0, me])
        self.adaptor.do_update_log2phy_map(
            update.layer_id, generate_log2phy_map(table, self.adaptor.tp_size)[0, me]
        )
        self._update, self._local, self._reqs = None, [], []
        self.state = ExpertWeightUpdateState.WAITING
        return update.layer_id
