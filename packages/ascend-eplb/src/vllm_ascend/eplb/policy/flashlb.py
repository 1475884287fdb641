"""FlashLB: risk-aware placement from a sliding window of load samples."""

from __future__ import annotations

from collections import deque

import numpy as np
from vllm_ascend.eplb.policy.base import EplbPolicy
from vllm_ascend.eplb.policy.packing import (
    align_ranks,
    expand_replicas,
    fill_holes,
    keep_slots,
    logical_load,
    replica_counts,
    replica_counts_of,
    swap_refine,
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
    share = samples / np.maximum(counts, 1)
    idx = np.broadcast_to(table.reshape(1, layers, -1), (samples.shape[0], layers, ranks * slots))
    per_rank = np.take_along_axis(share, idx, axis=2).reshape(samples.shape[0], layers, ranks, slots).sum(-1)
    mean = per_rank.mean(axis=2)
    ratio = np.where(mean > 0, per_rank.max(axis=2) / np.where(mean > 0, mean, 1), 1.0)
    return ratio.mean(axis=0)


class FlashLB(EplbPolicy):
    """Minimise the time-averaged peak/mean rank load.

    Loads are risk-aware, ``μ + z·σ`` per expert (``z`` = ``risk_z``, 0.674: the 75th percentile)
    from a sliding window (``window`` samples, down-sampled to ``max_samples`` = 64). Two candidates
    per layer: an incremental one (replica re-allocation plus swaps, within ``max_move_fraction`` of
    the slots) and a fresh LPT packing aligned to the current ranks by Hungarian matching (used only
    when it fits the same move budget). The better candidate replaces the current placement only
    when the current score exceeds it by more than ``update_margin`` (1%).

    The workload may be one window ``[layers, ranks, slots]`` (appended to the sliding window) or a
    history ``[samples, layers, ranks, slots]`` (replaces it).
    """

    accepts_history = True

    def __init__(self, config=None) -> None:
        super().__init__(config)
        self.window: deque[np.ndarray] = deque(maxlen=self.option("window", 64, lo=1))

    def plan(self, table: np.ndarray, workload: np.ndarray, n: int) -> np.ndarray:
        layers, ranks, slots = table.shape
        if workload.ndim == 4:
            self.window.clear()
        for sample in workload.reshape(-1, *table.shape):
            self.window.append(logical_load(table, sample, n))
        samples = downsample(np.stack(self.window), self.option("max_samples", 64, lo=1))
        z = self.option("risk_z", 0.674, lo=0.0)
        risk = samples.mean(axis=0) + z * samples.std(axis=0)
        budget = int(self.option("max_move_fraction", 0.3, lo=0.0, hi=1.0) * ranks * slots)
        target = replica_counts(risk, ranks * slots, ranks)
        mean = risk.sum(axis=1) / ranks

        inc, inc_w, left = within_budget(table, risk, target, np.full(layers, budget))
        inc, _ = swap_refine(inc, inc_w, n, 100, 1e-3 * mean, max_moved=left)
        inc = keep_slots(table, inc)

        items, weights = expand_replicas(risk / target, target)
        fresh, fresh_w, fresh_stuck = fill_holes(np.full_like(table, -1), np.zeros(table.shape), items, weights, n)
        fresh, _ = swap_refine(fresh, fresh_w, n, 32, 1e-4 * mean)
        fresh = align_ranks(table, np.where(fresh_stuck[:, None, None], table, fresh), n)

        scores = np.stack([
            peak_score(table, samples),
            peak_score(inc, samples),
            np.where(fresh_stuck | ((fresh != table).sum(axis=(1, 2)) > budget), np.inf,
                     peak_score(fresh, samples)),
        ])
        best = np.argmin(scores[1:], axis=0) + 1
        best_score = scores[best, np.arange(layers)]
        update = scores[0] > best_score * (1 + self.option("update_margin", 0.01, lo=0.0))
        choice = np.where(update, best, 0)[:, None, None]
        return np.where(choice == 1, inc, np.where(choice == 2, fresh, table))
