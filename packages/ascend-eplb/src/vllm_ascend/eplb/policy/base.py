"""The policy interface: validate inputs, let the policy plan, reject bad layers."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from vllm_ascend.core.sdk import unknown_key_message
from vllm_ascend.eplb.policy.packing import imbalance, logical_load
from vllm_ascend.eplb.validation import EplbInputError, as_expert_table, as_workload, valid_layers


class EplbPolicy(ABC):
    """``rebalance_experts(current_table, workload) -> (changed, priority, new_table)``.

    Tables are int ``[layers, ranks, slots]`` of logical expert ids; the workload has the same shape
    (tokens routed to each physical slot). ``priority`` lists layer indices, most-improved first.
    A layer whose plan is invalid keeps its current placement.
    """

    accepts_history = False
    #: Every option name the policy reads with :meth:`option`; other keys of a mapping config are refused.
    OPTIONS: ClassVar[tuple[str, ...]] = ()

    def __init__(self, config: Mapping[str, Any] | Any = None) -> None:
        if isinstance(config, Mapping):
            for key in config:
                if key not in self.OPTIONS:
                    raise EplbInputError(
                        unknown_key_message(type(self).__name__, str(key), list(self.OPTIONS))
                    )
        self.config = config

    def option(self, name: str, default: Any, lo: float | None = None, hi: float | None = None) -> Any:
        """A numeric policy option from the config (mapping or attributes), range-checked."""
        if name not in self.OPTIONS:
            raise KeyError(f"{type(self).__name__} reads option {name!r} but does not declare it in OPTIONS")
        cfg = self.config
        value = cfg.get(name, default) if isinstance(cfg, Mapping) else getattr(cfg, name, default)
        if value is None:
            value = default
        if isinstance(default, bool):
            if not isinstance(value, bool):
                raise EplbInputError(f"policy option {name!r} must be true or false, got {value!r}")
            return value
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or (isinstance(default, int) and value != int(value))
        ):
            raise EplbInputError(f"policy option {name!r} must be a {type(default).__name__}, got {value!r}")
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise EplbInputError(f"policy option {name!r}={value} is outside the allowed range [{lo}, {hi}]")
        return type(default)(value)

    def rebalance_experts(
        self, current_expert_table: Any, expert_workload: Any
    ) -> tuple[bool, np.ndarray, np.ndarray]:
        table = as_expert_table(current_expert_table)
        workload = as_workload(expert_workload, table.shape, allow_history=self.accepts_history)
        n = int(table.max()) + 1
        new = np.asarray(self.plan(table, workload, n), dtype=np.int64)
        ok = valid_layers(table, new, n)
        new = np.where(ok[:, None, None], new, table)
        load = self.decision_load(table, workload, n)
        before, after = imbalance(table, load), imbalance(new, load)
        changed, priority = self.decide(table, new, load, before, after)
        return changed, priority, new

    def decision_load(self, table: np.ndarray, workload: np.ndarray, n: int) -> np.ndarray:
        """Logical loads ``[layers, n]`` that ``changed`` and ``priority`` are judged on: the workload's
        (summed over a history); a policy that plans on other loads returns those."""
        return logical_load(table, workload if workload.ndim == 3 else workload.sum(axis=0), n)

    def decide(
        self, old: np.ndarray, new: np.ndarray, load: np.ndarray, before: np.ndarray, after: np.ndarray
    ) -> tuple[bool, np.ndarray]:
        """Changed when some layer's placement differs; priority = layers by imbalance drop."""
        differs = (old != new).any(axis=(1, 2))
        gain = np.where(differs, before - after, -np.inf)
        priority = np.argsort(-gain, kind="stable")
        return bool(differs.any()), priority[np.isfinite(gain[priority])]

    @abstractmethod
    def plan(self, table: np.ndarray, workload: np.ndarray, n: int) -> np.ndarray:
        """Return the proposed table (validated afterwards, layer by layer)."""
