"""The EPLB worker (sum loads, plan, compose weight moves) and the process that hosts it."""

from __future__ import annotations

import multiprocessing as mp
import queue
import threading
import traceback
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vllm_ascend.eplb.policy.base import EplbPolicy
from vllm_ascend.eplb.policy.factory import PolicyFactory, policy_class
from vllm_ascend.eplb.policy.packing import imbalance, logical_load
from vllm_ascend.eplb.validation import EplbInputError, as_expert_table, as_workload, valid_layers


@dataclass(frozen=True)
class Transfer:
    """Copy ``expert``'s weights from ``(src_rank, src_slot)`` of the old placement to
    ``(dst_rank, dst_slot)`` of the new one."""

    expert: int
    src_rank: int
    src_slot: int
    dst_rank: int
    dst_slot: int


@dataclass(frozen=True)
class LayerUpdate:
    layer_id: int
    old_table: np.ndarray  # [ranks, slots]
    new_table: np.ndarray  # [ranks, slots]
    transfers: tuple[Transfer, ...]


@dataclass
class EplbPlan:
    changed: bool
    updates: list[LayerUpdate] = field(default_factory=list)  # in priority order
    imbalance_before: np.ndarray | None = None  # per layer max/mean
    imbalance_after: np.ndarray | None = None
    hotness: np.ndarray | None = None  # [layers, n] share of each layer's tokens per logical expert
    new_table: np.ndarray | None = None


def compose_layer_transfers(old: np.ndarray, new: np.ndarray) -> tuple[Transfer, ...]:
    """Greedy source choice: every slot whose expert changes is fed by the old holder of that
    expert (the destination itself first) that has sent the least so far; deterministic, so all
    ranks derive the same list."""
    ranks, slots = old.shape
    holders: dict[int, list[tuple[int, int]]] = {}
    for r in range(ranks):
        for s in range(slots):
            holders.setdefault(int(old[r, s]), []).append((r, s))
    sent = np.zeros(ranks, dtype=np.int64)
    out = []
    for r in range(ranks):
        for s in range(slots):
            e = int(new[r, s])
            if old[r, s] == e:
                continue
            if e not in holders:
                raise EplbInputError(f"expert {e} of the new placement has no holder in the old placement")
            local = [h for h in holders[e] if h[0] == r]
            src = local[0] if local else min(holders[e], key=lambda h: (sent[h[0]], h[0], h[1]))
            sent[src[0]] += src[0] != r
            out.append(Transfer(e, src[0], src[1], r, s))
    return tuple(out)


class EplbWorker:
    """Turns collected loads into a placement plan with the configured policy."""

    def __init__(self, policy: str | int | type[EplbPolicy] = "default", policy_config: Any = None) -> None:
        self.policy = PolicyFactory.generate_policy(policy, policy_config)

    @staticmethod
    def fetch_and_sum_load_info(loads: Any) -> np.ndarray:
        """Per-rank loads ``[ranks, layers, slots]`` (or ``[windows, ranks, layers, slots]``, summed)
        → the policy's workload ``[layers, ranks, slots]``."""
        arr = np.asarray(
            loads.detach().cpu().numpy() if hasattr(loads, "detach") else loads, dtype=np.float64
        )
        if arr.ndim == 4:
            arr = arr.sum(axis=0)
        if arr.ndim != 3:
            raise EplbInputError(
                f"loads must be [ranks, layers, slots] or [windows, ranks, layers, slots], got {arr.shape}"
            )
        return arr.transpose(1, 0, 2)

    def calculate_rebalance_experts(
        self, table: np.ndarray, workload: np.ndarray
    ) -> tuple[bool, np.ndarray, np.ndarray]:
        return self.policy.rebalance_experts(table, workload)

    @staticmethod
    def check_expert_placement(old: np.ndarray, new: np.ndarray) -> np.ndarray:
        """Per layer: is ``new`` a valid successor of ``old``?"""
        return valid_layers(old, new, int(old.max()) + 1)

    @staticmethod
    def compose_expert_update_info_greedy(
        old: np.ndarray, new: np.ndarray, priority: np.ndarray
    ) -> list[LayerUpdate]:
        """One :class:`LayerUpdate` per changed layer, most-improved first."""
        changed = [int(li) for li in priority if (old[li] != new[li]).any()]
        changed += [li for li in range(old.shape[0]) if li not in changed and (old[li] != new[li]).any()]
        return [
            LayerUpdate(li, old[li].copy(), new[li].copy(), compose_layer_transfers(old[li], new[li]))
            for li in changed
        ]

    @staticmethod
    def _compute_imbalance(table: np.ndarray, load: np.ndarray) -> np.ndarray:
        """Per-layer max/mean rank load of ``table`` under logical loads ``[layers, n]``."""
        return imbalance(table, load)

    @staticmethod
    def _calculate_hotness(load: np.ndarray) -> np.ndarray:
        """Each logical expert's share of its layer's tokens."""
        total = load.sum(axis=1, keepdims=True)
        return np.divide(load, total, out=np.zeros_like(load), where=total > 0)

    def do_update(self, table: Any, workload: Any) -> EplbPlan:
        table = as_expert_table(table)
        workload = as_workload(workload, table.shape)
        changed, priority, new = self.calculate_rebalance_experts(table, workload)
        ok = self.check_expert_placement(table, new)
        new = np.where(ok[:, None, None], new, table)
        load = logical_load(table, workload, int(table.max()) + 1)
        plan = EplbPlan(
            changed=bool(changed),
            imbalance_before=self._compute_imbalance(table, load),
            imbalance_after=self._compute_imbalance(new, load),
            hotness=self._calculate_hotness(load),
            new_table=new,
        )
        if changed:
            plan.updates = self.compose_expert_update_info_greedy(table, new, priority)
        return plan


def _serve(policy: type[EplbPolicy], policy_config: Any, inbox: Any, outbox: Any) -> None:
    worker = EplbWorker(policy, policy_config)
    while True:
        job = inbox.get()
        if job is None:
            return
        try:
            outbox.put(("ok", worker.do_update(*job)))
        except Exception as exc:  # reported to the caller, which re-raises
            outbox.put(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


class EplbProcess:
    """Runs an :class:`EplbWorker` off the forward loop, fed through queues: in a spawned process, or
    in a thread where the caller may not have child processes (a daemonic worker process, as vLLM's
    multiprocessing executor starts). ``mode``: ``"auto"`` (default), ``"process"`` or ``"thread"``.
    The policy class is resolved here, so a policy another package registered reaches the child too."""

    def __init__(self, policy: str | int = "default", policy_config: Any = None, mode: str = "auto") -> None:
        if mode not in ("auto", "process", "thread"):
            raise EplbInputError(f"EplbProcess mode must be 'auto', 'process' or 'thread', got {mode!r}")
        if mode == "auto":
            mode = "thread" if mp.current_process().daemon else "process"
        self.mode = mode
        args_tail = (policy_class(policy), policy_config)
        self._inbox: Any
        self._outbox: Any
        self._proc: Any
        if mode == "process":
            ctx = mp.get_context("spawn")
            self._inbox, self._outbox = ctx.Queue(), ctx.Queue()
            self._proc = ctx.Process(
                target=_serve, args=(*args_tail, self._inbox, self._outbox), name="eplb-worker", daemon=True
            )
        else:
            self._inbox, self._outbox = queue.Queue(), queue.Queue()
            self._proc = threading.Thread(
                target=_serve, args=(*args_tail, self._inbox, self._outbox), name="eplb-worker", daemon=True
            )
        self.pending = 0

    def start(self) -> None:
        if not self._proc.is_alive():
            self._proc.start()

    def submit(self, table: np.ndarray, workload: np.ndarray) -> None:
        """Hand a placement and its workload to the worker process (non-blocking)."""
        self.start()
        # Copies: the queue serialises in a background thread while the caller reuses its buffers.
        self._inbox.put((np.array(table, copy=True), np.array(workload, copy=True)))
        self.pending += 1

    def get(self, timeout: float | None = None) -> EplbPlan | None:
        """The next plan; ``None`` if none arrives within ``timeout`` (0 = just poll)."""
        if not self.pending:
            return None
        try:
            status, payload = self._outbox.get(timeout=timeout) if timeout != 0 else self._outbox.get_nowait()
        except queue.Empty:
            return None
        self.pending -= 1
        if status == "error":
            raise RuntimeError(f"EPLB worker process failed: {payload}")
        return payload

    def shutdown(self, timeout: float = 10.0) -> None:
        if self._proc.is_alive():
            self._inbox.put(None)
            self._proc.join(timeout)
            if self._proc.is_alive() and self.mode == "process":
                self._proc.terminate()
                self._proc.join(timeout)
