"""Extension discovery and loading: order, once-only, failure isolation, disable list, skew guard."""

import pytest

from vllm_ascend.core.extensions import DescriptorError, ExtensionDescriptor


def noop_register() -> None:
    return None


def fake_records(records: dict) -> dict:
    return {k: v for k, v in records.items() if v["dist"].startswith("vllm-ascend-fake")}


def test_good_extension_loads_and_fills_registry(fake_dists, good_source):
    fake_dists.add("vllm-ascend-fakegood", "fakegood", good_source("fakegood", policy="fakepolicy"))
    proc = fake_dists.run(
        """
        from vllm_ascend.core.extensions import load_extensions
        from vllm_ascend.core.registry import SPEC_DECODE_METHODS
        rec = load_extensions()["fakegood"]
        print(rec.status.value, rec.version, rec.provides, SPEC_DECODE_METHODS.owner("fakepolicy"), SPEC_DECODE_METHODS.get("fakepolicy").__name__)
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [
        "loaded",
        "9.9.9",
        "('spec_decode_methods',)",
        "vllm-ascend-fakegood",
        "OrderedDict",
    ]


def test_loading_is_once_per_process_and_in_name_order(fake_dists, good_source):
    counting = good_source("fakeb", policy="pb").replace(
        "def register():",
        "def register():\n    import builtins; builtins.ORDER = getattr(builtins, 'ORDER', []) + ['fakeb']",
    )
    fake_dists.add("vllm-ascend-fakeb", "fakeb", counting)
    fake_dists.add(
        "vllm-ascend-fakea",
        "fakea",
        good_source("fakea", policy="pa").replace(
            "def register():",
            "def register():\n    import builtins; builtins.ORDER = getattr(builtins, 'ORDER', []) + ['fakea']",
        ),
    )
    proc = fake_dists.run(
        """
        import builtins
        from vllm_ascend.core.extensions import load_extensions
        from vllm_ascend.core.plugin import load_extensions as plugin_load
        first = load_extensions(); plugin_load(); plugin_load(); again = load_extensions()
        print(builtins.ORDER, first == again)
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "['fakea', 'fakeb'] True"


def test_sibling_whose_import_raises_is_skipped_and_core_keeps_working(fake_dists, good_source):
    fake_dists.add("vllm-ascend-fakegood", "fakegood", good_source("fakegood"))
    fake_dists.add(
        "vllm-ascend-fakeboom", "fakeboom", "raise RuntimeError('boom at import')\n", version="1.2.3"
    )
    records, stderr = fake_dists.load()
    assert records["fakeboom"]["status"] == "failed"
    assert records["fakeboom"]["reason"] == "import failed: RuntimeError: boom at import"
    assert (
        "Skipping vLLM Ascend extension 'fakeboom' (vllm-ascend-fakeboom 1.2.3): "
        "import failed: RuntimeError: boom at import"
    ) in stderr
    assert records["fakegood"]["status"] == "loaded"


def test_register_that_raises_is_rolled_back(fake_dists, good_source):
    source = good_source("fakehalf", policy="half").replace(
        'SPEC_DECODE_METHODS.register("half", "collections:OrderedDict")',
        'SPEC_DECODE_METHODS.register("half", "collections:OrderedDict")\n    raise ValueError("second step failed")',
    )
    fake_dists.add("vllm-ascend-fakehalf", "fakehalf", source)
    proc = fake_dists.run(
        """
        from vllm_ascend.core.extensions import load_extensions
        from vllm_ascend.core.registry import SPEC_DECODE_METHODS
        rec = load_extensions()["fakehalf"]
        print(rec.status.value, "|", rec.reason, "|", "half" in SPEC_DECODE_METHODS)
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "failed | register() failed: ValueError: second step failed | False"


def test_malformed_descriptor_object(fake_dists, good_source):
    fake_dists.add("vllm-ascend-fakedict", "fakedict", "EXTENSION = {'name': 'fakedict'}\n")
    records, stderr = fake_dists.load()
    expected = (
        "malformed descriptor: entry point 'fake_vllm_ascend_fakedict:EXTENSION' is a dict, "
        "expected vllm_ascend.core.extensions.ExtensionDescriptor"
    )
    assert records["fakedict"]["status"] == "failed"
    assert records["fakedict"]["reason"] == expected
    assert expected in stderr


def test_descriptor_with_invalid_field_fails_at_import(fake_dists, good_source):
    fake_dists.add("vllm-ascend-fakespec", "fakespec", good_source("fakespec", requires="0.1 or newer"))
    records, _ = fake_dists.load()
    assert records["fakespec"]["reason"] == (
        "import failed: DescriptorError: core_requires must be a version specifier such as "
        "'>=0.1,<0.2', got '0.1 or newer'"
    )


def test_descriptor_name_must_match_entry_point(fake_dists, good_source):
    fake_dists.add("vllm-ascend-fakename", "fakename", good_source("othername"))
    records, _ = fake_dists.load()
    assert records["fakename"]["reason"] == (
        "malformed descriptor: name 'othername' differs from its entry point name 'fakename'"
    )


def test_core_range_mismatch_is_skipped_with_clear_message(fake_dists, good_source):
    fake_dists.add(
        "vllm-ascend-fakeold", "fakeold", good_source("fakeold", policy="old", requires=">=0.2,<0.3")
    )
    records, stderr = fake_dists.load()
    reason = "needs vllm-ascend-core>=0.2,<0.3 but 0.1.0 is installed; install a matching vllm-ascend-fakeold"
    assert records["fakeold"]["status"] == "incompatible"
    assert records["fakeold"]["reason"] == reason
    assert f"Skipping vLLM Ascend extension 'fakeold' (vllm-ascend-fakeold 9.9.9): {reason}" in stderr


def test_disable_list_is_honoured_and_unknown_names_warned(fake_dists, good_source):
    fake_dists.add("vllm-ascend-fakea", "fakea", good_source("fakea", policy="pa"))
    fake_dists.add("vllm-ascend-fakeb", "fakeb", good_source("fakeb", policy="pb"))
    records, stderr = fake_dists.load(VLLM_ASCEND_DISABLED_EXTENSIONS="fakeb, nope,zzz")
    assert records["fakeb"]["status"] == "disabled"
    assert records["fakeb"]["reason"] == "listed in VLLM_ASCEND_DISABLED_EXTENSIONS"
    assert records["fakea"]["status"] == "loaded"
    assert "VLLM_ASCEND_DISABLED_EXTENSIONS names unknown extension(s): nope, zzz; installed: " in stderr


def test_duplicate_registry_name_across_siblings(fake_dists, good_source):
    fake_dists.add("vllm-ascend-fakea", "fakea", good_source("fakea", policy="shared"))
    fake_dists.add("vllm-ascend-fakeb", "fakeb", good_source("fakeb", policy="shared"))
    records, _ = fake_dists.load()
    assert records["fakea"]["status"] == "loaded"
    assert records["fakeb"]["reason"] == (
        "register() failed: RegistryError: duplicate speculative decoding method 'shared': already registered by "
        "vllm-ascend-fakea, cannot register it again for vllm-ascend-fakeb"
    )


def test_same_extension_name_from_two_dists(fake_dists, good_source):
    fake_dists.add("vllm-ascend-fakeone", "fakedup", good_source("fakedup", policy="p1"))
    fake_dists.add("vllm-ascend-faketwo", "fakedup", good_source("fakedup", policy="p2"))
    records, stderr = fake_dists.load()
    assert records["fakedup"]["status"] == "loaded"
    assert "extension name 'fakedup' is already provided by vllm-ascend-fake" in stderr


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("name", "Bad-Name", "name must match ^[a-z][a-z0-9_]*$, got 'Bad-Name'"),
        ("version", "not.a.version!", "version must be a PEP 440 version, got 'not.a.version!'"),
        ("provides", ("nonsense",), "provides names unknown registries ['nonsense']; allowed: cli_commands,"),
        ("provides", ["kernels"], "provides must be a tuple of registry names, got ['kernels']"),
        ("register", "not callable", "register must be callable, got 'not callable'"),
    ],
)
def test_descriptor_validation(field, value, message):
    fields = dict(name="x", version="1.0", core_requires=">=0.1", provides=(), register=noop_register)
    fields[field] = value
    with pytest.raises(DescriptorError) as err:
        ExtensionDescriptor(**fields)
    assert str(err.value).startswith(message)
