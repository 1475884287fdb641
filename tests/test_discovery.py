"""Discovery through vLLM's own plugin loader, each case in a fresh process (vLLM caches the platform)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
#: Leaves that ship an extension descriptor (``_extension.py``): the ones vLLM's loader must find.
SIBLING_EXTENSIONS = sorted(p.parent.name for p in ROOT.glob("packages/*/src/vllm_ascend/*/_extension.py"))


def run_py(code: str, device: str | None = None, **extra_env: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    env.update(extra_env)
    env.update(HF_HUB_OFFLINE="1", VLLM_ENABLE_V1_MULTIPROCESSING="0")
    if device is not None:
        env["VLLM_ASCEND_DEVICE"] = device
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()[-1]


def test_platform_plugin_group_contains_ascend():
    out = run_py(
        """
        import json
        from vllm.plugins import load_plugins_by_group
        plugins = load_plugins_by_group("vllm.platform_plugins")
        print(json.dumps({"names": sorted(plugins), "fn": plugins["ascend"].__module__ + "." + plugins["ascend"].__name__}))
        """
    )
    found = json.loads(out)
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
    out = run_py(
        """
        from vllm.platforms import current_platform
        cls = type(current_platform)
        print(f"{cls.__module__}.{cls.__qualname__} {current_platform.device_type}")
        """,
        device=device,
    )
    qualname, device_type = out.split()
    assert qualname == expected
    assert device_type == "cpu"


def test_general_plugins_load_every_extension_once():
    out = run_py(
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
        print(json.dumps({"calls": calls, "status": {k: r.status.value for k, r in records.items()}}))
        """,
        device="reference",
    )
    found = json.loads(out)
    assert found["calls"] == {name: 1 for name in SIBLING_EXTENSIONS}
    assert found["status"] == {name: "loaded" for name in SIBLING_EXTENSIONS}


@pytest.mark.parametrize(("device", "expected"), [("reference", "NetLoader"), ("off", None)])
def test_model_loaders_reach_vllm_only_when_the_platform_is_active(device, expected):
    out = run_py(
        """
        from vllm.plugins import load_general_plugins
        from vllm.model_executor import model_loader
        load_general_plugins()
        load_general_plugins()
        cls = model_loader._LOAD_FORMAT_TO_MODEL_LOADER.get("netloader")
        print(cls.__name__ if cls else None)
        """,
        device=device,
    )
    assert out == str(expected)


def test_disabled_extension_is_invisible_to_vllm():
    """``VLLM_ASCEND_DISABLED_EXTENSIONS=netloader`` reaches vLLM: the load format is never registered."""
    code = """
        from vllm.plugins import load_general_plugins
        from vllm.model_executor import model_loader
        from vllm_ascend.core.extensions import extension_records
        load_general_plugins()
        status = extension_records()["netloader"].status.value
        print(status, model_loader._LOAD_FORMAT_TO_MODEL_LOADER.get("netloader") is None)
        """
    out = run_py(code, device="reference", VLLM_ASCEND_DISABLED_EXTENSIONS="netloader")
    assert out == "disabled True"
