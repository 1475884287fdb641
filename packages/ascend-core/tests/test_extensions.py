"""Extension discovery and loading: order, once-only, failure isolation, disable list, skew guard,
official precedence on name clashes, lazy paths checked at load."""

import json
import os

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


@pytest.mark.parametrize(
    ("failure", "reason"),
    [
        ('raise ValueError("second step failed")', "register() failed: ValueError: second step failed"),
        (
            'import sys; sys.exit("bye")',
            "register() failed: SystemExit('bye'): the extension called sys.exit()",
        ),
    ],
)
def test_register_that_fails_is_contained_and_rolled_back(fake_dists, good_source, failure, reason):
    """An exception (SystemExit included) after a registration fails the extension and undoes it."""
    source = good_source("fakehalf", policy="half").replace(
        'SPEC_DECODE_METHODS.register("half", "collections:OrderedDict")',
        f'SPEC_DECODE_METHODS.register("half", "collections:OrderedDict")\n    {failure}',
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
    assert proc.stdout.strip() == f"failed | {reason} | False"


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


def _clash(fake_dists, good_source, third_party_first: bool):
    """An official dist and a third-party dist both declaring extension ``fakeq``, on two sys.path roots."""
    make = type(fake_dists)
    official, third = make(fake_dists.root / "official"), make(fake_dists.root / "third")
    for dists in (official, third):
        dists.root.mkdir()
    official.add(
        "vllm-ascend-fakeq",
        "fakeq",
        good_source("fakeq", policy="official_policy"),
        module="vllm_ascend.fakeq_ext",
    )
    third.add("thirdparty-quant", "fakeq", good_source("fakeq", policy="impostor_policy"))
    roots = [third.root, official.root] if third_party_first else [official.root, third.root]
    return official, os.pathsep.join([*map(str, roots), os.environ.get("PYTHONPATH", "")])


@pytest.mark.parametrize("third_party_first", [True, False])
def test_official_dist_wins_a_name_clash_whatever_the_sys_path_order(
    fake_dists, good_source, third_party_first
):
    official, pythonpath = _clash(fake_dists, good_source, third_party_first)
    proc = official.run(
        """
        import json, sys
        from vllm_ascend.core.extensions import all_extension_records, load_extensions
        from vllm_ascend.core.registry import SPEC_DECODE_METHODS
        print(json.dumps({
            "owner": load_extensions()["fakeq"].as_dict(),
            "all": [r.as_dict() for r in all_extension_records() if r.name == "fakeq"],
            "methods": [n for n in SPEC_DECODE_METHODS.names() if n.endswith("_policy")],
            "impostor_imported": "fake_thirdparty_quant" in sys.modules,
        }))
        """,
        PYTHONPATH=pythonpath,
    )
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (found["owner"]["dist"], found["owner"]["status"]) == ("vllm-ascend-fakeq", "loaded")
    assert found["methods"] == ["official_policy"]
    assert found["impostor_imported"] is False
    reason = (
        "extension name 'fakeq' is already provided by vllm-ascend-fakeq "
        "(official vllm-ascend distributions take precedence)"
    )
    assert [(r["dist"], r["status"], r["reason"]) for r in found["all"]] == [
        ("vllm-ascend-fakeq", "loaded", ""),
        ("thirdparty-quant", "shadowed", reason),
    ]
    assert f"Skipping vLLM Ascend extension 'fakeq' (thirdparty-quant 9.9.9): {reason}" in proc.stderr


def test_doctor_lists_the_official_owner_and_the_shadowed_dist(fake_dists, good_source):
    official, pythonpath = _clash(fake_dists, good_source, third_party_first=True)
    proc = official.run(
        """
        import json
        from vllm_ascend.core.doctor import collect, render
        report = collect()
        print(json.dumps({"rows": [e for e in report["extensions"] if e["name"] == "fakeq"], "table": render(report)}))
        """,
        PYTHONPATH=pythonpath,
        VLLM_ASCEND_DEVICE="off",
    )
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [(r["dist"], r["status"]) for r in found["rows"]] == [
        ("vllm-ascend-fakeq", "loaded"),
        ("thirdparty-quant", "shadowed"),
    ]
    shadow_line = next(line for line in found["table"].splitlines() if "thirdparty-quant" in line)
    assert shadow_line.split()[:4] == ["fakeq", "thirdparty-quant", "9.9.9", "shadowed"]
    assert "already provided by vllm-ascend-fakeq" in shadow_line


def test_name_prefix_alone_does_not_make_a_dist_official(fake_dists, good_source):
    """``vllm-ascend-*`` dists whose module is outside ``vllm_ascend.`` are third-party: discovery order decides."""
    fake_dists.add("vllm-ascend-fakeone", "fakedup", good_source("fakedup", policy="p1"))
    proc = fake_dists.run(
        """
        from importlib import metadata
        from vllm_ascend.core.extensions import is_official
        eps = metadata.entry_points(group="vllm_ascend.extensions")
        print(sorted((ep.name, is_official(ep)) for ep in eps if ep.name == "fakedup"))
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[('fakedup', False)]"


@pytest.mark.parametrize(
    ("source", "reason"),
    [
        ("import sys\nsys.exit(3)\n", "import failed: SystemExit(3): the extension called sys.exit()"),
        ("raise SystemExit\n", "import failed: SystemExit(None): the extension called sys.exit()"),
        ("raise GeneratorExit('odd')\n", "import failed: GeneratorExit: odd"),
    ],
)
def test_base_exceptions_at_import_are_contained(fake_dists, good_source, source, reason):
    fake_dists.add("vllm-ascend-fakegood", "fakegood", good_source("fakegood"))
    fake_dists.add("vllm-ascend-fakeexit", "fakeexit", source)
    records, stderr = fake_dists.load()
    assert (records["fakeexit"]["status"], records["fakeexit"]["reason"]) == ("failed", reason)
    assert f"Skipping vLLM Ascend extension 'fakeexit' (vllm-ascend-fakeexit 9.9.9): {reason}" in stderr
    assert records["fakegood"]["status"] == "loaded"


def test_keyboard_interrupt_is_not_contained(fake_dists):
    fake_dists.add("vllm-ascend-fakeint", "fakeint", "raise KeyboardInterrupt\n")
    proc = fake_dists.run(
        """
        from vllm_ascend.core.extensions import load_extensions
        load_extensions()
        print("survived")
        """
    )
    assert proc.returncode != 0
    assert "survived" not in proc.stdout
    assert "KeyboardInterrupt" in proc.stderr


BROKEN_PATHS = """
from vllm_ascend.core.extensions import ExtensionDescriptor
from vllm_ascend.core.registry import {registry}, SPEC_DECODE_METHODS

def register():
    SPEC_DECODE_METHODS.register("fine_first", "collections:OrderedDict")
    {registry}.register("{entry}", "{path}")

EXTENSION = ExtensionDescriptor(
    name="{name}", version="9.9.9", core_requires=">=0.1,<0.2", provides=(), register=register
)
"""


@pytest.mark.parametrize(
    ("registry", "entry", "path", "detail"),
    [
        (
            "SPEC_DECODE_METHODS",
            "typo",
            "collections:OrderedDcit",
            "AttributeError: module 'collections' has no top-level name 'OrderedDcit'",
        ),
        (
            "SPEC_DECODE_METHODS",
            "gone",
            "no_such_module_xyz:Thing",
            "ModuleNotFoundError: No module named 'no_such_module_xyz'",
        ),
        (
            "WORKERS",
            "fakeworker",
            "json:NoSuchWorker",
            "AttributeError: module 'json' has no top-level name 'NoSuchWorker'",
        ),
    ],
    ids=["attr", "module", "deferred-registry"],
)
def test_broken_lazy_path_fails_the_extension_and_rolls_back(fake_dists, registry, entry, path, detail):
    fake_dists.add(
        "vllm-ascend-fakelazy",
        "fakelazy",
        BROKEN_PATHS.format(name="fakelazy", registry=registry, entry=entry, path=path),
    )
    proc = fake_dists.run(
        f"""
        import json
        from vllm_ascend.core.extensions import load_extensions
        from vllm_ascend.core.registry import {registry}, SPEC_DECODE_METHODS
        rec = load_extensions()["fakelazy"]
        print(json.dumps([rec.status.value, rec.reason, "fine_first" in SPEC_DECODE_METHODS, "{entry}" in {registry}]))
        """
    )
    assert proc.returncode == 0, proc.stderr
    status, reason, kept_first, kept_broken = json.loads(proc.stdout.strip().splitlines()[-1])
    kind = "speculative decoding method" if registry == "SPEC_DECODE_METHODS" else "worker"
    assert status == "failed"
    assert reason.startswith(f"registered path does not resolve: {kind} '{entry}' -> '{path}': {detail}")
    assert (kept_first, kept_broken) == (False, False)


def test_a_deferred_path_of_the_wrong_type_fails_in_the_doctor(fake_dists):
    """Proposers are heavy (they subclass vLLM's): loading checks their paths statically; the doctor imports
    them and reports one that is not a class."""
    fake_dists.add(
        "vllm-ascend-fakenotclass",
        "fakenotclass",
        BROKEN_PATHS.format(
            name="fakenotclass",
            registry="SPEC_DECODE_METHODS",
            entry="notclass",
            path="collections:namedtuple",
        ),
    )
    proc = fake_dists.run(
        """
        import json
        from vllm_ascend.core.extensions import load_extensions
        from vllm_ascend.core.doctor import collect
        rec = load_extensions()["fakenotclass"]
        row = next(e for e in collect()["extensions"] if e["name"] == "fakenotclass")
        print(json.dumps([rec.status.value, row["status"], row["reason"]]))
        """,
        VLLM_ASCEND_DEVICE="off",
    )
    assert proc.returncode == 0, proc.stderr
    status, doctor_status, doctor_reason = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (status, doctor_status) == ("loaded", "failed")
    assert doctor_reason.startswith(
        "registered path does not resolve: speculative decoding method 'notclass' -> 'collections:namedtuple': "
        "RegistryError: speculative decoding method 'notclass': 'collections:namedtuple' resolved to <function namedtuple"
    )


def test_deferred_registry_paths_are_checked_without_importing(fake_dists):
    """WORKERS entries are heavy: loading checks them statically, doctor imports them and reports failures."""
    (fake_dists.root / "fake_heavy_worker.py").write_text(
        "import builtins\nbuiltins.HEAVY_IMPORTED = True\nraise ImportError('needs a missing wheel')\n"
        "class Worker:\n    pass\n"
    )
    fake_dists.add(
        "vllm-ascend-fakeheavy",
        "fakeheavy",
        BROKEN_PATHS.format(
            name="fakeheavy", registry="WORKERS", entry="heavy", path="fake_heavy_worker:Worker"
        ),
    )
    proc = fake_dists.run(
        """
        import builtins, json
        from vllm_ascend.core.extensions import load_extensions
        from vllm_ascend.core.doctor import collect
        rec = load_extensions()["fakeheavy"]
        at_load = [rec.status.value, getattr(builtins, "HEAVY_IMPORTED", False)]
        row = next(e for e in collect()["extensions"] if e["name"] == "fakeheavy")
        print(json.dumps([*at_load, row["status"], row["reason"]]))
        """,
        VLLM_ASCEND_DEVICE="off",
    )
    assert proc.returncode == 0, proc.stderr
    status, imported, doctor_status, doctor_reason = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (status, imported) == ("loaded", False)
    assert doctor_status == "failed"
    assert doctor_reason == (
        "registered path does not resolve: worker 'heavy' -> 'fake_heavy_worker:Worker': "
        "ImportError: needs a missing wheel"
    )
