"""FlashLB: risk-aware placement from a sliding window of load samples."""

from __future__ import annotations

from collections import deque

import numpy as np

from vllm_ascend.eplb.policy.base import EplbPolicy
from vllm_ascend.eplb.policy.packing import (
    aggregate_score,
    align_ranks,
    better,
    imbalance,
    keep_slots,
    logical_load,
    lpt_pack,
    moved_slots,
    repack_extremes,
    replica_counts,
    replica_counts_of,
    retarget_replicas,
    risk_load,
    shift_replicas,
    slot_weights,
    swap_refine,
    swap_refine_widening,
    swap_threshold,
)


def downsample(samples: np.ndarray, limit: int) -> np.ndarray:
    """Sum consecutive samples so at most ``limit`` remain (keeps the time order and the total)."""
    if samples.shape[0] <= limit:
        return samples
    groups = np.array_split(np.arange(samples.shape[0]), limit)
    return np.stack([samples[g].sum(axis=0) for g in groups])


class FlashLB(EplbPolicy):
    """Minimise the risk-aware peak/mean of the window aggregate.

    A sliding window (``window`` = 16 samples) of per-expert loads gives each expert a mean ``μ``
    and variance per sample. The objective is what a rank faces over the next window of the same
    length: its summed load plus ``risk_z`` (0.674, the 75th percentile) standard deviations of that
    sum, ``max_r(T_r + z·σ_r) / mean``, with ``σ_r`` taken from the rank's per-sample loads (so the
    covariance between its experts counts; samples are summed down to ``max_samples`` = 64). Packing
    works on the additive linearisation of that objective (:func:`risk_load`).

    Layers whose window max/mean is below ``skip_threshold`` (1.01) are not searched. Two candidates
    per layer: an incremental one (replica re-allocation with new copies overwriting the surplus copy
    whose rank ends up least loaded, swaps off the ``swap_depth`` (2) heaviest ranks that lower the
    pair's peak by ``min_swap_gain`` (0.2 %) of the mean, ``dominant_swap_gain`` (0.05 %) where one
    replica outweighs the mean, and re-packing of the extreme ranks, within ``max_move_fraction`` of
    the slots) and, where that plan is still above the
    lower bound by more than 20 × ``update_margin`` and the budget is at least half the slots, a
    fresh LPT packing aligned to the current ranks by Hungarian matching (used only when it fits the
    same move budget). The better candidate replaces the current placement only when the current
    score exceeds it by more than ``update_margin`` (0.05%), or when the incremental plan keeps the
    score and narrows the spread of risk-weighted rank loads.

    The workload may be one sample ``[layers, ranks, slots]`` or several ``[samples, layers, ranks,
    slots]``; either is converted to logical loads and appended to the sliding window.
    """

    OPTIONS = (
        "dominant_swap_gain",
        "max_move_fraction",
        "max_samples",
        "min_swap_gain",
        "risk_z",
        "skip_threshold",
        "swap_depth",
        "update_margin",
        "window",
    )

    accepts_history = True

    def __init__(self, config=None) -> None:
        super().__init__(config)
        self.window: deque[np.ndarray] = deque(maxlen=self.option("window", 16, lo=1))

    def incremental(
        self, table: np.ndarray, risk: np.ndarray, counts: np.ndarray, n: int, budget: int
    ) -> np.ndarray:
        """Within ``budget`` changed slots per layer: move to ``counts`` replicas, swap off the
        heaviest ranks, re-pack the extreme ranks where swaps stall and swap again."""
        gain = swap_threshold(
            risk,
            counts,
            table.shape[1],
            self.option("min_swap_gain", 0.002, lo=0.0),
            self.option("dominant_swap_gain", 0.0005, lo=0.0),
        )
        full = np.full(table.shape[0], budget)
        inc, inc_w = retarget_replicas(table, risk, counts, full)
        left = full - moved_slots(table, inc)
        inc = swap_refine_widening(inc, inc_w, n, 60, gain, left, self.option("swap_depth", 2, lo=1))
        inc, inc_w = repack_extremes(inc, slot_weights(inc, risk), n, full - moved_slots(table, inc))
        inc, _ = swap_refine(inc, inc_w, n, 25, gain, max_moved=full - moved_slots(table, inc))
        return keep_slots(table, inc)

    def plan(self, table: np.ndarray, workload: np.ndarray, n: int) -> np.ndarray:
        layers, ranks, slots = table.shape
        for sample in workload.reshape(-1, *table.shape):
            self.window.append(logical_load(table, sample, n))
        history = np.stack(self.window)
        samples = downsample(history, self.option("max_samples", 64, lo=1))
        z = self.option("risk_z", 0.674, lo=0.0)
        horizon = history.shape[0]
        mu, var = history.mean(axis=0), history.var(axis=0)
        budget = int(self.option("max_move_fraction", 0.3, lo=0.0, hi=1.0) * ranks * slots)
        margin = self.option("update_margin", 0.0005, lo=0.0)

        cur = replica_counts_of(table, n)
        shifted = shift_replicas(
            risk_load(mu, var, cur, ranks, z, horizon), cur, np.full(layers, budget), ranks
        )
        risk = risk_load(mu, var, shifted, ranks, z, horizon)
        mean = risk.sum(axis=1) / ranks
        inc = table.copy()
        todo = imbalance(table, mu) >= self.option("skip_threshold", 1.01, lo=1.0)
        if todo.any():
            inc[todo] = self.incremental(table[todo], risk[todo], shifted[todo], n, budget)

        fresh, need_fresh = inc, np.zeros(layers, dtype=bool)
        if budget >= ranks * slots // 2:  # an aligned fresh packing moves about half the slots
            target = replica_counts(mu, ranks * slots, ranks)
            fresh_risk = risk_load(mu, var, target, ranks, z, horizon)
            lower = np.maximum(mean, (fresh_risk / target).max(axis=1))
            need_fresh = slot_weights(inc, risk).sum(axis=2).max(axis=1) > lower * (1 + 20 * margin)
        if need_fresh.any():  # even the incremental plan is far from the bound: try a fresh packing
            fresh, fresh_w, stuck = lpt_pack(fresh_risk, target, ranks, slots)
            fresh, _ = swap_refine(fresh, fresh_w, n, 100, 1e-4 * mean)
            fresh = align_ranks(table, np.where(stuck[:, None, None], table, fresh), n)
            need_fresh &= ~stuck & (moved_slots(table, fresh) <= budget)

        current = aggregate_score(table, samples, z)
        scores = np.stack([current, current, np.full(layers, np.inf)])
        searched = (inc != table).any(axis=(1, 2))  # layers the search left alone score as before
        if searched.any():
            scores[1, searched] = aggregate_score(inc[searched], samples[:, searched], z)
        if need_fresh.any():
            scores[2, need_fresh] = aggregate_score(fresh[need_fresh], samples[:, need_fresh], z)
        best = np.argmin(scores[1:], axis=0) + 1
        best_score = scores[best, np.arange(layers)]
        update = scores[0] > best_score * (1 + margin)
        # progress hidden behind a tie at the peak still counts for the incremental plan
        update |= (best == 1) & (scores[1] <= scores[0]) & better(table, inc, risk)
        choice = np.where(update, best, 0)[:, None, None]
        return np.where(choice == 1, inc, np.where(choice == 2, fresh, table))
