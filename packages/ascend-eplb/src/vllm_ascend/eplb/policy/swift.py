"""SwiftBalancer: incremental re-placement that moves few experts."""

from __future__ import annotations

import numpy as np

from vllm_ascend.eplb.policy.base import EplbPolicy
from vllm_ascend.eplb.policy.packing import (
    better,
    chain_refine,
    imbalance,
    keep_slots,
    logical_load,
    moved_slots,
    repack_extremes,
    replica_counts_of,
    retarget_replicas,
    shift_replicas,
    slot_weights,
    swap_refine,
    swap_refine_widening,
    swap_threshold,
)


class SwiftBalanceEplb(EplbPolicy):
    """Start from the current placement and change only what pays off.

    Layers with max/mean below ``skip_threshold`` (1.01) are left alone. Replicas shift, one at a
    time and within the move budget, from the expert that needs them least to the one with the
    highest per-replica load; each new copy overwrites the surplus copy whose rank ends up least
    loaded (:func:`retarget_replicas`: under strong skew a hot replica weighs about a whole rank's
    mean). Then the hottest rank (or, where it has no such swap, the next-hottest, down to the
    ``swap_depth``-th (2)) swaps experts with cooler ranks while a swap lowers the pair's peak by at
    least ``min_swap_gain`` (0.2 %; upstream uses 1 %) of the mean rank load, or by
    ``dominant_swap_gain`` (0.05 %) in layers where one replica alone outweighs the mean (there every
    lighter partner of that replica is a real reduction), up to ``max_swaps`` (100) swaps and
    ``max_move_fraction`` (0.3) of the layer's slots; where single swaps stall, the heaviest and
    lightest ranks are pooled and re-packed within the remaining budget, and up to ``chain_steps``
    (10) two-swap chains move a hot replica off a peak rank that holds two (:func:`chain_refine`,
    each lowering the peak by ``chain_gain``, 0.05 % of the mean). A layer keeps the new plan only
    if its imbalance improves (or, with the peak unchanged, the spread of rank loads shrinks).
    """

    OPTIONS = (
        "chain_gain",
        "chain_steps",
        "dominant_swap_gain",
        "max_move_fraction",
        "max_swaps",
        "min_swap_gain",
        "skip_threshold",
        "swap_depth",
    )

    def plan(self, table: np.ndarray, workload: np.ndarray, n: int) -> np.ndarray:
        layers, ranks, slots = table.shape
        load = logical_load(table, workload, n)
        before = imbalance(table, load)
        todo = before >= self.option("skip_threshold", 1.01, lo=1.0)
        total = np.full(layers, int(self.option("max_move_fraction", 0.3, lo=0.0, hi=1.0) * ranks * slots))
        budget = total
        cur = replica_counts_of(table, n)
        target = shift_replicas(load, cur, budget, ranks)
        new, slot_w = retarget_replicas(table, load, target, budget)
        budget = total - moved_slots(table, new)
        gain = swap_threshold(
            load,
            target,
            ranks,
            self.option("min_swap_gain", 0.002, lo=0.0),
            self.option("dominant_swap_gain", 0.0005, lo=0.0),
        )
        new = swap_refine_widening(
            new,
            slot_w,
            n,
            self.option("max_swaps", 100, lo=0),
            gain,
            budget,
            self.option("swap_depth", 2, lo=1),
        )
        for _ in range(2):  # where single swaps stall: re-pack the extreme ranks, then swap again
            new, slot_w = repack_extremes(new, slot_weights(new, load), n, total - moved_slots(table, new))
            new, slot_w = swap_refine(new, slot_w, n, 25, gain, max_moved=total - moved_slots(table, new))
        steps = self.option("chain_steps", 10, lo=0)
        if steps:
            cg = self.option("chain_gain", 0.0005, lo=0.0) * load.sum(axis=1) / ranks
            new, _ = chain_refine(new, slot_w, n, steps, cg, total - moved_slots(table, new))
        new = keep_slots(table, new)
        keep = ~todo | ~better(table, new, load)
        return np.where(keep[:, None, None], table, new)
