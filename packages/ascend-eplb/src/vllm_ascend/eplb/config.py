"""EPLB settings (``additional_config.eplb_config``): one frozen dataclass, validated at construction,
and the validator core calls at vLLM config time (registered in ``CONFIG_SECTIONS``)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from vllm_ascend.core.sdk import ConfigError, Section, option
from vllm_ascend.eplb.expert_map_file import expert_file_to_tensor
from vllm_ascend.eplb.placement import generate_global_placement
from vllm_ascend.eplb.policy.factory import allowed_policies, policy_name
from vllm_ascend.eplb.validation import EplbInputError

PATH = "additional_config.eplb_config"
PHASES = ("all", "prefill", "decode")


@dataclass(frozen=True)
class EplbConfig(Section):
    """Expert-parallel load balancing: static expert maps, redundant experts, dynamic re-placement.

    Validated by core's :class:`~vllm_ascend.core.config.Section` rules (types, ranges, choices,
    unknown keys). ``eplb_policy_type`` accepts a registered policy name or an upstream code
    (0 random, 1 default, 2 swift, 3 flashlb) and is stored as the name."""

    PATH: ClassVar[str] = PATH

    dynamic_eplb: bool = option(False, doc="Re-place experts periodically from recorded expert load.")
    expert_map_path: str | None = option(None, doc="JSON expert map giving the initial placement.")
    expert_map_record_path: str | None = option(
        None, doc="Where dynamic EPLB writes each placement it computes (JSON expert map)."
    )
    num_redundant_experts: int = option(0, ge=0, doc="Extra physical expert slots holding replicas.")
    expert_heat_collection_interval: int = option(
        400, ge=1, doc="Forward steps of expert load collected before each re-balancing."
    )
    algorithm_execution_interval: int = option(
        30, ge=1, doc="Forward steps between handing the load to the policy and taking its plan."
    )
    num_warmup_iterations: int = option(
        0, ge=0, doc="Forward steps after start-up whose expert load is not recorded."
    )
    load_collection_phase: str = option("all", choices=PHASES, doc="Which batches' expert load is recorded.")
    eplb_policy_type: str = option("default", doc="Re-balancing policy: a registered name or code 0-3.")

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "eplb_policy_type", policy_name(self.eplb_policy_type))
        except EplbInputError:
            raise ConfigError(
                f"{PATH}.eplb_policy_type = {self.eplb_policy_type!r} is invalid; allowed: {allowed_policies()}"
            ) from None
        super().__post_init__()

    def _validate(self) -> None:
        for name in ("expert_map_path", "expert_map_record_path"):
            value = getattr(self, name)
            if value is not None and not value.endswith(".json"):
                raise ConfigError(f"{PATH}.{name} must be a path to a .json file or null, got {value!r}")
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
    config = EplbConfig.from_dict(raw)
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
    ranks = (
        int(getattr(parallel, "tensor_parallel_size", 1)) * int(getattr(parallel, "data_parallel_size", 1))
        if parallel is not None
        else 1
    )
    redundant = config.num_redundant_experts
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
        if ranks > 1 and table.shape[1] != ranks:
            raise ConfigError(
                f"{PATH}.expert_map_path places experts on {table.shape[1]} ranks; this deployment has {ranks} "
                "expert-parallel ranks"
            )
    elif config.num_redundant_experts and ranks == 1:
        raise ConfigError(
            f"{PATH}.num_redundant_experts = {config.num_redundant_experts} needs several expert-parallel ranks "
            f"(this deployment has 1) or {PATH}.expert_map_path placing the copies on several ranks"
        )
    if redundant and ranks > 1:
        raise ConfigError(
            f"{PATH}: {redundant} redundant experts over {ranks} expert-parallel ranks are not supported yet "
            "(each rank holds the experts it loaded); supported: no redundant experts over several ranks, or "
            f"copies placed by {PATH}.expert_map_path within a single expert-parallel rank"
        )
    record = config.expert_map_record_path
    if record is not None and not os.path.isdir(os.path.dirname(os.path.abspath(record))):
        raise ConfigError(f"{PATH}.expert_map_record_path = {record!r}: its directory does not exist")
    return config
