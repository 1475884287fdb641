"""The EPLB schedule: the one object that drives expert placement from the forward loop."""

from __future__ import annotations

import weakref
from collections import deque

import numpy as np

from vllm_ascend.core.sdk import init_logger
from vllm_ascend.eplb.config import EplbConfig
from vllm_ascend.eplb.expert_map_file import save_expert_map
from vllm_ascend.eplb.movers import EplbLayer, WeightMover
from vllm_ascend.eplb.placement import rank_maps
from vllm_ascend.eplb.policy.packing import imbalance, logical_load
from vllm_ascend.eplb.validation import as_expert_table
from vllm_ascend.eplb.worker import EplbPlan, EplbProcess, EplbWorker, LayerUpdate, compose_layer_transfers

logger = init_logger(__name__)


def rank_imbalance(workload: np.ndarray) -> float:
    """Mean over layers of max/mean rank load of a ``[layers, ranks, slots]`` workload (1.0 = balanced)."""
    ranks = workload.sum(axis=2)
    mean = ranks.mean(axis=1)
    ratio = np.divide(ranks.max(axis=1), mean, out=np.ones_like(mean), where=mean > 0)
    return float(ratio.mean())


class EplbUpdator:
    """Expert placement of one model's MoE layers, and dynamic EPLB.

    Layers :meth:`register` in model order; :meth:`start` gives them the initial placement. With
    ``dynamic_eplb``, :meth:`forward_end` (after every forward, dummy ones included, so that every
    expert-parallel rank counts the same steps) runs the schedule:

    - the first ``num_warmup_iterations`` forwards are not recorded (dummy runs never are);
    - then a window of ``expert_heat_collection_interval`` forwards is collected: each forward's loads are
      added when its batch matches ``load_collection_phase`` (``all``; ``prefill``: the batch has a
      request with more than one new token; ``decode``: it has none). The window counts forwards, not
      recorded ones, so every rank submits at the same step;
    - the gathered loads (the same on every rank) go to the policy (an :class:`EplbProcess` off the
      forward loop, on the mover's rank 0); its plan is taken ``algorithm_execution_interval`` forwards
      later, shared with every rank (``mover.agree``) and written to ``expert_map_record_path``;
    - the plan's changed layers are moved one per forward (most improved first) by the ``mover``;
      no loads are recorded until the last layer has switched, then the next window opens.

    Without ``dynamic_eplb`` the layers' ``moe_load`` keeps running totals.
    """

    def __init__(self, config: EplbConfig, mover: WeightMover, process: EplbProcess | None = None) -> None:
        self.config = config
        self.mover = mover
        self.layers: list[EplbLayer] = []
        self.table: np.ndarray | None = None
        self.process = process
        if config.dynamic_eplb and process is None and mover.rank == 0:
            self.process = EplbProcess(config.policy_name)
            weakref.finalize(self, self.process.shutdown)
        self.step = 0
        self.load: np.ndarray | None = None
        self.window_steps = 0
        self.submitted_at: int | None = None
        self.pending: deque[LayerUpdate] = deque()
        self.last_plan: EplbPlan | None = None
        #: The latest placements fully applied by dynamic EPLB, ``(step, table)``, oldest first.
        self.rebalances: deque[tuple[int, np.ndarray]] = deque(maxlen=8)
        #: Per collected window: ``(step, measured per-rank imbalance, imbalance the plan predicts)`` (the
        #: prediction is ``None`` until a plan for that window is taken).
        self.windows: deque[list[float | int | None]] = deque(maxlen=32)
        self._workload: np.ndarray | None = None  # the last submitted window's [layers, ranks, slots] loads

    @property
    def started(self) -> bool:
        return self.table is not None

    def register(self, layer: EplbLayer) -> int:
        if self.started:
            raise RuntimeError("MoE layers must all be registered before the placement starts")
        self.layers.append(layer)
        return len(self.layers) - 1

    @staticmethod
    def rank_maps(rank_table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(expert_map, log2phy)`` of one layer's ``[ranks, slots]`` placement, for the layer's routing."""
        return rank_maps(rank_table)

    def begin(self, num_experts: int, loaded: np.ndarray | None = None) -> None:
        """On the first forward (weights are loaded): lay every registered layer's experts out in the physical
        slots of the initial placement, then start.

        One process (``loaded`` is ``None``): the layers copy their experts into the initial placement's
        slots (rank count from ``expert_map_path``, else 1). Expert parallel: ``loaded [ranks, slots]`` is
        where the weights were loaded (the same for every layer); with ``expert_map_path`` the ranks then
        exchange experts into that placement before the first forward runs."""
        if loaded is None:
            table = self.config.initial_table(num_experts, len(self.layers))
            for layer, rank_table in zip(self.layers, table, strict=True):
                layer.install_placement(rank_table)
            self.start(table)
            return
        table = np.broadcast_to(loaded, (len(self.layers), *loaded.shape)).copy()
        for layer, rank_table in zip(self.layers, table, strict=True):
            layer.install_placement(rank_table)
        self.start(table)
        if self.config.expert_map_path is None:
            return
        target = as_expert_table(self.config.initial_table(num_experts, len(self.layers)), "expert_map_path")
        if target.shape != table.shape:
            raise ValueError(
                f"expert map {self.config.expert_map_path!r} has {target.shape[1]} ranks x {target.shape[2]} "
                f"slots; the model is served over {table.shape[1]} ranks x {table.shape[2]} slots"
            )
        for li, layer in enumerate(self.layers):
            if (table[li] != target[li]).any():
                self.mover.start(
                    layer,
                    LayerUpdate(li, table[li], target[li], compose_layer_transfers(table[li], target[li])),
                )
                self.mover.finish()
        self.table = target.copy()

    def start(self, table: np.ndarray) -> None:
        """Route every layer by ``table`` ``[layers, ranks, slots]`` (the layers already hold its weights)."""
        table = as_expert_table(table, "initial expert table")
        if table.shape[0] != len(self.layers):
            raise ValueError(
                f"the placement has {table.shape[0]} layers; {len(self.layers)} MoE layers registered"
            )
        self.table = table.copy()
        for layer, rank_table in zip(self.layers, self.table, strict=True):
            layer.set_placement(rank_table)
        self.load = np.zeros((len(self.layers), self.layers[0].moe_load.numel()))

    def settle(self) -> None:
        """Finish the layer move in flight now (before a weight update rewrites the layers' weights)."""
        if self.mover.finish() is not None and not self.pending:
            assert self.table is not None
            self.rebalances.append((self.step, self.table.copy()))

    def relayout(self, layer_index: int, laid_out_as: np.ndarray) -> None:
        """Layer ``layer_index``'s weights were rewritten laid out as ``laid_out_as`` ``[ranks, slots]`` (a weight
        update loads checkpoint experts where vLLM loaded them): move them back into the placement the layer
        routes by. Every rank calls it at the same point (the mover's transfers pair up)."""
        layer = self.layers[layer_index]
        current = np.asarray(layer.placement)
        if np.array_equal(current, laid_out_as):
            return
        transfers = compose_layer_transfers(laid_out_as, current)
        self.mover.start(layer, LayerUpdate(layer_index, np.asarray(laid_out_as), current, transfers))
        self.mover.finish()

    @property
    def busy(self) -> bool:
        """A plan is being computed or applied: loads seen now belong to no single placement."""
        return self.submitted_at is not None or bool(self.pending) or self.mover.busy

    def forward_end(self, phase: str | None = "all") -> None:
        """After every forward: finish the layer move in flight, record this forward's loads (``phase``: the
        batch's, ``prefill`` or ``decode``; ``None`` for a dummy forward, not recorded), drive the schedule,
        start the next layer move."""
        if self.table is None or self.load is None:
            raise RuntimeError("EplbUpdator.start() must run before the first forward")
        self.step += 1
        if not self.config.dynamic_eplb:
            return
        window = np.stack([layer.moe_load.double().cpu().numpy() for layer in self.layers])
        for layer in self.layers:
            layer.moe_load.zero_()
        if self.mover.finish() is not None and not self.pending:
            self.rebalances.append((self.step, self.table.copy()))
        if self.step > self.config.num_warmup_iterations and not self.busy:
            self.window_steps += 1
            if phase is not None and self.config.load_collection_phase in ("all", phase):
                self.load += window
            if self.window_steps >= self.config.expert_heat_collection_interval:
                self._submit()
        elif (
            self.submitted_at is not None
            and self.step - self.submitted_at >= self.config.algorithm_execution_interval
        ):
            self._take_plan()
        if self.pending and not self.mover.busy:
            update = self.pending.popleft()
            self.mover.start(self.layers[update.layer_id], update)

    def _submit(self) -> None:
        assert self.table is not None and self.load is not None
        workload = self.mover.gather_loads(self.load, self.table.shape)
        self.load[:] = 0
        self.window_steps = 0
        if workload.any():  # the same on every rank; a window without matching batches plans nothing
            self.windows.append([self.step, rank_imbalance(workload), None])
            self._workload = workload
            if self.process is not None:
                self.process.submit(self.table, workload)
            self.submitted_at = self.step

    def _take_plan(self) -> None:
        assert self.table is not None and self._workload is not None
        plan = None
        if self.process is not None:
            plan = self.process.get(timeout=None)
            if plan is None:
                raise RuntimeError("the EPLB policy process returned no plan for a submitted workload")
            self.last_plan = plan
        self.submitted_at = None
        agreed = self.mover.agree(plan, self.table.shape)
        if agreed is None:
            return
        new_table, priority = agreed
        self.pending.extend(EplbWorker.compose_expert_update_info_greedy(self.table, new_table, priority))
        load = logical_load(self.table, self._workload, int(self.table.max()) + 1)
        predicted = float(imbalance(new_table, load).mean())
        self.windows[-1][2] = predicted
        if self.mover.rank == 0:
            logger.info(
                "EPLB plan at step %d: per-rank load max/mean %.3f measured, %.3f with the new placement; "
                "%d of %d layers move",
                self.step,
                self.windows[-1][1],
                predicted,
                len(self.pending),
                len(self.layers),
            )
        self.table = new_table.copy()
        record = self.config.expert_map_record_path
        if record is not None and self.mover.rank == 0:
            save_expert_map(self.table, record)

    def shutdown(self) -> None:
        if self.process is not None:
            self.process.shutdown()
