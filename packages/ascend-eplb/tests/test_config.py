"""``additional_config.eplb_config``: the one EplbConfig, its validator, and the policy names it accepts."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

from vllm_ascend.core.config import ConfigError
from vllm_ascend.eplb import EPLB_POLICIES, EplbConfig, EplbPolicy, EplbProcess, validate_eplb_config
from vllm_ascend.eplb.expert_map_file import save_expert_map
from vllm_ascend.eplb.placement import generate_global_placement
from vllm_ascend.eplb.validation import EplbInputError

P = r"additional_config\.eplb_config"


def _vllm(ep: bool = True, tp: int = 1, dp: int = 1) -> SimpleNamespace:
    parallel = SimpleNamespace(enable_expert_parallel=ep, tensor_parallel_size=tp, data_parallel_size=dp)
    return SimpleNamespace(parallel_config=parallel)


def test_defaults_and_policy_names_or_codes():
    config = validate_eplb_config({}, _vllm(ep=False))
    assert config == EplbConfig() and not config.enabled and config.policy_name == "default"
    assert config.expert_heat_collection_interval == 400 and config.algorithm_execution_interval == 30
    for code, name in enumerate(("random", "default", "swift", "flashlb")):
        assert EplbConfig(eplb_policy_type=code).eplb_policy_type == name
        assert EplbConfig.from_dict({"eplb_policy_type": name}).policy_name == name
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.dynamic_eplb = True  # type: ignore[misc]


@pytest.mark.parametrize(
    "raw, match",
    [
        ({"num_redundant_experts": -1}, f"{P}.num_redundant_experts = -1 is out of range; allowed: >= 0"),
        ({"num_warmup_iterations": 1.5}, f"{P}.num_warmup_iterations must be an integer, got float 1.5"),
        (
            {"expert_heat_collection_interval": 0},
            f"{P}.expert_heat_collection_interval = 0 is out of range; allowed: >= 1",
        ),
        (
            {"algorithm_execution_interval": True},
            f"{P}.algorithm_execution_interval must be an integer, got bool True",
        ),
        ({"dynamic_eplb": "yes"}, f"{P}.dynamic_eplb must be a boolean \\(true or false\\), got str 'yes'"),
        (
            {"load_collection_phase": "both"},
            f"{P}.load_collection_phase = 'both' is invalid; allowed values: 'all', 'prefill', 'decode'",
        ),
        (
            {"eplb_policy_type": 7},
            f"{P}.eplb_policy_type = 7 is invalid; allowed: names 'default', 'flashlb', 'random', 'swift' "
            r"or codes 0 \(random\), 1 \(default\), 2 \(swift\), 3 \(flashlb\)",
        ),
        ({"eplb_policy_type": "greedy"}, f"{P}.eplb_policy_type = 'greedy' is invalid"),
        (
            {"dynamic_epbl": True},
            f"unknown option {P}.dynamic_epbl; did you mean 'dynamic_eplb'\\? Allowed keys: ",
        ),
        ({"color": 1}, f"unknown option {P}.color. Allowed keys: algorithm_execution_interval, dynamic_eplb"),
        ({"expert_map_path": "map.txt"}, f"{P}.expert_map_path must be a path to a .json file or null"),
        (
            {"expert_map_record_path": "out.json"},
            f"{P}.expert_map_record_path requires {P}.dynamic_eplb = true",
        ),
        (
            {"dynamic_eplb": True, "expert_map_path": "m.json", "expert_map_record_path": "m.json"},
            f"{P}.expert_map_record_path must differ from {P}.expert_map_path",
        ),
    ],
)
def test_bad_settings_name_the_field_and_the_allowed_values(raw, match):
    with pytest.raises(ConfigError, match=match):
        validate_eplb_config(raw, _vllm())


def test_section_must_be_an_object():
    with pytest.raises(ConfigError, match=f"{P} must be a JSON object, got list"):
        validate_eplb_config([], None)  # type: ignore[arg-type]


def test_cross_checks_against_vllm_and_the_expert_map(tmp_path):
    for raw, key in (
        ({"dynamic_eplb": True}, "dynamic_eplb"),
        ({"num_redundant_experts": 2}, "num_redundant_experts"),
    ):
        with pytest.raises(ConfigError, match=f"{P}.{key} requires expert parallelism"):
            validate_eplb_config(raw, _vllm(ep=False))
    with pytest.raises(
        ConfigError, match=f"{P}.num_redundant_experts = 2 needs several expert-parallel ranks"
    ):
        validate_eplb_config({"num_redundant_experts": 2}, _vllm())
    with pytest.raises(
        ConfigError, match=f"{P}: 2 redundant experts over 2 expert-parallel ranks are not supported"
    ):
        validate_eplb_config({"num_redundant_experts": 2}, _vllm(tp=2))
    missing = str(tmp_path / "missing.json")
    with pytest.raises(
        ConfigError, match=f"{P}.expert_map_path: expert map file .* is unreadable: No such file or directory"
    ):
        validate_eplb_config({"expert_map_path": missing}, _vllm())
    path = str(tmp_path / "map.json")
    save_expert_map(generate_global_placement(8, 2, 2, num_layers=3), path)  # 2 redundant experts
    assert validate_eplb_config({"expert_map_path": path, "num_redundant_experts": 2}, _vllm()).enabled
    with pytest.raises(ConfigError, match=f"{P}.num_redundant_experts = 1 contradicts .* places 2 redundant"):
        validate_eplb_config({"expert_map_path": path, "num_redundant_experts": 1}, _vllm())
    with pytest.raises(
        ConfigError, match=f"{P}.expert_map_path places experts on 2 ranks; this deployment has 4"
    ):
        validate_eplb_config({"expert_map_path": path}, _vllm(tp=4))
    even = str(tmp_path / "even.json")
    save_expert_map(generate_global_placement(8, 2, 0, num_layers=3), even)  # over 2 ranks, no copies
    assert validate_eplb_config({"expert_map_path": even, "dynamic_eplb": True}, _vllm(tp=2)).dynamic_eplb
    with pytest.raises(ConfigError, match=f"{P}.expert_map_record_path = .*: its directory does not exist"):
        validate_eplb_config(
            {"dynamic_eplb": True, "expert_map_record_path": str(tmp_path / "no" / "out.json")}, _vllm()
        )


def test_initial_table_from_the_map_or_the_default_layout(tmp_path):
    assert EplbConfig().initial_table(4, 2).tolist() == [[[0, 1, 2, 3]]] * 2
    assert EplbConfig(num_redundant_experts=2).initial_table(8, 1, 2).tolist() == [
        [[0, 1, 2, 3, 4], [5, 6, 7, 0, 1]]
    ]
    path = str(tmp_path / "map.json")
    table = generate_global_placement(8, 2, 2, num_layers=3)
    save_expert_map(table, path)
    assert np.array_equal(EplbConfig(expert_map_path=path).initial_table(8, 3), table)
    with pytest.raises(
        EplbInputError, match="describes 3 MoE layers with 8 experts; the model has 2 MoE layers"
    ):
        EplbConfig(expert_map_path=path).initial_table(8, 2)


class Reverse(EplbPolicy):
    """Swaps the first two slots of every rank pair (a policy another package could register)."""

    def plan(self, table: np.ndarray, workload: np.ndarray, n: int) -> np.ndarray:
        return table[:, ::-1]


def test_a_registered_policy_is_accepted_by_name_and_runs_in_the_policy_process():
    EPLB_POLICIES.register("reverse-test", Reverse)
    try:
        config = validate_eplb_config({"eplb_policy_type": "reverse-test"}, None)
        assert config.policy_name == "reverse-test"
        proc = EplbProcess(config.policy_name, mode="thread")
        try:
            proc.submit(np.array([[[0, 1], [2, 3]]]), np.ones((1, 2, 2)))
            plan = proc.get(timeout=30)
        finally:
            proc.shutdown()
        assert plan is not None and plan.new_table.tolist() == [[[2, 3], [0, 1]]]
    finally:
        EPLB_POLICIES.unregister("reverse-test")
    with pytest.raises(ConfigError, match="eplb_policy_type = 'reverse-test' is invalid"):
        EplbConfig(eplb_policy_type="reverse-test")
