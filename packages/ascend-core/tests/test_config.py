"""AscendConfig defaults, derived values, dict/JSON round trip, dump, and the process-wide lifecycle."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

import vllm_ascend.core as core
from vllm_ascend.core.config import (
    AscendCompilationConfig,
    AscendConfig,
    ConfigError,
    clear_ascend_config,
    get_ascend_config,
    init_ascend_config,
    supports_megamoe,
)


@pytest.fixture(autouse=True)
def _fresh():
    clear_ascend_config()
    yield
    clear_ascend_config()


def _vllm(additional=None, tp=1, dp=1, ep=False, spec_tokens=None, max_batched=8192):
    return SimpleNamespace(
        parallel_config=SimpleNamespace(
            tensor_parallel_size=tp, data_parallel_size=dp, enable_expert_parallel=ep
        ),
        speculative_config=None
        if spec_tokens is None
        else SimpleNamespace(num_speculative_tokens=spec_tokens),
        scheduler_config=SimpleNamespace(max_num_batched_tokens=max_batched, max_num_seqs=256),
        additional_config=additional if additional is not None else {},
    )


def test_defaults_match_the_intended_behaviour():
    c = AscendConfig()
    # EPLB off by default, swift policy, upstream's collection/execution intervals.
    assert (c.eplb_config.dynamic_eplb, c.eplb_config.enabled) == (False, False)
    assert c.eplb_config.eplb_policy_type == 2 and c.eplb_config.policy_name == "swift"
    assert c.eplb_config.expert_heat_collection_interval == 400
    assert c.eplb_config.algorithm_execution_interval == 30
    assert c.eplb_config.num_redundant_experts == 0
    assert (c.eplb_config.num_warmup_iterations, c.eplb_config.load_collection_phase) == (0, "all")
    # graph fusion on with every pass; no split points.
    comp = c.ascend_compilation_config
    assert comp.enable_graph_fusion and not comp.enable_npugraph_ex
    assert comp.compile_ranges_split_points == ()
    assert all(comp.fusion.to_dict().values())
    # every optional feature is off by default.
    for key in (
        "rl_config",
        "dynamic_spec_config",
        "xlite_graph_config",
        "profiling_chunk_config",
        "batch_job_sched_config",
        "short_request_first_config",
        "dyntra_lb_config",
        "sparse_kv_offload_config",
    ):
        assert getattr(c, key).enabled is False, key
    assert c.rejection_sampler_config.verify_method == "strict"
    assert c.rejection_sampler_config.entropy_threshold is None
    assert c.finegrained_tp_config.to_dict() == dict.fromkeys(
        [
            "lmhead_tensor_parallel_size",
            "embedding_tensor_parallel_size",
            "oproj_tensor_parallel_size",
            "mlp_tensor_parallel_size",
        ],
        0,
    )
    assert not c.finegrained_tp_config.lmhead_tp_enable
    assert c.mc2_comm_algorithm == "auto" and c.dump_config_path is None
    assert AscendConfig.from_dict({}) == AscendConfig.from_dict(None) == c


def test_derived_values_inside_sections():
    c = AscendConfig.from_dict(
        {"rl_config": {"enabled": True}, "rejection_sampler_config": {"verify_method": "entropy"}}
    )
    assert c.rl_config.batch_invariant is True
    assert c.rejection_sampler_config.entropy_threshold == 0.5
    explicit = AscendConfig.from_dict({"rl_config": {"enabled": True, "batch_invariant": False}})
    assert explicit.rl_config.batch_invariant is False
    assert AscendConfig().rl_config.batch_invariant is False


@pytest.mark.parametrize(
    ("given", "code", "name"),
    [(0, 0, "random"), ("DEFAULT", 1, "default"), ("swift", 2, "swift"), ("flashlb", 3, "flashlb")],
)
def test_eplb_policy_accepts_codes_and_names(given, code, name):
    eplb = AscendConfig.from_dict({"eplb_config": {"eplb_policy_type": given}}).eplb_config
    assert (eplb.eplb_policy_type, eplb.policy_name) == (code, name)


def test_derive_fills_values_from_vllm_config():
    c = AscendConfig.from_dict(
        {
            "dynamic_spec_config": {"enabled": True},
            "profiling_chunk_config": {"enabled": True},
            "rejection_sampler_config": {"verify_method": "block"},
        }
    )
    derived = c.derive_and_validate(_vllm(spec_tokens=4, max_batched=2048))
    assert derived.dynamic_spec_config.max_num_speculative_tokens == 4
    assert derived.profiling_chunk_config.max_chunk_size == 2048
    assert c.dynamic_spec_config.max_num_speculative_tokens is None  # the original is unchanged (frozen)


def test_eplb_with_expert_parallel_passes_and_lmhead_tp_divides_world():
    c = AscendConfig.from_dict(
        {
            "eplb_config": {
                "dynamic_eplb": True,
                "num_redundant_experts": 16,
                "expert_map_record_path": "/x/rec.json",
            },
            "finegrained_tp_config": {"lmhead_tensor_parallel_size": 4},
        }
    )
    assert c.derive_and_validate(_vllm(tp=2, dp=4, ep=True)) == c
    assert c.eplb_config.enabled and c.finegrained_tp_config.lmhead_tp_enable


def test_compile_ranges():
    comp = AscendCompilationConfig(compile_ranges_split_points=[16, 128, 4096])
    assert comp.compile_ranges(1024) == [(1, 16), (17, 128), (129, 1024)]
    assert AscendCompilationConfig().compile_ranges(512) == [(1, 512)]


NON_DEFAULT = {
    "ascend_compilation_config": {"compile_ranges_split_points": [8, 64], "fusion": {"fuse_muls_add": False}},
    "eplb_config": {
        "dynamic_eplb": True,
        "expert_map_path": "/m/in.json",
        "expert_map_record_path": "/m/out.json",
        "num_redundant_experts": 8,
        "eplb_policy_type": "flashlb",
    },
    "rejection_sampler_config": {"verify_method": "entropy", "entropy_threshold": 1.25},
    "rl_config": {"enabled": True, "sleep_level": 2},
    "dynamic_spec_config": {
        "enabled": True,
        "min_num_speculative_tokens": 1,
        "max_num_speculative_tokens": 3,
    },
    "finegrained_tp_config": {"oproj_tensor_parallel_size": 2},
    "xlite_graph_config": {"enabled": True, "full_mode": True},
    "profiling_chunk_config": {"enabled": True, "target_step_latency_ms": 30, "max_chunk_size": 1024},
    "batch_job_sched_config": {"enabled": True, "max_jobs_per_batch": 32},
    "dyntra_lb_config": {"enabled": True, "diagnostics": True},
    "scheduler_config": {"recompute_scheduler_enable": True},
    "sparse_kv_offload_config": {"enabled": True, "kv_cache_dtype": "c8", "offload_ratio": 0.25},
    "enable_cpu_binding": True,
    "mc2_comm_algorithm": "fullmesh",
}


def test_dict_round_trip():
    c = AscendConfig.from_dict(NON_DEFAULT)
    d = c.to_dict()
    assert AscendConfig.from_dict(d) == c
    assert d["eplb_config"]["eplb_policy_type"] == 3
    assert d["ascend_compilation_config"]["compile_ranges_split_points"] == [8, 64]
    assert d["profiling_chunk_config"]["target_step_latency_ms"] == 30.0
    assert c != AscendConfig()
    assert AscendConfig.from_dict(AscendConfig().to_dict()) == AscendConfig()


def test_json_round_trip_and_dump(tmp_path):
    c = AscendConfig.from_dict(NON_DEFAULT)
    text = c.to_json()
    assert json.loads(text) == c.to_dict()
    assert AscendConfig.from_json(text) == c
    written = c.dump(tmp_path / "sub" / "ascend.json")
    assert AscendConfig.from_json(written.read_text()) == c


def test_dump_to_unwritable_path_names_the_key(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(
        ConfigError, match=r"^additional_config.dump_config_path = '.*/file/c.json' cannot be written"
    ):
        AscendConfig().dump(blocker / "c.json")


def test_lifecycle_init_get_clear():
    with pytest.raises(RuntimeError, match="Ascend config is not initialised in this process"):
        get_ascend_config()
    c = init_ascend_config({"eplb_config": {"num_redundant_experts": 2}}, family="A3")
    assert get_ascend_config() is c and c.eplb_config.num_redundant_experts == 2
    c2 = init_ascend_config('{"enable_kv_nz": true}', family="A3")
    assert get_ascend_config() is c2 and c2.enable_kv_nz and c2.eplb_config.num_redundant_experts == 0
    clear_ascend_config()
    with pytest.raises(RuntimeError):
        get_ascend_config()


def test_init_from_vllm_like_config_reads_additional_config_and_checks_parallelism():
    c = init_ascend_config(_vllm({"eplb_config": {"num_redundant_experts": 4}}, tp=2, ep=True), family="A3")
    assert c.eplb_config.num_redundant_experts == 4
    with pytest.raises(ConfigError, match=r"eplb_config.num_redundant_experts requires expert parallelism"):
        init_ascend_config(_vllm({"eplb_config": {"num_redundant_experts": 4}}, ep=False), family="A3")
    # a failed init leaves the previous config in place
    assert get_ascend_config() is c


def test_init_rejects_non_dict_additional_config_and_unknown_sources():
    with pytest.raises(ConfigError) as info:
        init_ascend_config(SimpleNamespace(additional_config=[1, 2]))
    assert str(info.value) == "additional_config must be a JSON object (dict), got list [1, 2]"
    with pytest.raises(ConfigError) as info:
        init_ascend_config(42)
    assert str(info.value) == "init_ascend_config expects a vLLM VllmConfig, a dict or a JSON string, got int"


def test_init_dumps_when_asked(tmp_path):
    target = tmp_path / "dump" / "cfg.json"
    c = init_ascend_config({"dump_config_path": str(target), "enable_cpu_binding": True}, family="A2")
    assert json.loads(target.read_text()) == c.to_dict()
    assert json.loads(target.read_text())["enable_cpu_binding"] is True


def test_supports_megamoe():
    on = AscendConfig.from_dict({"enable_megamoe": True})
    assert supports_megamoe(on, "A3", expert_parallel=True)
    assert not supports_megamoe(on, "A2", expert_parallel=True)
    assert not supports_megamoe(on, "A5", expert_parallel=False)
    assert not supports_megamoe(AscendConfig(), "A5", expert_parallel=True)


def test_describe_lists_every_leaf_option_with_help():
    rows = AscendConfig.describe()
    paths = [r[0] for r in rows]
    assert "additional_config.eplb_config.expert_heat_collection_interval" in paths
    assert "additional_config.ascend_compilation_config.fusion.fuse_qknorm_rope" in paths
    assert len(paths) == len(set(paths)) == 59
    assert all(r[3] for r in rows)


def test_lazy_exports_from_core():
    assert core.AscendConfig is AscendConfig
    assert core.init_ascend_config is init_ascend_config
    assert core.get_ascend_config is get_ascend_config
    assert core.clear_ascend_config is clear_ascend_config


@pytest.mark.parametrize("mode", ["reference", "off"])
def test_family_checks_are_skipped_without_a_device_family(monkeypatch, mode):
    from vllm_ascend.core.device.config import clear_device_caches
    from vllm_ascend.core.family import current_family

    monkeypatch.setenv("VLLM_ASCEND_DEVICE", mode)
    clear_device_caches()
    try:
        assert current_family() is None
        # 'hierarchy' is A2-only, but with no family known only the family-independent checks run
        assert init_ascend_config({"mc2_comm_algorithm": "hierarchy"}).mc2_comm_algorithm == "hierarchy"
    finally:
        clear_device_caches()


def test_worker_process_builds_the_config_from_vllms_current_config():
    pytest.importorskip("vllm")
    from vllm.config import VllmConfig, set_current_vllm_config

    vllm_config = VllmConfig(additional_config={"enable_kv_nz": True, "eplb_config": {"eplb_policy_type": 0}})
    clear_ascend_config()  # as in a worker process: the platform hook ran elsewhere
    with set_current_vllm_config(vllm_config):
        config = get_ascend_config()
    assert config.enable_kv_nz is True and config.eplb_config.policy_name == "random"
    assert get_ascend_config() is config
