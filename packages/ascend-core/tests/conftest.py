"""Shared fixtures: throw-away distributions with entry points (extension-loading tests) and the reference
adaptor with the device ops registered (device-op tests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest


class FakeDists:
    """Writes ``<dist>.dist-info`` folders and modules under one directory put on PYTHONPATH."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def add(
        self,
        dist: str,
        ext_name: str,
        module_source: str,
        version: str = "9.9.9",
        attr: str = "EXTENSION",
        module: str | None = None,
    ):
        """Write the dist; ``module`` (dotted, e.g. under the ``vllm_ascend`` namespace) defaults to
        ``fake_<dist>``."""
        module = module or f"fake_{dist.replace('-', '_')}"
        path = self.root.joinpath(*module.split(".")).with_suffix(".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(module_source))
        info = self.root / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        (info / "entry_points.txt").write_text(f"[vllm_ascend.extensions]\n{ext_name} = {module}:{attr}\n")
        return module

    def run(self, code: str, **env: str) -> subprocess.CompletedProcess:
        full_env = {k: v for k, v in os.environ.items() if k != "VLLM_ASCEND_DISABLED_EXTENSIONS"}
        full_env["PYTHONPATH"] = os.pathsep.join([str(self.root), full_env.get("PYTHONPATH", "")])
        full_env.update(env)
        return subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code)],
            capture_output=True,
            text=True,
            env=full_env,
            timeout=120,
        )

    def load(self, **env: str) -> tuple[dict, str]:
        """Run ``load_extensions()`` in a fresh process; return (records of fake dists, stderr)."""
        proc = self.run(
            """
            import json
            from vllm_ascend.core.extensions import load_extensions
            print(json.dumps({k: v.as_dict() for k, v in load_extensions().items()}))
            """,
            **env,
        )
        assert proc.returncode == 0, proc.stderr
        records = json.loads(proc.stdout.strip().splitlines()[-1])
        return records, proc.stderr


@pytest.fixture
def fake_dists(tmp_path: Path) -> FakeDists:
    return FakeDists(tmp_path)


GOOD = """
from vllm_ascend.core.extensions import ExtensionDescriptor
from vllm_ascend.core.registry import SPEC_DECODE_METHODS

CALLS = []

def register():
    SPEC_DECODE_METHODS.register("{policy}", "collections:OrderedDict")

EXTENSION = ExtensionDescriptor(
    name="{name}", version="9.9.9", core_requires="{requires}", provides=("spec_decode_methods",), register=register
)
"""


@pytest.fixture
def good_source():
    """Source of a well-formed extension module registering one speculative decoding method path."""

    def make(name: str, policy: str = "fake", requires: str = ">=0.1,<0.2") -> str:
        return GOOD.format(name=name, policy=policy, requires=requires)

    return make


@pytest.fixture
def core_only(monkeypatch):
    """``core_only(registry)``: the registry as in a core-only install (siblings loaded, entries hidden)."""
    from vllm_ascend.core.extensions import load_extensions

    def hide(registry):
        load_extensions()
        monkeypatch.setattr(registry, "_entries", {})
        monkeypatch.setattr(registry, "_loaded", {})
        return registry

    return hide


@pytest.fixture
def no_sibling_sections(core_only):
    """CONFIG_SECTIONS with no sibling validator registered."""
    from vllm_ascend.core.registry import CONFIG_SECTIONS

    return core_only(CONFIG_SECTIONS)


@pytest.fixture
def adaptor(monkeypatch):
    """The current (reference) adaptor with zeroed counts, the torch ops registered; device caches reset around
    the test."""
    from vllm_ascend.core.device.config import clear_device_caches, get_device_adaptor
    from vllm_ascend.kernels.device.graph_ops import register_device_ops

    monkeypatch.setenv("VLLM_ASCEND_DEVICE", "reference")
    clear_device_caches()
    register_device_ops()
    ad = get_device_adaptor()
    ad.reset_counts()
    yield ad
    clear_device_caches()
