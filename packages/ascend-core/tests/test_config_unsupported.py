"""What core refuses (upstream options and variables it does not serve) and the sibling-owned sections."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import pytest

from vllm_ascend.core import envs
from vllm_ascend.core.config import (
    SIBLING_SECTIONS,
    UNSUPPORTED_OPTIONS,
    AscendConfig,
    ConfigError,
    clear_ascend_config,
    get_ascend_config,
    get_section,
    init_ascend_config,
)
from vllm_ascend.core.envs import EnvError
from vllm_ascend.core.registry import CONFIG_SECTIONS, registering_as


@pytest.fixture(autouse=True)
def _fresh(no_sibling_sections, monkeypatch):
    for name in envs.UNSUPPORTED:
        monkeypatch.delenv(name, raising=False)
    clear_ascend_config()
    yield
    clear_ascend_config()


@contextmanager
def section_validator(name: str, validator: Callable[..., Any]) -> Iterator[None]:
    """Register ``validator`` for ``name`` as a sibling would; undone on exit through the journal."""
    with registering_as("vllm-ascend-testdist") as journal:
        CONFIG_SECTIONS.register(name, validator)
        try:
            yield
        finally:
            for registry, entry in reversed(journal):
                registry.unregister(entry)
    assert name not in CONFIG_SECTIONS


def _present(path: str) -> dict[str, Any]:
    """An ``additional_config`` dict in which the option ``path`` (``a`` or ``a.b``) is given."""
    head, _, tail = path.partition(".")
    if tail:
        return {head: {tail: 0.5}}
    return {head: {"enabled": True} if head.endswith("_config") else True}


def _message(path: str) -> str:
    return (
        f"`additional_config.{path}` is not supported yet by vllm-ascend 0.1.0 "
        f"({UNSUPPORTED_OPTIONS[path]}); remove it from additional_config"
    )


# -- refused upstream options ---------------------------------------------------------------
@pytest.mark.parametrize("path", sorted(UNSUPPORTED_OPTIONS))
def test_every_unsupported_option_is_refused_by_name(path):
    data = _present(path)
    with pytest.raises(ConfigError) as info:
        init_ascend_config(data)
    assert f"`additional_config.{path}` is not supported yet by vllm-ascend" in str(info.value)
    assert str(info.value) == _message(path)
    # the same from a vLLM config and from JSON text, and whatever the option's value
    with pytest.raises(ConfigError, match=f"`additional_config.{path}` is not supported yet"):
        init_ascend_config(SimpleNamespace(parallel_config=None, additional_config=data))
    head, _, tail = path.partition(".")
    empty = {head: {tail: None}} if tail else {head: {}}
    with pytest.raises(ConfigError, match=f"`additional_config.{path}` is not supported yet"):
        init_ascend_config(empty)
    with pytest.raises(RuntimeError, match="not initialised"):
        get_ascend_config()


def test_refusal_wins_over_other_errors_and_keeps_the_previous_config():
    good = init_ascend_config({"enable_cpu_binding": True})
    with pytest.raises(ConfigError, match=r"^`additional_config.enable_kv_nz` is not supported yet"):
        init_ascend_config({"enable_kv_nz": True, "enable_cpu_binding": "not a bool"})
    assert get_ascend_config() is good


def test_the_unsupported_table_is_disjoint_from_what_core_serves():
    assert UNSUPPORTED_OPTIONS
    assert all(isinstance(what, str) and what for what in UNSUPPORTED_OPTIONS.values())
    served = set(AscendConfig.option_names())
    assert served == {"rejection_sampler_config", "rl_config", "enable_cpu_binding", "dump_config_path"}
    assert served.isdisjoint(SIBLING_SECTIONS)
    leaves = {row[0] for row in AscendConfig.describe()}
    for path in UNSUPPORTED_OPTIONS:
        head, _, tail = path.partition(".")
        assert head not in SIBLING_SECTIONS, path
        assert f"additional_config.{path}" not in leaves, path
        if not tail:
            assert head not in served, path
        else:  # a refused option inside a served section
            assert head in served, path
            section = AscendConfig.__dataclass_fields__[head].default_factory
            assert tail not in section().option_names(), path


# -- refused environment variables -----------------------------------------------------------
@pytest.mark.parametrize("name", sorted(envs.UNSUPPORTED))
def test_every_unsupported_variable_is_refused_by_init(monkeypatch, name):
    monkeypatch.setenv(name, "1")
    with pytest.raises(EnvError) as info:
        init_ascend_config({})
    assert str(info.value).startswith(f"`{name}` is not supported yet by vllm-ascend 0.1.0 (")
    assert envs.UNSUPPORTED[name] in str(info.value)
    with pytest.raises(EnvError, match=f"`{name}` is not supported yet"):
        envs.check_environment()
    monkeypatch.setenv(name, "")
    assert init_ascend_config({}) == AscendConfig()


def test_unsupported_variables_are_not_declared():
    assert envs.UNSUPPORTED
    assert set(envs.UNSUPPORTED) == {"VLLM_ASCEND_ENABLE_NZ"}
    assert set(envs.UNSUPPORTED).isdisjoint(envs.variables())


# -- verify_method ---------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["strict", "block", "entropy"])
def test_every_verify_method_is_served(method):
    served = init_ascend_config(
        {
            "rejection_sampler_config": {
                "verify_method": method,
                "posterior_threshold": 0.2,
                "posterior_alpha": 0.5,
            }
        }
    )
    section = served.rejection_sampler_config
    assert (section.verify_method, section.posterior_threshold, section.posterior_alpha) == (method, 0.2, 0.5)


def test_upstream_entropy_threshold_is_refused_naming_the_served_options():
    with pytest.raises(ConfigError) as info:
        init_ascend_config(
            {"rejection_sampler_config": {"verify_method": "entropy", "entropy_threshold": 0.5}}
        )
    message = str(info.value)
    assert message.startswith(
        "`additional_config.rejection_sampler_config.entropy_threshold` is not supported yet"
    )
    assert "posterior_threshold / posterior_alpha" in message


# -- sibling-owned sections ------------------------------------------------------------------
def test_sibling_sections_name_their_distribution():
    assert SIBLING_SECTIONS == {
        "eplb_config": "vllm-ascend-eplb",
        "dynamic_spec_config": "vllm-ascend-specdecode",
        "ascend_compilation_config": "vllm-ascend-runner",
    }


@pytest.mark.parametrize(
    ("name", "raw", "extra"),
    [
        ("eplb_config", {"dynamic_eplb": True}, "eplb"),
        ("dynamic_spec_config", {"enabled": True}, "specdecode"),
        ("ascend_compilation_config", {"fuse_norm_quant": False}, "runner"),
    ],
)
def test_present_sibling_section_without_a_validator_names_the_distribution(name, raw, extra):
    assert name not in CONFIG_SECTIONS
    with pytest.raises(ConfigError) as info:
        init_ascend_config({name: raw})
    install = "vllm-ascend" if extra == "runner" else f"vllm-ascend[{extra}]"  # the runner is a default
    assert str(info.value) == (
        f"additional_config.{name} needs the vllm-ascend-{extra} distribution, which is not installed or "
        f"failed to load: pip install '{install}'"
    )
    # absent, the section needs nothing and nothing is validated for it
    init_ascend_config({})
    with pytest.raises(ConfigError, match=rf"no validated additional_config section '{name}'"):
        get_section(name)


def test_dynamic_spec_config_is_served_through_its_sibling_validator():
    """Once refused by name, ``dynamic_spec_config`` now goes to the section's registered validator."""
    assert "dynamic_spec_config" not in UNSUPPORTED_OPTIONS
    with section_validator("dynamic_spec_config", lambda raw, vllm_config: ("validated", dict(raw))):
        init_ascend_config({"dynamic_spec_config": {"enabled": True}})
        assert get_section("dynamic_spec_config") == ("validated", {"enabled": True})


def test_section_that_is_not_an_object_is_refused():
    with section_validator("eplb_config", lambda raw, vllm_config: dict(raw)):
        with pytest.raises(
            ConfigError, match=r"^additional_config.eplb_config must be a JSON object, got list$"
        ):
            init_ascend_config({"eplb_config": [1]})


def test_registered_validator_gets_the_raw_section_and_the_vllm_config():
    calls: list[tuple[Any, Any]] = []
    validated = object()

    def validate(raw, vllm_config):
        calls.append((raw, vllm_config))
        return validated

    raw = {"dynamic_eplb": True, "anything": [1, 2]}
    vllm_config = SimpleNamespace(parallel_config=SimpleNamespace(), additional_config={"eplb_config": raw})
    with section_validator("eplb_config", validate):
        assert CONFIG_SECTIONS.owner("eplb_config") == "vllm-ascend-testdist"
        config = init_ascend_config(vllm_config)
        assert calls == [(raw, vllm_config)] and calls[0][0] is raw
        assert get_section("eplb_config") is validated
        assert config == AscendConfig()  # the section is not one of AscendConfig's fields
        # an absent section is validated too, as {} (and a plain dict source has no vLLM config)
        init_ascend_config({"enable_cpu_binding": True})
        assert calls[1] == ({}, None)
        assert get_section("eplb_config") is validated
        clear_ascend_config()
        with pytest.raises(RuntimeError, match="not initialised"):
            get_section("eplb_config")


def test_validator_errors_propagate_and_keep_the_previous_sections():
    def validate(raw, vllm_config):
        if raw.get("bad"):
            raise ConfigError("additional_config.eplb_config.bad = true is invalid; allowed values: false")
        return dict(raw)

    with section_validator("eplb_config", validate):
        init_ascend_config({"eplb_config": {"bad": False}})
        with pytest.raises(ConfigError, match=r"^additional_config.eplb_config.bad = true is invalid"):
            init_ascend_config({"eplb_config": {"bad": True}})
        assert get_section("eplb_config") == {"bad": False}


def test_a_sibling_may_own_a_new_section():
    with section_validator("testdist_config", lambda raw, vllm_config: ("seen", dict(raw))):
        init_ascend_config({"testdist_config": {"level": 2}})
        assert get_section("testdist_config") == ("seen", {"level": 2})
    with pytest.raises(ConfigError, match=r"^unknown option additional_config.testdist_config"):
        init_ascend_config({"testdist_config": {"level": 2}})


def test_a_failed_registration_block_rolls_back():
    with pytest.raises(RuntimeError, match="boom"), registering_as("vllm-ascend-testdist"):
        CONFIG_SECTIONS.register("eplb_config", lambda raw, vllm_config: raw)
        raise RuntimeError("boom")
    assert "eplb_config" not in CONFIG_SECTIONS
