"""Bad additional_config input: every error names the full key path and what is allowed."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from vllm_ascend.core.config import AscendConfig, ConfigError, EplbConfig

TOP_KEYS = (
    "ascend_compilation_config, batch_job_sched_config, dump_config_path, dynamic_spec_config, "
    "dyntra_lb_config, enable_cpu_binding, enable_kv_nz, enable_megamoe, enable_shared_expert_dp, "
    "eplb_config, finegrained_tp_config, mc2_comm_algorithm, multistream_overlap_shared_expert, "
    "profiling_chunk_config, rejection_sampler_config, rl_config, scheduler_config, "
    "short_request_first_config, sparse_kv_offload_config, xlite_graph_config"
)
EPLB_KEYS = (
    "algorithm_execution_interval, dynamic_eplb, eplb_policy_type, expert_heat_collection_interval, "
    "expert_map_path, expert_map_record_path, load_collection_phase, num_redundant_experts, "
    "num_warmup_iterations"
)
P = "additional_config"
E = f"{P}.eplb_config"
POLICIES = "0, 1, 2, 3 (or 'random', 'default', 'swift', 'flashlb')"

CASES = [
    # unknown keys, with and without a suggestion
    (
        {"eplb_conifg": {}},
        f"unknown option {P}.eplb_conifg; did you mean 'eplb_config'? Allowed keys: {TOP_KEYS}",
    ),
    ({"zzz": 1}, f"unknown option {P}.zzz. Allowed keys: {TOP_KEYS}"),
    (
        {"eplb_config": {"dynamic_eplbb": True}},
        f"unknown option {E}.dynamic_eplbb; did you mean 'dynamic_eplb'? Allowed keys: {EPLB_KEYS}",
    ),
    (
        {"ascend_compilation_config": {"fusion": {"fuse_norm_quantt": False}}},
        f"unknown option {P}.ascend_compilation_config.fusion.fuse_norm_quantt; did you mean 'fuse_norm_quant'? "
        "Allowed keys: eliminate_noop, fold_allgather_chunk, fuse_muls_add, fuse_norm_quant, fuse_qknorm_rope",
    ),
    (
        {"enable_kv_nzz": True},
        f"unknown option {P}.enable_kv_nzz; did you mean 'enable_kv_nz'? Allowed keys: {TOP_KEYS}",
    ),
    # wrong types
    (
        {"eplb_config": {"num_redundant_experts": "x"}},
        f"{E}.num_redundant_experts must be an integer, got str 'x'",
    ),
    (
        {"eplb_config": {"num_redundant_experts": True}},
        f"{E}.num_redundant_experts must be an integer, got bool True",
    ),
    (
        {"eplb_config": {"algorithm_execution_interval": 2.5}},
        f"{E}.algorithm_execution_interval must be an integer, got float 2.5",
    ),
    (
        {"eplb_config": {"dynamic_eplb": "yes"}},
        f"{E}.dynamic_eplb must be a boolean (true or false), got str 'yes'",
    ),
    ({"eplb_config": {"dynamic_eplb": None}}, f"{E}.dynamic_eplb must not be null"),
    ({"eplb_config": 5}, f"{E} must be a JSON object (allowed keys: {EPLB_KEYS}), got int 5"),
    ({"dump_config_path": 5}, f"{P}.dump_config_path must be a string, got int 5"),
    (
        {"ascend_compilation_config": {"compile_ranges_split_points": "8"}},
        f"{P}.ascend_compilation_config.compile_ranges_split_points must be a list, got str '8'",
    ),
    (
        {"ascend_compilation_config": {"compile_ranges_split_points": [4, "x"]}},
        f"{P}.ascend_compilation_config.compile_ranges_split_points[1] must be an integer, got str 'x'",
    ),
    (
        {"sparse_kv_offload_config": {"host_buffer_gb": "8"}},
        f"{P}.sparse_kv_offload_config.host_buffer_gb must be a number, got str '8'",
    ),
    # out of range / not an allowed value
    (
        {"eplb_config": {"num_redundant_experts": -1}},
        f"{E}.num_redundant_experts = -1 is out of range; allowed: >= 0",
    ),
    (
        {"eplb_config": {"expert_heat_collection_interval": 0}},
        f"{E}.expert_heat_collection_interval = 0 is out of range; allowed: >= 1",
    ),
    (
        {"eplb_config": {"load_collection_phase": "both"}},
        f"{E}.load_collection_phase = 'both' is invalid; allowed values: 'all', 'prefill', 'decode'",
    ),
    (
        {"eplb_config": {"num_warmup_iterations": -5}},
        f"{E}.num_warmup_iterations = -5 is out of range; allowed: >= 0",
    ),
    (
        {"eplb_config": {"eplb_policy_type": 7}},
        f"{E}.eplb_policy_type = 7 is invalid; allowed values: {POLICIES}",
    ),
    (
        {"eplb_config": {"eplb_policy_type": "greedy"}},
        f"{E}.eplb_policy_type = 'greedy' is invalid; allowed values: {POLICIES}",
    ),
    (
        {"ascend_compilation_config": {"compile_ranges_split_points": [0, 8]}},
        f"{P}.ascend_compilation_config.compile_ranges_split_points[0] = 0 is out of range; allowed: >= 1",
    ),
    (
        {"rejection_sampler_config": {"verify_method": "greedy"}},
        f"{P}.rejection_sampler_config.verify_method = 'greedy' is invalid; allowed values: 'strict', 'block', 'entropy'",
    ),
    (
        {"rejection_sampler_config": {"verify_method": "entropy", "entropy_threshold": 0}},
        f"{P}.rejection_sampler_config.entropy_threshold = 0.0 is out of range; allowed: > 0",
    ),
    ({"rl_config": {"sleep_level": 3}}, f"{P}.rl_config.sleep_level = 3 is invalid; allowed values: 1, 2"),
    (
        {"finegrained_tp_config": {"lmhead_tensor_parallel_size": -2}},
        f"{P}.finegrained_tp_config.lmhead_tensor_parallel_size = -2 is out of range; allowed: >= 0",
    ),
    (
        {"profiling_chunk_config": {"min_chunk_size": 8}},
        f"{P}.profiling_chunk_config.min_chunk_size = 8 is out of range; allowed: >= 16",
    ),
    (
        {"dyntra_lb_config": {"imbalance_threshold": 0.9}},
        f"{P}.dyntra_lb_config.imbalance_threshold = 0.9 is out of range; allowed: >= 1",
    ),
    (
        {"sparse_kv_offload_config": {"offload_ratio": 1.5}},
        f"{P}.sparse_kv_offload_config.offload_ratio = 1.5 is out of range; allowed: > 0 and <= 1",
    ),
    (
        {"sparse_kv_offload_config": {"kv_cache_dtype": "int4"}},
        f"{P}.sparse_kv_offload_config.kv_cache_dtype = 'int4' is invalid; allowed values: 'auto', 'c8'",
    ),
    (
        {"mc2_comm_algorithm": "ring"},
        f"{P}.mc2_comm_algorithm = 'ring' is invalid; allowed values: 'auto', 'fullmesh', 'hierarchy'",
    ),
    # conflicting options inside a section
    (
        {"eplb_config": {"expert_map_record_path": "/tmp/out.json"}},
        f"{E}.expert_map_record_path requires {E}.dynamic_eplb = true (only dynamic EPLB computes placements to record)",
    ),
    (
        {"eplb_config": {"expert_map_path": "map.txt"}},
        f"{E}.expert_map_path = 'map.txt' must name a .json file",
    ),
    (
        {
            "eplb_config": {
                "dynamic_eplb": True,
                "expert_map_path": "m.json",
                "expert_map_record_path": "m.json",
            }
        },
        f"{E}.expert_map_record_path must differ from {E}.expert_map_path (recording would overwrite the input map)",
    ),
    (
        {"ascend_compilation_config": {"compile_ranges_split_points": [8, 8]}},
        f"{P}.ascend_compilation_config.compile_ranges_split_points must be strictly increasing; [1] = 8 follows 8",
    ),
    (
        {"rejection_sampler_config": {"entropy_threshold": 0.3}},
        f"{P}.rejection_sampler_config.entropy_threshold only applies when "
        f"{P}.rejection_sampler_config.verify_method = 'entropy' (got 'strict')",
    ),
    (
        {"dynamic_spec_config": {"min_num_speculative_tokens": 4, "max_num_speculative_tokens": 2}},
        f"{P}.dynamic_spec_config.min_num_speculative_tokens = 4 must be <= {P}.dynamic_spec_config.max_num_speculative_tokens = 2",
    ),
    (
        {"xlite_graph_config": {"full_mode": True}},
        f"{P}.xlite_graph_config.full_mode = true requires {P}.xlite_graph_config.enabled = true",
    ),
    (
        {"profiling_chunk_config": {"min_chunk_size": 512, "max_chunk_size": 256}},
        f"{P}.profiling_chunk_config.min_chunk_size = 512 must be <= {P}.profiling_chunk_config.max_chunk_size = 256",
    ),
    (
        {"scheduler_config": {"scheduler_cls": "MyScheduler"}},
        f"{P}.scheduler_config.scheduler_cls = 'MyScheduler' must be a qualified name like 'package.module.Class'",
    ),
    (
        {"scheduler_config": {"scheduler_cls": "pkg.mod.Sched", "recompute_scheduler_enable": True}},
        f"{P}.scheduler_config.scheduler_cls and {P}.scheduler_config.recompute_scheduler_enable = true "
        "both choose the scheduler; set only one",
    ),
    # conflicting options across sections
    (
        {"xlite_graph_config": {"enabled": True}, "ascend_compilation_config": {"enable_npugraph_ex": True}},
        f"{P}.xlite_graph_config.enabled = true conflicts with {P}.ascend_compilation_config.enable_npugraph_ex = true "
        "(two graph runtimes); enable one",
    ),
    (
        {"sparse_kv_offload_config": {"enabled": True, "kv_cache_dtype": "c8"}, "enable_kv_nz": True},
        f"{P}.sparse_kv_offload_config.kv_cache_dtype = 'c8' is incompatible with {P}.enable_kv_nz = true "
        "(C8 offload copies ND blocks); disable one",
    ),
    (
        {"scheduler_config": {"scheduler_cls": "a.B"}, "dyntra_lb_config": {"enabled": True}},
        f"{P}.scheduler_config.scheduler_cls conflicts with {P}.dyntra_lb_config.enabled = true "
        "(DyntraLB brings its own scheduler); set only one",
    ),
    (
        {"short_request_first_config": {"enabled": True}, "batch_job_sched_config": {"enabled": True}},
        f"{P}.short_request_first_config.enabled = true conflicts with {P}.batch_job_sched_config.enabled = true "
        "(both reorder the waiting queue); enable one",
    ),
]


@pytest.mark.parametrize(("data", "message"), CASES, ids=[str(i) for i in range(len(CASES))])
def test_bad_additional_config_is_rejected_with_exact_message(data, message):
    with pytest.raises(ConfigError) as info:
        AscendConfig.from_dict(data)
    assert str(info.value) == message


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


def test_additional_config_must_be_an_object():
    with pytest.raises(ConfigError) as info:
        AscendConfig.from_dict([1])  # type: ignore[arg-type]
    assert str(info.value) == "additional_config must be a JSON object, got list [1]"


def test_invalid_json_is_reported():
    with pytest.raises(ConfigError, match=r"^additional_config is not valid JSON: Expecting ',' delimiter"):
        AscendConfig.from_json('{"eplb_config": {"dynamic_eplb": true "x": 1}}')


def test_direct_construction_is_validated_too():
    with pytest.raises(ConfigError) as info:
        EplbConfig(num_redundant_experts=-3)
    assert str(info.value) == f"{E}.num_redundant_experts = -3 is out of range; allowed: >= 0"
    with pytest.raises(ConfigError) as info:
        AscendConfig(eplb_config={"dynamic_eplb": 1})  # type: ignore[arg-type]
    assert str(info.value) == f"{E}.dynamic_eplb must be a boolean (true or false), got int 1"


def test_replace_revalidates():
    config = AscendConfig()
    with pytest.raises(ConfigError, match=r"additional_config.mc2_comm_algorithm = 'x' is invalid"):
        config.replace(mc2_comm_algorithm="x")


def _vllm(tp=1, dp=1, ep=False, spec_tokens=None, max_batched=8192):
    return SimpleNamespace(
        parallel_config=SimpleNamespace(
            tensor_parallel_size=tp, data_parallel_size=dp, enable_expert_parallel=ep
        ),
        speculative_config=None
        if spec_tokens is None
        else SimpleNamespace(num_speculative_tokens=spec_tokens),
        scheduler_config=SimpleNamespace(max_num_batched_tokens=max_batched, max_num_seqs=256),
        additional_config={},
    )


NEED_EP = (
    "requires expert parallelism (parallel_config.enable_expert_parallel = True, --enable-expert-parallel)"
)

VLLM_CASES = [
    ({"eplb_config": {"dynamic_eplb": True}}, _vllm(), f"{E}.dynamic_eplb {NEED_EP}"),
    ({"eplb_config": {"num_redundant_experts": 2}}, _vllm(), f"{E}.num_redundant_experts {NEED_EP}"),
    ({"mc2_comm_algorithm": "fullmesh"}, _vllm(), f"{P}.mc2_comm_algorithm = 'fullmesh' {NEED_EP}"),
    ({"enable_megamoe": True}, _vllm(), f"{P}.enable_megamoe = true {NEED_EP}"),
    (
        {"finegrained_tp_config": {"lmhead_tensor_parallel_size": 3}},
        _vllm(tp=2, dp=2),
        f"{P}.finegrained_tp_config.lmhead_tensor_parallel_size = 3 must divide the world size "
        "tensor_parallel_size × data_parallel_size = 2 × 2 = 4",
    ),
    (
        {"dyntra_lb_config": {"enabled": True}},
        _vllm(dp=1),
        f"{P}.dyntra_lb_config.enabled = true requires data_parallel_size >= 2 (got 1)",
    ),
    (
        {"enable_shared_expert_dp": True},
        _vllm(tp=1),
        f"{P}.enable_shared_expert_dp = true requires tensor_parallel_size >= 2 (got 1)",
    ),
    (
        {"rejection_sampler_config": {"verify_method": "block"}},
        _vllm(),
        f"{P}.rejection_sampler_config.verify_method = 'block' requires speculative decoding (vLLM speculative_config)",
    ),
    (
        {"dynamic_spec_config": {"enabled": True}},
        _vllm(),
        f"{P}.dynamic_spec_config.enabled = true requires speculative decoding (vLLM speculative_config)",
    ),
    (
        {"dynamic_spec_config": {"enabled": True, "max_num_speculative_tokens": 5}},
        _vllm(spec_tokens=3),
        f"{P}.dynamic_spec_config.max_num_speculative_tokens = 5 must be <= speculative_config.num_speculative_tokens = 3",
    ),
    (
        {"ascend_compilation_config": {"compile_ranges_split_points": [512, 8192]}},
        _vllm(max_batched=8192),
        f"{P}.ascend_compilation_config.compile_ranges_split_points[1] = 8192 must be < "
        "scheduler_config.max_num_batched_tokens = 8192",
    ),
    (
        {"profiling_chunk_config": {"max_chunk_size": 4096}},
        _vllm(max_batched=2048),
        f"{P}.profiling_chunk_config.max_chunk_size = 4096 must be <= scheduler_config.max_num_batched_tokens = 2048",
    ),
]


@pytest.mark.parametrize(
    ("data", "vllm_config", "message"), VLLM_CASES, ids=[str(i) for i in range(len(VLLM_CASES))]
)
def test_conflicts_with_vllm_config_are_rejected(data, vllm_config, message):
    config = AscendConfig.from_dict(data)
    with pytest.raises(ConfigError) as info:
        config.derive_and_validate(vllm_config)
    assert str(info.value) == message


FAMILY_CASES = [
    (
        {"mc2_comm_algorithm": "hierarchy"},
        "A3",
        f"{P}.mc2_comm_algorithm = 'hierarchy' is not available on A3; allowed on A3: 'auto', 'fullmesh'",
    ),
    (
        {"mc2_comm_algorithm": "fullmesh"},
        "310P",
        f"{P}.mc2_comm_algorithm = 'fullmesh' is not available on 310P; allowed on 310P: auto (MC2 is not used)",
    ),
    (
        {"enable_megamoe": True},
        "A2",
        f"{P}.enable_megamoe = true is not supported on A2; supported families: A3, A5",
    ),
]


@pytest.mark.parametrize(("data", "family", "message"), FAMILY_CASES)
def test_family_specific_options_are_checked(data, family, message):
    with pytest.raises(ConfigError) as info:
        AscendConfig.from_dict(data).derive_and_validate(family=family)
    assert str(info.value) == message


def test_family_dependent_options_pass_where_supported():
    a2 = AscendConfig.from_dict({"mc2_comm_algorithm": "hierarchy"}).derive_and_validate(family="A2")
    assert a2.mc2_comm_algorithm == "hierarchy"
    a5 = AscendConfig.from_dict({"enable_megamoe": True}).derive_and_validate(
        _vllm(ep=True, tp=2), family="A5"
    )
    assert a5.enable_megamoe is True
