"""EPLB settings and the initial expert placement of a deployment."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from vllm_ascend.eplb.expert_map_file import expert_file_to_tensor
from vllm_ascend.eplb.placement import generate_expert_map, generate_global_placement, generate_log2phy_map
from vllm_ascend.eplb.validation import EplbInputError

PHASES = ("all", "prefill", "decode")


@dataclass(frozen=True)
class EplbSettings:
    """The EPLB sub-config (same field names as AscendConfig's ``eplb_config``)."""

    dynamic_eplb: bool = False
    expert_map_path: str | None = None
    expert_map_record_path: str | None = None
    num_redundant_experts: int = 0
    eplb_policy_type: int | str = 2
    expert_heat_collection_interval: int = 400
    algorithm_execution_interval: int = 30
    num_warmup_iterations: int = 0
    load_collection_phase: str = "all"

    @classmethod
    def from_any(cls, config: Any) -> EplbSettings:
        """Read from an object with attributes, a mapping, or ``None`` (defaults)."""
        if isinstance(config, EplbSettings):
            return config
        values = {}
        for f in fields(cls):
            if config is None:
                continue
            if isinstance(config, Mapping):
                if f.name in config:
                    values[f.name] = config[f.name]
            elif hasattr(config, f.name):
                values[f.name] = getattr(config, f.name)
        if isinstance(config, Mapping):
            unknown = sorted(set(config) - {f.name for f in fields(cls)})
            if unknown:
                raise EplbInputError(
                    f"unknown eplb_config field(s) {unknown}; allowed: {[f.name for f in fields(cls)]}"
                )
        settings = cls(**values)
        settings.check()
        return settings

    def check(self) -> None:
        if not isinstance(self.dynamic_eplb, bool):
            raise EplbInputError(f"eplb_config.dynamic_eplb must be true or false, got {self.dynamic_eplb!r}")
        for name in ("num_redundant_experts", "num_warmup_iterations"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise EplbInputError(f"eplb_config.{name} must be an integer >= 0, got {v!r}")
        for name in ("expert_heat_collection_interval", "algorithm_execution_interval"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise EplbInputError(f"eplb_config.{name} must be an integer >= 1, got {v!r}")
        if self.load_collection_phase not in PHASES:
            raise EplbInputError(
                f"eplb_config.load_collection_phase must be one of {PHASES}, "
                f"got {self.load_collection_phase!r}"
            )
        for name in ("expert_map_path", "expert_map_record_path"):
            v = getattr(self, name)
            if v is not None and not isinstance(v, str):
                raise EplbInputError(f"eplb_config.{name} must be a path string or null, got {v!r}")


@dataclass(frozen=True)
class EplbInit:
    """Placement state a rank starts with."""

    settings: EplbSettings
    global_table: np.ndarray  # [layers, ranks, slots]
    expert_map: np.ndarray  # [layers, ranks, n] local slot or -1
    log2phy: np.ndarray  # [layers, ranks, n] physical id
    num_redundant_experts: int

    @property
    def slots_per_rank(self) -> int:
        return self.global_table.shape[2]


def init_eplb_config(
    eplb_config: Any, num_experts: int, num_ranks: int, num_layers: int, tp_size: int = 1
) -> EplbInit:
    """Settings + initial placement: from ``expert_map_path`` when set (its shape must match the
    model), else the default layout with ``num_redundant_experts`` copies."""
    settings = EplbSettings.from_any(eplb_config)
    if settings.expert_map_path:
        table = expert_file_to_tensor(settings.expert_map_path)[0].numpy()
        if table.shape[:2] != (num_layers, num_ranks) or int(table.max()) + 1 != num_experts:
            raise EplbInputError(
                f"expert map {settings.expert_map_path!r} describes {table.shape[0]} layers × {table.shape[1]} "
                f"ranks × {int(table.max()) + 1} experts; the model needs {num_layers} × {num_ranks} × {num_experts}"
            )
        redundant = table.shape[1] * table.shape[2] - num_experts
    else:
        redundant = settings.num_redundant_experts
        table = generate_global_placement(num_experts, num_ranks, redundant, num_layers)
    return EplbInit(
        settings, table, generate_expert_map(table), generate_log2phy_map(table, tp_size), redundant
    )
