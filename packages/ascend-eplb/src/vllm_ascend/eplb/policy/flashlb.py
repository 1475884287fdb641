"""FlashLB: risk-aware placement from a sliding window of load samples."""

from __future__ import annotations

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

    A sliding window of per-expert loads gives each expert a mean ``μ`` and variance per sample: the
    last ``window`` (16) samples across calls, and never fewer than the whole history of the latest
    call (a ``[T, layers, ranks, slots]`` history is used entirely, however long). The objective is what a rank faces over the next window of the same
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

    Finally a layer keeps its input placement when the plan would be worse on the samples in the
    window by either measure the plan is judged by: max/mean of the summed (history-averaged) load,
    or the mean over samples of the per-sample max/mean. So a plan is never worse than the input on
    the data it saw, and ``changed`` is false when no layer passes.

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
        self.window: list[np.ndarray] = []

    def remember(self, samples: np.ndarray) -> np.ndarray:
        """Append logical-load samples ``[k, layers, n]``; keep the last ``window`` of them, or all ``k``
        of this call when more; return the kept history."""
        self.window.extend(samples)
        keep = max(self.option("window", 16, lo=1), samples.shape[0])
        del self.window[: max(0, len(self.window) - keep)]
        return np.stack(self.window)

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

    def candidates(
        self, table: np.ndarray, mu: np.ndarray, var: np.ndarray, horizon: int, n: int
    ) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray]:
        """Plans for the risk of a ``horizon``-step sum: the incremental one and, where it stays far
        from the lower bound and the budget allows, a fresh aligned packing. Returns the plans, the
        layers each plan applies to, and the risk-weighted loads of the incremental plan."""
        layers, ranks, slots = table.shape
        z = self.option("risk_z", 0.674, lo=0.0)
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
        plans, where = [inc], [(inc != table).any(axis=(1, 2))]
        if budget < ranks * slots // 2:  # an aligned fresh packing moves about half the slots
            return plans, where, risk
        target = replica_counts(mu, ranks * slots, ranks)
        fresh_risk = risk_load(mu, var, target, ranks, z, horizon)
        lower = np.maximum(mean, (fresh_risk / target).max(axis=1))
        need_fresh = slot_weights(inc, risk).sum(axis=2).max(axis=1) > lower * (1 + 20 * margin)
        if need_fresh.any():  # even the incremental plan is far from the bound: try a fresh packing
            fresh, fresh_w, stuck = lpt_pack(fresh_risk, target, ranks, slots)
            fresh, _ = swap_refine(fresh, fresh_w, n, 100, 1e-4 * mean)
            fresh = align_ranks(table, np.where(stuck[:, None, None], table, fresh), n)
            plans.append(fresh)
            where.append(need_fresh & ~stuck & (moved_slots(table, fresh) <= budget))
        return plans, where, risk

    def plan(self, table: np.ndarray, workload: np.ndarray, n: int) -> np.ndarray:
        layers = table.shape[0]
        history = self.remember(logical_load(table, workload.reshape(-1, *table.shape), n))
        samples = downsample(history, self.option("max_samples", 64, lo=1))
        z = self.option("risk_z", 0.674, lo=0.0)
        mu, var = history.mean(axis=0), history.var(axis=0)
        margin = self.option("update_margin", 0.0005, lo=0.0)

        current = aggregate_score(table, samples, z)
        plans, scores = [table], [current]
        risks: list[np.ndarray | None] = [None]
        for horizon in sorted({history.shape[0], 1}, reverse=True):  # the window's sum, then one step
            cands, where, risk = self.candidates(table, mu, var, horizon, n)
            for i, (cand, use) in enumerate(zip(cands, where, strict=True)):
                score = np.full(layers, np.inf)
                use = use & not_worse(table, cand, history)
                if use.any():
                    score[use] = aggregate_score(cand[use], samples[:, use], z)
                plans.append(cand)
                scores.append(score)
                risks.append(risk if i == 0 else None)
        score_of = np.stack(scores)
        best = np.argmin(score_of[1:], axis=0) + 1
        rows = np.arange(layers)
        update = current > score_of[best, rows] * (1 + margin)
        # progress hidden behind a tie at the peak still counts for an incremental plan
        for k, weights in enumerate(risks):
            if weights is not None:
                tie = (best == k) & np.isfinite(score_of[k]) & (score_of[k] <= current)
                update |= tie & better(table, plans[k], weights)
        choice = np.where(update, best, 0)
        stacked = np.stack(plans)
        return stacked[choice, rows]


def not_worse(old: np.ndarray, new: np.ndarray, history: np.ndarray) -> np.ndarray:
    """Per layer: is ``new`` no worse than ``old`` on the samples ``[k, layers, n]``, both in max/mean
    of their sum and in the mean over samples of the per-sample max/mean?"""
    tol = 1e-12
    summed = imbalance(new, history.sum(axis=0)) <= imbalance(old, history.sum(axis=0)) + tol
    per_sample = np.stack([[imbalance(t, s) for s in history] for t in (old, new)]).mean(axis=1)
    return summed & (per_sample[1] <= per_sample[0] + tol)
