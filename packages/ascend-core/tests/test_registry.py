"""Registries: lazy paths, unknown and duplicate names, rollback of a failed registration."""

import pytest

from vllm_ascend.core.registry import Registry, RegistryError, load_object, registering_as


def make() -> Registry:
    return Registry("EPLB policy", lambda v: isinstance(v, type), "a policy class")


def test_lazy_path_is_imported_on_get_and_cached():
    reg = make()
    reg.register("od", "collections:OrderedDict")
    import collections

    assert reg.get("od") is collections.OrderedDict
    assert reg.get("od") is reg.get("od")
    assert reg.names() == ["od"] and "od" in reg and len(reg) == 1


def test_unknown_name_lists_registered_names():
    reg = make()
    reg.register("b", dict)
    reg.register("a", list)
    with pytest.raises(RegistryError) as err:
        reg.get("flash")
    assert str(err.value) == "unknown EPLB policy 'flash'; registered: a, b"


def test_unknown_name_in_empty_registry():
    with pytest.raises(RegistryError, match=r"^unknown EPLB policy 'x'; registered: none$"):
        make().get("x")


def test_duplicate_name_names_both_owners():
    reg = make()
    with registering_as("vllm-ascend-eplb"):
        reg.register("swift", dict)
    with registering_as("vllm-ascend-other"), pytest.raises(RegistryError) as err:
        reg.register("swift", list)
    assert str(err.value) == (
        "duplicate EPLB policy 'swift': already registered by vllm-ascend-eplb, "
        "cannot register it again for vllm-ascend-other"
    )
    assert reg.get("swift") is dict


def test_reregistering_identical_value_is_idempotent():
    reg = make()
    reg.register("p", "collections:OrderedDict")
    reg.register("p", "collections:OrderedDict")
    assert reg.names() == ["p"]


def test_type_check_on_register_and_on_lazy_resolution():
    reg = make()
    with pytest.raises(RegistryError, match=r"^EPLB policy 'x': expected a policy class, got 3$"):
        reg.register("x", 3)  # type: ignore[arg-type]
    reg.register("y", "os:sep")
    with pytest.raises(RegistryError, match=r"'os:sep' resolved to '/', expected a policy class"):
        reg.get("y")


def test_empty_name_rejected():
    with pytest.raises(RegistryError, match="name must be a non-empty string"):
        make().register("", dict)


def test_failed_registration_block_rolls_back():
    reg = make()
    with pytest.raises(RuntimeError), registering_as("vllm-ascend-bad"):
        reg.register("one", dict)
        reg.register("two", list)
        raise RuntimeError("boom")
    assert reg.names() == []


def test_load_object_forms_and_errors():
    import os.path

    assert load_object("os.path:join") is os.path.join
    assert load_object("os.path.join") is os.path.join
    with pytest.raises(ValueError, match="invalid object path 'nodots'"):
        load_object("nodots")


def test_owner_returns_to_core_after_a_block():
    reg = make()
    with registering_as("vllm-ascend-eplb"):
        reg.register("inside", dict)
    reg.register("outside", list)
    assert (reg.owner("inside"), reg.owner("outside")) == ("vllm-ascend-eplb", "vllm-ascend-core")


def test_core_registries_are_exactly_the_served_ones():
    from vllm_ascend.core import registry
    from vllm_ascend.core.cli import CliCommand

    assert set(registry.ALL_REGISTRIES) == {
        "quant_methods",
        "spec_decode_methods",
        "model_loaders",
        "device_overlays",
        "device_adaptors",
        "kv_connectors",
        "kv_offload_specs",
        "weight_transfer_engines",
        "doctor_probes",
        "cli_commands",
        "workers",
        "config_sections",
        "moe_placements",
    }
    assert not hasattr(registry, "KERNELS") and not hasattr(registry, "EPLB_POLICIES")
    assert CliCommand is registry.CliCommand  # re-exported by the CLI for siblings


def test_reachability_reports_what_one_owner_registered(monkeypatch):
    from vllm_ascend.core import registry
    from vllm_ascend.core.vllm_bridge import reachability

    for reg in registry.ALL_REGISTRIES.values():
        monkeypatch.setattr(reg, "_entries", dict(reg._entries))
    with registering_as("vllm-ascend-testdist") as journal:
        registry.CONFIG_SECTIONS.register("testdist_config", "builtins:dict")
        registry.CLI_COMMANDS.register("testdist-cmd", "builtins:dict")
    assert len(journal) == 2
    rows = reachability("vllm-ascend-testdist")
    assert rows == [
        {
            "registry": "cli_commands",
            "name": "testdist-cmd",
            "reached": True,
            "via": "vllm-ascend testdist-cmd",
        },
        {
            "registry": "config_sections",
            "name": "testdist_config",
            "reached": True,
            "via": "additional_config.testdist_config",
        },
    ]
    assert reachability("vllm-ascend-nobody") == []


def test_installed_vllm_is_in_the_supported_range():
    pytest.importorskip("vllm")
    from vllm_ascend.core.vllm_version import SUPPORTED_VLLM_RANGE, installed_vllm, vllm_version_is

    found = installed_vllm()
    assert found is not None and found.supported, (found, SUPPORTED_VLLM_RANGE)
    assert vllm_version_is(SUPPORTED_VLLM_RANGE) and not vllm_version_is("<0.1")
