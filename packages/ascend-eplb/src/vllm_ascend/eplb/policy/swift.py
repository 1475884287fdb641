"""SwiftBalancer: incremental re-placement that moves few experts."""

from __future__ import annotations

import numpy as np
from vllm_ascend.eplb.policy.base import EplbPolicy
from vllm_ascend.eplb.policy.packing import (
    imbalance,
    keep_slots,
    logical_load,
    replica_counts,
    replica_counts_of,
    swap_refine,
    within_budget,
)


def swift_priority(load: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Claim on one more replica: the load a replica would still carry after adding it,
    ``w·(c+1)/(c+2)`` of its current per-replica share ``w/c``."""
    return load / counts * (counts + 1) / (counts + 2)


class SwiftBalanceEplb(EplbPolicy):
    """Start from the current placement and change only what pays off.

    Layers with max/mean below ``skip_threshold`` (1.01) are left alone. Replica counts are
    re-allocated (surplus copies leave the hottest ranks, new copies land on the coolest ranks that
    lack them); then the hottest rank swaps experts with cooler ranks while a swap lowers the pair's
    peak by at least ``min_swap_gain`` (0.2%; upstream uses 1%) of the mean rank load, up to ``max_swaps`` (100) swaps and
    ``max_move_fraction`` (0.3) of the layer's slots. A layer keeps the new plan only if its
    imbalance improves.
    """

    def plan(self, table: np.ndarray, workload: np.ndarray, n: int) -> np.ndarray:
        layers, ranks, slots = table.shape
        load = logical_load(table, workload, n)
        before = imbalance(table, load)
        todo = before >= self.option("skip_threshold", 1.01, lo=1.0)
        budget = np.full(layers, int(self.option("max_move_fraction", 0.3, lo=0.0, hi=1.0) * ranks * slots))
        target = replica_counts(load, ranks * slots, ranks, swift_priority)
        # only re-allocate replicas where the peak per-replica load really drops
        cur = replica_counts_of(table, n)
        worth = (load / target).max(axis=1) < 0.99 * (load / cur).max(axis=1)
        target = np.where(worth[:, None], target, cur)
        new, slot_w, budget = within_budget(table, load, target, budget)
        mean = load.sum(axis=1) / ranks
        new, _ = swap_refine(new, slot_w, n, self.option("max_swaps", 100, lo=0),
                             self.option("min_swap_gain", 0.002, lo=0.0) * mean, max_moved=budget,
                             candidates=None)
        new = keep_slots(table, new)
        keep = ~todo | (imbalance(new, load) >= before)
        return np.where(keep[:, None, None], table, new)
