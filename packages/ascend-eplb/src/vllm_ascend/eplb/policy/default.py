"""Default policy: forecast the next window, replicate the hottest experts, pack heaviest-first, keep stayers."""

from __future__ import annotations

import numpy as np

from vllm_ascend.eplb.policy.base import EplbPolicy
from vllm_ascend.eplb.policy.forecast import LoadForecast
from vllm_ascend.eplb.policy.packing import (
    align_ranks,
    capped_replica_counts,
    logical_load,
    lpt_pack,
    replica_counts,
    replica_counts_of,
    risk_peak,
    slot_weights,
    swap_refine,
)

#: Per-replica load caps (× the mean rank load) tried where the greedy counts pack badly.
CAPS = (1.0, 0.9, 0.8, 0.7, 0.6, 0.5)
#: A layer whose greedy plan peaks this far (relative) above its bound tries the capped counts.
SEARCH_GAP = 0.005


class DefaultEplb(EplbPolicy):
    """Greedy EPLB on a forecast of the next window.

    0. Load: a placement serves the window after the one it is fitted to, so the policy plans on a
       :class:`LoadForecast` of the windows it has been given (the latest window alone while drift
       makes that the best forecast, a longer average while loads are stationary or bursts pass).
       ``forecast`` false plans on the latest window alone, as vLLM's policy does.
    1. Replicas: each extra slot goes to the expert with the highest per-replica load. That minimises
       the largest replica, but under strong skew it cuts the hot experts into many replicas of just
       over half a rank's mean load, more than there are ranks, and two of them then share a rank
       (a peak near 1.25× the mean). Where the packed plan (2.) peaks more than ``SEARCH_GAP`` above
       its bound, replicas capped at ``CAPS`` × the mean rank load (:func:`capped_replica_counts`:
       fewer, larger replicas of the hot experts, which lighter experts then fill up) are packed as
       well, and the layer takes the best plan.
    2. Packing: replicas, heaviest first, go to the least-loaded rank with a free slot that does
       not hold that expert yet; then pairwise swaps off the peak rank polish the result.
    3. Placement: ranks are matched to the old ranks and experts that stay keep their old slots.
       A layer whose plan would not be better keeps its placement.

    Plans are judged by their peak rank load plus ``√(2·ln ranks)`` standard deviations when every
    expert's load may be off by the forecast's spread (:func:`risk_peak`): a rank whose load is one
    large replica is less certain than one of several small ones. Before the forecast has been
    scored (the first window) the spread is 0 and this is the peak rank load.

    ``changed`` is true when the summed per-layer peak falls below ``improvement_threshold`` times the
    current one. The default, 1.0 (re-pack whenever the peak drops at all), deviates from upstream's
    0.95: without redundant slots under skew a fresh packing lowers the peak by less than 5 % but
    still by several percent of the mean, and 0.95 kept such layers on a worse placement
    indefinitely. Set 0.95 for upstream's behaviour.

    A ``[samples, layers, ranks, slots]`` history is one window (its sum). ``changed`` and ``priority``
    are judged on the forecast planned for.
    """

    OPTIONS = ("forecast", "improvement_threshold", "max_swaps")

    accepts_history = True

    def __init__(self, config=None) -> None:
        super().__init__(config)
        self.forecast = LoadForecast()
        self.planned: np.ndarray | None = None
        self.spread = 0.0

    def plan(self, table: np.ndarray, workload: np.ndarray, n: int) -> np.ndarray:
        _, ranks, slots = table.shape
        load = logical_load(table, workload.reshape(-1, *table.shape).sum(axis=0), n)
        if self.option("forecast", True):
            load = self.forecast.update(load, replica_counts_of(table, n))
            self.spread = self.forecast.spread
        self.planned = load
        mean = load.sum(axis=1) / ranks
        max_swaps = self.option("max_swaps", 100, lo=0)
        counts = replica_counts(load, ranks * slots, ranks)
        packed, slot_w, stuck = lpt_pack(load, counts, ranks, slots)
        packed, slot_w = swap_refine(packed, slot_w, n, max_swaps, 1e-4 * mean)
        peak = np.where(stuck, np.inf, slot_w.sum(axis=2).max(axis=1))
        bound = np.maximum(mean, (load / counts).max(axis=1))
        search = (
            np.flatnonzero(peak > bound * (1 + SEARCH_GAP)) if ranks * slots > n else np.empty(0, np.int64)
        )
        if search.size:
            risk = np.where(stuck, np.inf, self.risk(slot_w))[search]
            better, plans = self.capped_plans(load[search], risk, ranks, slots, max_swaps)
            packed[search[better]], stuck[search[better]] = plans, False
        new = align_ranks(table, np.where(stuck[:, None, None], table, packed), n)
        keep = stuck | (self.risk(slot_weights(new, load)) >= self.risk(slot_weights(table, load)))
        return np.where(keep[:, None, None], table, new)

    def risk(self, slot_w: np.ndarray) -> np.ndarray:
        """Per layer: the peak a plan is judged by (:func:`risk_peak` with the forecast's spread)."""
        return risk_peak(slot_w, self.spread, np.sqrt(2 * np.log(slot_w.shape[1])))

    def capped_plans(
        self, load: np.ndarray, risk: np.ndarray, ranks: int, slots: int, max_swaps: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """For layers whose greedy plan is judged ``risk``: pack every count vector of
        :func:`capped_replica_counts` with caps ``CAPS`` × the mean rank load that fits the slots, take each
        layer's best LPT plan, polish it with swaps. Returns which layers it beats and their plans."""
        layers, n = load.shape
        mean = load.sum(axis=1) / ranks
        cands = [capped_replica_counts(load, ranks * slots, ranks, f * mean) for f in CAPS]
        cap_of, layer_of = np.nonzero(np.stack([ok for _, ok in cands]))
        if not layer_of.size:
            return np.zeros(layers, dtype=bool), np.empty((0, ranks, slots), dtype=np.int64)
        counts = np.stack([c for c, _ in cands])[cap_of, layer_of]
        packed, slot_w, stuck = lpt_pack(load[layer_of], counts, ranks, slots)
        lpt_risk = np.where(stuck, np.inf, self.risk(slot_w))
        order = np.lexsort((lpt_risk, layer_of))  # per layer, the best LPT plan first
        first = order[np.r_[True, layer_of[order][1:] != layer_of[order][:-1]]]
        first = first[np.isfinite(lpt_risk[first])]
        rows = layer_of[first]
        plans, plan_w = swap_refine(packed[first], slot_w[first], n, max_swaps, 1e-4 * mean[rows])
        wins = self.risk(plan_w) < risk[rows]
        better = np.zeros(layers, dtype=bool)
        better[rows[wins]] = True
        return better, plans[wins]

    def decision_load(self, table: np.ndarray, workload: np.ndarray, n: int) -> np.ndarray:
        return self.planned if self.planned is not None else super().decision_load(table, workload, n)

    def decide(self, old, new, load, before, after):
        _, priority = super().decide(old, new, load, before, after)
        threshold = self.option("improvement_threshold", 1.0, lo=0.0, hi=1.0)
        peak_old = self.risk(slot_weights(old, load)).sum()
        peak_new = self.risk(slot_weights(new, load)).sum()
        return bool(peak_new < threshold * peak_old), priority
