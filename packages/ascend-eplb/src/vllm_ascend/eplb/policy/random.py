"""Random placement (a baseline and a test aid)."""

from __future__ import annotations

import numpy as np

from vllm_ascend.eplb.policy.base import EplbPolicy
from vllm_ascend.eplb.policy.packing import keep_slots
from vllm_ascend.eplb.validation import duplicated_on_rank


class RandomLoadBalance(EplbPolicy):
    """Shuffle every layer's slots across ranks (seeded by option ``seed``); a shuffle that puts an
    expert twice on one rank is retried a few times, then the layer keeps its placement."""

    OPTIONS = ("seed",)

    def __init__(self, config=None) -> None:
        super().__init__(config)
        self.rng = np.random.default_rng(self.option("seed", 0, lo=0))

    def plan(self, table: np.ndarray, workload: np.ndarray, n: int) -> np.ndarray:
        layers = table.shape[0]
        new = table.copy()
        todo = np.ones(layers, dtype=bool)
        for _ in range(8):
            flat = table[todo].reshape(int(todo.sum()), -1)
            shuffled = self.rng.permuted(flat, axis=1).reshape(-1, *table.shape[1:])
            ok = ~duplicated_on_rank(shuffled, n)
            idx = np.flatnonzero(todo)
            new[idx[ok]] = shuffled[ok]
            todo[idx[ok]] = False
            if not todo.any():
                break
        return keep_slots(table, new)
