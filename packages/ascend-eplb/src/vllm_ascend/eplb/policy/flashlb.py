"""FlashLB: risk-aware placement from a sliding window of load samples."""

from __future__ import annotations

from collections import deque

import numpy as np

from vllm_ascend.eplb.policy.base import EplbPolicy
from vllm_ascend.eplb.policy.packing import (
    align_ranks,
    better,
    keep_slots,
    logical_load,
    lpt_pack,
    moved_slots,
    repack_extremes,
    replica_counts,
    replica_counts_of,
    shift_replicas,
    slot_weights,
    swap_refine,
    swap_refine_widening,
    within_budget,
)


def downsample(samples: np.ndarray, limit: int) -> np.ndarray:
    """Average consecutive samples so at most ``limit`` remain (keeps the time order)."""
    if samples.shape[0] <= limit:
        return samples
    groups = np.array_split(np.arange(samples.shape[0]), limit)
    return np.stack([samples[g].mean(axis=0) for g in groups])


def peak_score(table: np.ndarray, samples: np.ndarray) -> np.ndarray:
    """Per layer: time-averaged peak/mean rank load over the samples ``[samples, layers, n]``.

    Summing sample loads per rank captures the covariance between the experts a rank holds."""
    layers, ranks, slots = table.shape
    n = samples.shape[-1]
    counts = replica_counts_of(table, n)
    share = (samples / np.maximum(counts, 1)).reshape(samples.shape[0], -1)
    flat = (np.arange(layers)[:, None] * n + table.reshape(layers, -1)).ravel()
    per_rank = share[:, flat].reshape(samples.shape[0], layers, ranks, slots).sum(-1)
    mean = per_rank.mean(axis=2)
    ratio = np.where(mean > 0, per_rank.max(axis=2) / np.where(mean > 0, mean, 1), 1.0)
    return ratio.mean(axis=0)


class FlashLB(EplbPolicy):
    """Minimise the time-averaged peak/mean rank load.

    Loads are risk-aware, ``μ + z·σ`` per expert (``z`` = ``risk_z``, 0.674: the 75th percentile)
    from a sliding window (``window`` = 16 samples, down-sampled to ``max_samples`` = 64). Two candidates
    per layer: an incremental one (replica re-allocation, swaps and re-packing of the extreme ranks,
    within ``max_move_fraction`` of the slots) and, where that plan is still above the lower bound by more than 20 × ``update_margin`` and the
    budget is at least half the slots, a fresh LPT packing aligned to the current ranks by Hungarian
    matching (used only when it fits the same move budget). The better candidate replaces the current placement only
    when the current score exceeds it by more than ``update_margin`` (0.5%), or when the incremental
    plan keeps the score and narrows the spread of risk-weighted rank loads.

    The workload may be one sample ``[layers, ranks, slots]`` or several ``[samples, layers, ranks,
    slots]``; either is converted to logical loads and appended to the sliding window.
    """

    accepts_history = True

    def __init__(self, config=None) -> None:
        super().__init__(config)
        self.window: deque[np.ndarray] = deque(maxlen=self.option("window", 16, lo=1))

    def plan(self, table: np.ndarray, workload: np.ndarray, n: int) -> np.ndarray:
        layers, ranks, slots = table.shape
        for sample in workload.reshape(-1, *table.shape):
            self.window.append(logical_load(table, sample, n))
        samples = downsample(np.stack(self.window), self.option("max_samples", 64, lo=1))
        z = self.option("risk_z", 0.674, lo=0.0)
        risk = samples.mean(axis=0) + z * samples.std(axis=0)
        budget = int(self.option("max_move_fraction", 0.3, lo=0.0, hi=1.0) * ranks * slots)
        mean = risk.sum(axis=1) / ranks
        margin = self.option("update_margin", 0.005, lo=0.0)

        shifted = shift_replicas(risk, replica_counts_of(table, n), np.full(layers, budget // 2), ranks)
        inc, inc_w, left = within_budget(table, risk, shifted, np.full(layers, budget))
        inc = swap_refine_widening(inc, inc_w, n, 100, 2e-3 * mean, left)
        for _ in range(2):  # where single swaps stall: re-pack the extreme ranks, then swap again
            inc, inc_w = repack_extremes(inc, slot_weights(inc, risk), n, budget - moved_slots(table, inc))
            inc, _ = swap_refine(inc, inc_w, n, 25, 2e-3 * mean, max_moved=budget - moved_slots(table, inc))
        inc = keep_slots(table, inc)

        fresh, need_fresh = inc, np.zeros(layers, dtype=bool)
        if budget >= ranks * slots // 2:  # an aligned fresh packing moves about half the slots
            target = replica_counts(risk, ranks * slots, ranks)
            lower = np.maximum(mean, (risk / target).max(axis=1))
            need_fresh = slot_weights(inc, risk).sum(axis=2).max(axis=1) > lower * (1 + 20 * margin)
        if need_fresh.any():  # even the incremental plan is far from the bound: try a fresh packing
            fresh, fresh_w, stuck = lpt_pack(risk, target, ranks, slots)
            fresh, _ = swap_refine(fresh, fresh_w, n, 100, 1e-4 * mean)
            fresh = align_ranks(table, np.where(stuck[:, None, None], table, fresh), n)
            need_fresh &= ~stuck & (moved_slots(table, fresh) <= budget)

        scores = np.stack(
            [
                peak_score(table, samples),
                peak_score(inc, samples),
                np.where(need_fresh, peak_score(fresh, samples), np.inf),
            ]
        )
        best = np.argmin(scores[1:], axis=0) + 1
        best_score = scores[best, np.arange(layers)]
        update = scores[0] > best_score * (1 + margin)
        # progress hidden behind a tie at the peak still counts for the incremental plan
        update |= (best == 1) & (scores[1] <= scores[0]) & better(table, inc, risk)
        choice = np.where(update, best, 0)[:, None, None]
        return np.where(choice == 1, inc, np.where(choice == 2, fresh, table))
