"""Expert-hotness metrics: the rank-0 worker publishes the aggregated hotness of each plan."""

from __future__ import annotations

from typing import Any

import numpy as np


class EplbMetrics:
    """Keeps the latest per-layer expert hotness and imbalance, and mirrors them into Prometheus
    gauges when ``prometheus_client`` is available."""

    def __init__(self, registry: Any = None) -> None:
        self.hotness: np.ndarray | None = None
        self.imbalance: np.ndarray | None = None
        self.updates = 0
        self._gauges = self._register_eplb_metrics(registry)

    @staticmethod
    def _register_eplb_metrics(registry: Any) -> tuple[Any, Any] | None:
        try:
            from prometheus_client import REGISTRY, Gauge
        except ImportError:
            return None
        registry = registry or REGISTRY
        hot = Gauge(
            "vllm_ascend_eplb_expert_hotness",
            "Share of a MoE layer's tokens routed to a logical expert",
            ["layer", "expert"],
            registry=registry,
        )
        imb = Gauge(
            "vllm_ascend_eplb_imbalance", "Max/mean rank load of a MoE layer", ["layer"], registry=registry
        )
        return hot, imb

    def eplb_do_update_hotness_handler(self, plan: Any, rank: int) -> None:
        """Record a plan's hotness (only rank 0 publishes; the others hold the same numbers)."""
        if rank != 0 or plan.hotness is None:
            return
        self.hotness = np.asarray(plan.hotness)
        self.imbalance = np.asarray(plan.imbalance_before)
        self.updates += 1
        if self._gauges is None:
            return
        hot, imb = self._gauges
        for layer, row in enumerate(self.hotness):
            imb.labels(layer=str(layer)).set(float(self.imbalance[layer]))
            for expert, value in enumerate(row):
                hot.labels(layer=str(layer), expert=str(expert)).set(float(value))
