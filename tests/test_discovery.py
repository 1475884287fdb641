"""Discovery through vLLM's own plugin loader, each case in a fresh process (vLLM caches the platform)."""

from __future__ import annotations

import os
import pathlib
import textwrap
from typing import Any

import pytest

from vllm_ascend.testing.process import OUTPUT_TAIL_CHARS, run_vllm_script

ROOT = pathlib.Path(__file__).resolve().parents[1]
#: Leaves that ship an extension descriptor (``_extension.py``): the ones vLLM's loader must find.
SIBLING_EXTENSIONS = sorted(p.parent.name for p in ROOT.glob("packages/*/src/vllm_ascend/*/_extension.py"))


def run_py(code: str, device: str | None = None, **extra_env: str) -> Any:
    """Run ``code`` in a fresh interpreter with vLLM's plugin state untouched: the JSON it printed as ``RESULT``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    env.update(extra_env)
    env.update(HF_HUB_OFFLINE="1", VLLM_ENABLE_V1_MULTIPROCESSING="0")
    if device is not None:
        env["VLLM_ASCEND_DEVICE"] = device
    result, output = run_vllm_script(textwrap.dedent(code), env=env, timeout=300)
    assert result is not None, output[-OUTPUT_TAIL_CHARS:]
    return result


def test_platform_plugin_group_contains_ascend():
    found = run_py(
        """
        import json
        from vllm.plugins import load_plugins_by_group
        plugins = load_plugins_by_group("vllm.platform_plugins")
        fn = plugins["ascend"].__module__ + "." + plugins["ascend"].__name__
        print("RESULT " + json.dumps({"names": sorted(plugins), "fn": fn}))
        """
    )
    assert "ascend" in found["names"]
    assert found["fn"] == "vllm_ascend.core.plugin.register"


@pytest.mark.parametrize(
    ("device", "expected"),
    [
        (None, "vllm.platforms.cpu.CpuPlatform"),
        ("off", "vllm.platforms.cpu.CpuPlatform"),
        ("reference", "vllm_ascend.core.platform.ReferencePlatform"),
    ],
)
def test_current_platform(device, expected):
    qualname, device_type = run_py(
        """
        import json
        from vllm.platforms import current_platform
        cls = type(current_platform)
        print("RESULT " + json.dumps([f"{cls.__module__}.{cls.__qualname__}", current_platform.device_type]))
        """,
        device=device,
    )
    assert qualname == expected
    assert device_type == "cpu"


def test_general_plugins_load_every_extension_once():
    found = run_py(
        """
        import json
        from collections import Counter
        from vllm_ascend.core import extensions
        calls = Counter()
        original = extensions._load_one
        def counting(ep, *args):
            calls[ep.name] += 1
            return original(ep, *args)
        extensions._load_one = counting
        from vllm.plugins import load_general_plugins
        load_general_plugins()
        load_general_plugins()
        from vllm_ascend.core.plugin import load_extensions
        load_extensions()
        records = extensions.extension_records()
        print("RESULT " + json.dumps({"calls": calls, "status": {k: r.status.value for k, r in records.items()}}))
        """,
        device="reference",
    )
    assert found["calls"] == {name: 1 for name in SIBLING_EXTENSIONS}
    assert found["status"] == {name: "loaded" for name in SIBLING_EXTENSIONS}


@pytest.mark.parametrize(("device", "expected"), [("reference", "NetLoader"), ("off", None)])
def test_model_loaders_reach_vllm_only_when_the_platform_is_active(device, expected):
    found = run_py(
        """
        import json
        from vllm.plugins import load_general_plugins
        from vllm.model_executor import model_loader
        load_general_plugins()
        load_general_plugins()
        cls = model_loader._LOAD_FORMAT_TO_MODEL_LOADER.get("netloader")
        print("RESULT " + json.dumps({"loader": cls.__name__ if cls else None}))
        """,
        device=device,
    )
    assert found == {"loader": expected}


def test_disabled_extension_is_invisible_to_vllm():
    """``VLLM_ASCEND_DISABLED_EXTENSIONS=netloader`` reaches vLLM: the load format is never registered."""
    code = """
        import json
        from vllm.plugins import load_general_plugins
        from vllm.model_executor import model_loader
        from vllm_ascend.core.extensions import extension_records
        load_general_plugins()
        status = extension_records()["netloader"].status.value
        print("RESULT " + json.dumps([status, model_loader._LOAD_FORMAT_TO_MODEL_LOADER.get("netloader") is None]))
        """
    found = run_py(code, device="reference", VLLM_ASCEND_DISABLED_EXTENSIONS="netloader")
    assert found == ["disabled", True]
