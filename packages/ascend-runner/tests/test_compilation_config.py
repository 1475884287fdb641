"""``additional_config.ascend_compilation_config`` and the GraphFusionPassManager built from it."""

from __future__ import annotations

import pytest
from vllm.compilation.passes.inductor_pass import pass_context
from vllm.compilation.passes.pass_manager import PostGradPassManager
from vllm.compilation.passes.utility.fix_functionalization import FixFunctionalizationPass
from vllm.config import VllmConfig
from vllm.config.utils import Range

from vllm_ascend.core.config import ConfigError, get_section, init_ascend_config
from vllm_ascend.core.extensions import load_extensions
from vllm_ascend.core.registry import CONFIG_SECTIONS
from vllm_ascend.runner.compilation.config import AscendCompilationConfig, validate_ascend_compilation_config
from vllm_ascend.runner.compilation.pass_manager import GraphFusionPassManager, ascend_passes

SWITCHES = (
    "enable_graph_fusion",
    "fuse_norm_quant",
    "fuse_qknorm_rope",
    "fuse_muls_add",
    "fuse_act_quant",
    "eliminate_noops",
)
ALL_PASSES = [
    "NoOpEliminationPass",
    "AddRMSNormQuantFusionPass",
    "RMSNormQuantFusionPass",
    "QKNormRopeFusionPass",
    "SwiGLUQuantFusionPass",
    "MulsAddFusionPass",
]


def test_every_switch_defaults_to_true():
    config = validate_ascend_compilation_config({})
    assert sorted(AscendCompilationConfig.option_names()) == sorted(SWITCHES)
    assert all(getattr(config, name) is True for name in SWITCHES)
    assert [cls.NAME for cls in ascend_passes(config)] == ALL_PASSES


def test_unknown_key_names_the_allowed_keys():
    with pytest.raises(ConfigError) as info:
        validate_ascend_compilation_config({"fuse_qk_norm": True})
    message = str(info.value)
    assert "additional_config.ascend_compilation_config.fuse_qk_norm" in message
    assert "did you mean 'fuse_qknorm_rope'" in message
    assert "Allowed keys: " + ", ".join(sorted(SWITCHES)) in message


def test_non_boolean_switch_is_refused():
    with pytest.raises(ConfigError, match=r"ascend_compilation_config.fuse_muls_add must be a boolean"):
        validate_ascend_compilation_config({"fuse_muls_add": "yes"})


def test_master_switch_and_single_switches_select_the_passes():
    assert ascend_passes(AscendCompilationConfig(enable_graph_fusion=False)) == []
    names = [
        cls.NAME
        for cls in ascend_passes(AscendCompilationConfig(fuse_norm_quant=False, eliminate_noops=False))
    ]
    assert names == ["QKNormRopeFusionPass", "SwiGLUQuantFusionPass", "MulsAddFusionPass"]


def test_section_is_registered_and_read_through_core():
    load_extensions()
    assert "ascend_compilation_config" in CONFIG_SECTIONS
    init_ascend_config({})
    assert get_section("ascend_compilation_config") == AscendCompilationConfig()
    manager = GraphFusionPassManager()
    manager.configure(VllmConfig())
    assert manager.section == AscendCompilationConfig()
    assert [type(p).__name__ for p in manager.passes] == ALL_PASSES


def _configured(section: AscendCompilationConfig) -> GraphFusionPassManager:
    manager = GraphFusionPassManager(section)
    manager.configure(VllmConfig())
    return manager


def test_manager_runs_only_ascend_passes_and_vllm_utilities():
    manager = _configured(AscendCompilationConfig())
    assert isinstance(manager, PostGradPassManager)
    assert [type(p).__name__ for p in manager.passes] == ALL_PASSES
    assert all(type(p).__module__.startswith("vllm_ascend.runner.compilation") for p in manager.passes)
    for utility in ("post_cleanup", "ir_lowering", "clone_elimination"):
        assert type(getattr(manager, utility)).__module__.startswith("vllm.compilation")
    assert isinstance(manager.fix_functionalization, FixFunctionalizationPass)
    assert _configured(AscendCompilationConfig(enable_graph_fusion=False)).passes == []


def test_uuid_follows_the_section_values():
    with pass_context(Range(start=1, end=16)):
        default = _configured(AscendCompilationConfig()).uuid()
        assert _configured(AscendCompilationConfig()).uuid() == default
        uuids = {default}
        for name in SWITCHES:
            uuids.add(_configured(AscendCompilationConfig(**{name: False})).uuid())
    assert len(uuids) == 1 + len(SWITCHES)
