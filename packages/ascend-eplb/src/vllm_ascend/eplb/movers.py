"""Weight movers: how the schedule reads expert loads and moves expert weights between slots.

A MoE layer taking part in EPLB (:class:`EplbLayer`) holds some physical slots of its layer's
``[ranks, slots]`` placement: all of them (:class:`LocalWeightMover`, one process hosting every rank)
or one rank's (:class:`D2DWeightMover`, one process per rank of a ``torch.distributed`` group).
A move is started at the end of one forward and finished at the end of the next, so a transfer
overlaps a forward; weights and maps switch together, when it finishes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from vllm_ascend.eplb.worker import EplbPlan, LayerUpdate


def _plan_decision(plan: EplbPlan | None) -> tuple[np.ndarray, np.ndarray] | None:
    """``(new table, layer priority)`` of a plan that changes the placement, else ``None``."""
    if plan is None or not plan.changed or not plan.updates or plan.new_table is None:
        return None
    return plan.new_table, np.array([u.layer_id for u in plan.updates], dtype=np.int64)


class EplbLayer(Protocol):
    """What EPLB needs from a MoE layer: per held physical slot, the tokens routed there since the last
    clear and the expert weights (first dimension: held slot); and a way to switch its routing maps."""

    moe_load: torch.Tensor
    #: The ``[ranks, slots]`` placement the layer routes by and holds (``None`` before the first).
    placement: np.ndarray | None

    def expert_weights(self) -> list[torch.Tensor]: ...

    def set_placement(self, rank_table: np.ndarray) -> None:
        """Route by this ``[ranks, slots]`` placement of the layer (expert map and log2phy)."""

    def install_placement(self, rank_table: np.ndarray) -> None:
        """Lay the layer's experts out in the physical slots of its first placement (before ``start``)."""


class WeightMover(ABC):
    """Reads loads and moves one layer's weights at a time (``start`` then ``finish``)."""

    rank: int

    def __init__(self) -> None:
        self._inflight: tuple[EplbLayer, LayerUpdate] | None = None

    @property
    def busy(self) -> bool:
        return self._inflight is not None

    def start(self, layer: EplbLayer, update: LayerUpdate) -> None:
        if self._inflight is not None:
            raise RuntimeError(f"layer {self._inflight[1].layer_id} is still being moved")
        self._inflight = (layer, update)
        self._issue(layer, update)

    def finish(self) -> int | None:
        """Complete the move in flight, switch the layer's maps; the moved layer id (``None`` if idle)."""
        if self._inflight is None:
            return None
        layer, update = self._inflight
        self._complete(layer, update)
        layer.set_placement(update.new_table)
        self._inflight = None
        return update.layer_id

    @abstractmethod
    def gather_loads(self, local: np.ndarray, shape: tuple[int, int, int]) -> np.ndarray:
        """This process's ``[layers, held slots]`` loads → every rank's ``[layers, ranks, slots]``."""

    @abstractmethod
    def agree(
        self, plan: EplbPlan | None, shape: tuple[int, int, int]
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """Rank 0's decision on every rank: ``(new [layers, ranks, slots] table, changed layers in
        priority order)``, or ``None`` when the placement stays."""

    @abstractmethod
    def _issue(self, layer: EplbLayer, update: LayerUpdate) -> None: ...

    @abstractmethod
    def _complete(self, layer: EplbLayer, update: LayerUpdate) -> None: ...


class LocalWeightMover(WeightMover):
    """Every rank's slots live in this process: physical slot ``rank * slots + slot``."""

    rank = 0

    def gather_loads(self, local: np.ndarray, shape: tuple[int, int, int]) -> np.ndarray:
        return local.reshape(shape).copy()

    def agree(
        self, plan: EplbPlan | None, shape: tuple[int, int, int]
    ) -> tuple[np.ndarray, np.ndarray] | None:
        return _plan_decision(plan)

    def _issue(self, layer: EplbLayer, update: LayerUpdate) -> None:
        """Nothing to send: the copies are made when the move finishes."""

    def _complete(self, layer: EplbLayer, update: LayerUpdate) -> None:
        slots = update.new_table.shape[1]
        moves = [(t.src_rank * slots + t.src_slot, t.dst_rank * slots + t.dst_slot) for t in update.transfers]
        for weight in layer.expert_weights():
            sources = {src: weight[src].clone() for src, _ in moves}  # read every source before any write
            for src, dst in moves:
                weight[dst].copy_(sources[src])


class D2DWeightMover(WeightMover):
    """One rank of ``group`` per process: ``isend``/``irecv`` of expert weights into receive buffers (old
    weights stay untouched until every send is done), then copies into place. Every rank must start and
    finish the same update at the same step, so the point-to-point pairs match. Loads and plans (host
    data) travel over ``cpu_group`` (a gloo group of the same ranks; default ``group``)."""

    def __init__(self, group: Any = None, cpu_group: Any = None) -> None:
        super().__init__()
        if not dist.is_initialized():
            raise RuntimeError("D2DWeightMover needs an initialised torch.distributed process group")
        self.group = group
        self.cpu_group = group if cpu_group is None else cpu_group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self._local: list[tuple[int, list[torch.Tensor]]] = []  # (dst slot, buffers)
        self._reqs: list[Any] = []

    def _peer(self, rank: int) -> int:
        return rank if self.group is None else dist.get_global_rank(self.group, rank)

    def gather_loads(self, local: np.ndarray, shape: tuple[int, int, int]) -> np.ndarray:
        mine = torch.as_tensor(np.ascontiguousarray(local, dtype=np.float64))
        parts = [torch.empty_like(mine) for _ in range(self.world_size)]
        dist.all_gather(parts, mine, group=self.cpu_group)
        return torch.stack(parts, dim=1).numpy().reshape(shape)

    def agree(
        self, plan: EplbPlan | None, shape: tuple[int, int, int]
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """One broadcast from rank 0: ``[changed, priority (layers, -1 padded), table]``."""
        layers = shape[0]
        message = torch.full((1 + layers + int(np.prod(shape)),), -1, dtype=torch.int64)
        decision = _plan_decision(plan) if self.rank == 0 else None
        if decision is not None:
            table, priority = decision
            message[0] = 1
            message[1 : 1 + len(priority)] = torch.as_tensor(priority)
            message[1 + layers :] = torch.as_tensor(np.asarray(table, dtype=np.int64).reshape(-1))
        dist.broadcast(message, src=self._peer(0), group=self.cpu_group)
        if int(message[0]) != 1:
            return None
        priority = message[1 : 1 + layers].numpy()
        return message[1 + layers :].numpy().reshape(shape).copy(), priority[priority >= 0].copy()

    def _issue(self, layer: EplbLayer, update: LayerUpdate) -> None:
        """This rank's sends and receives, in the one global order of ``update.transfers``."""
        params = layer.expert_weights()
        self._local, self._reqs = [], []
        for tag, t in enumerate(update.transfers):
            if t.src_rank == self.rank and t.dst_rank == self.rank:
                self._local.append((t.dst_slot, [p[t.src_slot].clone() for p in params]))
            elif t.src_rank == self.rank:
                for k, p in enumerate(params):
                    self._reqs.append(
                        dist.isend(
                            p[t.src_slot].contiguous(),
                            self._peer(t.dst_rank),
                            group=self.group,
                            tag=tag * len(params) + k,
                        )
                    )
            elif t.dst_rank == self.rank:
                bufs = [torch.empty_like(p[t.dst_slot]) for p in params]
                for k, buf in enumerate(bufs):
                    self._reqs.append(
                        dist.irecv(buf, self._peer(t.src_rank), group=self.group, tag=tag * len(params) + k)
                    )
                self._local.append((t.dst_slot, bufs))

    def _complete(self, layer: EplbLayer, update: LayerUpdate) -> None:
        for req in self._reqs:
            req.wait()
        for slot, bufs in self._local:
            for param, src in zip(layer.expert_weights(), bufs, strict=True):
                param[slot].copy_(src)
        self._local, self._reqs = [], []
