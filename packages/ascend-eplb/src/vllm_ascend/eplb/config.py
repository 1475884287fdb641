"""EPLB settings (``additional_config.eplb_config``): one frozen dataclass, validated at construction,
and the validator core calls at vLLM config time (registered in ``CONFIG_SECTIONS``)."""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from vllm_ascend.core.config import ConfigError
from vllm_ascend.eplb.expert_map_file import expert_file_to_tensor
from vllm_ascend.eplb.placement import generate_global_placement
from vllm_ascend.eplb.policy.factory import allowed_policies, policy_name
from vllm_ascend.eplb.validation import EplbInputError

PATH = "additional_config.eplb_config"
PHASES = ("all", "prefill", "decode")


def _describe(value: Any) -> str:
    return f"{type(value).__name__} {value!r}"


@dataclass(frozen=True)
class EplbConfig:
    """Expert-parallel load balancing: static expert maps, redundant experts, dynamic re-placement.

    ``eplb_policy_type`` accepts a registered policy name or an upstream code (0 random, 1 default,
    2 swift, 3 flashlb) and is stored as the name."""

    dynamic_eplb: bool = False
    expert_map_path: str | None = None
    expert_map_record_path: str | None = None
    num_redundant_experts: int = 0
    expert_heat_collection_interval: int = 400
    algorithm_execution_interval: int = 30
    num_warmup_iterations: int = 0
    load_collection_phase: str = "all"
    eplb_policy_type: str | int = "swift"

    def __post_init__(self) -> None:
        if not isinstance(self.dynamic_eplb, bool):
            raise ConfigError(
                f"{PATH}.dynamic_eplb must be true or false, got {_describe(self.dynamic_eplb)}"
            )
        for name, low in (
            ("num_redundant_experts", 0),
            ("num_warmup_iterations", 0),
            ("expert_heat_collection_interval", 1),
            ("algorithm_execution_interval", 1),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"{PATH}.{name} must be an integer >= {low}, got {_describe(value)}")
        if self.load_collection_phase not in PHASES:
            raise ConfigError(
                f"{PATH}.load_collection_phase = {self.load_collection_phase!r} is invalid; "
                f"allowed values: {', '.join(repr(p) for p in PHASES)}"
            )
        try:
            object.__setattr__(self, "eplb_policy_type", policy_name(self.eplb_policy_type))
        except EplbInputError:
            raise ConfigError(
                f"{PATH}.eplb_policy_type = {self.eplb_policy_type!r} is invalid; allowed: {allowed_policies()}"
            ) from None
        for name in ("expert_map_path", "expert_map_record_path"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value.endswith(".json")):
                raise ConfigError(
                    f"{PATH}.{name} must be a path to a .json file or null, got {_describe(value)}"
                )
        if self.expert_map_record_path is not None and not self.dynamic_eplb:
            raise ConfigError(
                f"{PATH}.expert_map_record_path requires {PATH}.dynamic_eplb = true "
                "(only dynamic EPLB computes placements to record)"
            )
        if self.expert_map_path is not None and self.expert_map_path == self.expert_map_record_path:
            raise ConfigError(
                f"{PATH}.expert_map_record_path must differ from {PATH}.expert_map_path "
                "(recording would overwrite the input map)"
            )

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> EplbConfig:
        """Build from the JSON object of ``additional_config.eplb_config``; unknown keys are refused."""
        if not isinstance(raw, Mapping):
            raise ConfigError(f"{PATH} must be a JSON object, got {_describe(raw)}")
        allowed = [f.name for f in fields(cls)]
        for key in raw:
            if key not in allowed:
                close = difflib.get_close_matches(str(key), allowed, n=1, cutoff=0.6)
                hint = f"; did you mean {close[0]!r}?" if close else "."
                raise ConfigError(
                    f"unknown option {PATH}.{key}{hint} Allowed keys: {', '.join(sorted(allowed))}"
                )
        return cls(**raw)

    @property
    def policy_name(self) -> str:
        return str(self.eplb_policy_type)

    @property
    def enabled(self) -> bool:
        """Whether any EPLB feature (static map, redundancy or dynamic) is in use."""
        return self.dynamic_eplb or self.expert_map_path is not None or self.num_redundant_experts > 0

    def initial_table(self, num_experts: int, num_layers: int, num_ranks: int = 1) -> np.ndarray:
        """The starting ``[layers, ranks, slots]`` placement: ``expert_map_path`` when set (its shape must
        match the model; it decides the rank count), else experts in order plus ``num_redundant_experts``
        copies over ``num_ranks`` ranks."""
        if self.expert_map_path is None:
            return generate_global_placement(num_experts, num_ranks, self.num_redundant_experts, num_layers)
        table = expert_file_to_tensor(self.expert_map_path)[0].numpy()
        if table.shape[0] != num_layers or int(table.max()) + 1 != num_experts:
            raise EplbInputError(
                f"expert map {self.expert_map_path!r} describes {table.shape[0]} MoE layers with "
                f"{int(table.max()) + 1} experts; the model has {num_layers} MoE layers with {num_experts} experts"
            )
        return table


def validate_eplb_config(raw: Mapping[str, Any], vllm_config: Any = None) -> EplbConfig:
    """Core's ``CONFIG_SECTIONS`` validator: the typed settings, checked against vLLM's config and the
    expert-map file (read now, so a bad map fails before any model is built)."""
    config = EplbConfig.from_mapping(raw)
    parallel = getattr(vllm_config, "parallel_config", None)
    if parallel is not None and config.enabled and not getattr(parallel, "enable_expert_parallel", False):
        key = (
            "dynamic_eplb"
            if config.dynamic_eplb
            else ("expert_map_path" if config.expert_map_path is not None else "num_redundant_experts")
        )
        raise ConfigError(
            f"{PATH}.{key} requires expert parallelism "
            "(parallel_config.enable_expert_parallel = True, --enable-expert-parallel)"
        )
    if config.expert_map_path is not None:
        try:
            table = expert_file_to_tensor(config.expert_map_path)[0]
        except EplbInputError as exc:
            raise ConfigError(f"{PATH}.expert_map_path: {exc}") from None
        redundant = int(table.numel() // table.shape[0]) - (int(table.max()) + 1)
        if config.num_redundant_experts not in (0, redundant):
            raise ConfigError(
                f"{PATH}.num_redundant_experts = {config.num_redundant_experts} contradicts {PATH}.expert_map_path, "
                f"which places {redundant} redundant experts; set 0 or {redundant}"
            )
    elif config.num_redundant_experts and parallel is not None:
        ranks = int(getattr(parallel, "tensor_parallel_size", 1)) * int(
            getattr(parallel, "data_parallel_size", 1)
        )
        if ranks == 1:
            raise ConfigError(
                f"{PATH}.num_redundant_experts = {config.num_redundant_experts} needs several expert-parallel ranks "
                f"(this deployment has 1) or {PATH}.expert_map_path placing the copies on several ranks"
            )
    record = config.expert_map_record_path
    if record is not None and not os.path.isdir(os.path.dirname(os.path.abspath(record))):
        raise ConfigError(f"{PATH}.expert_map_record_path = {record!r}: its directory does not exist")
    return config
