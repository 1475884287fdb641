"""Registration resolves, and importing the package pulls in neither vLLM nor the web stack."""

from __future__ import annotations

import subprocess
import sys

import pytest

import vllm_ascend.netloader as netloader
from vllm_ascend.core.registry import MODEL_LOADERS
from vllm_ascend.netloader._extension import EXTENSION


def test_registered_and_resolves_with_vllm():
    EXTENSION.register()
    EXTENSION.register()  # idempotent
    assert MODEL_LOADERS.entry("netloader").value == "vllm_ascend.netloader.loader:NetLoader"
    pytest.importorskip("vllm")
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader

    loader = MODEL_LOADERS.get("netloader")
    assert loader.__name__ == "NetLoader" and issubclass(loader, BaseModelLoader)


def test_lazy_exports():
    from vllm_ascend.netloader.client import SeedClient

    assert netloader.SeedClient is SeedClient
    assert "SeedServer" in dir(netloader)


def test_import_is_light():
    code = (
        "import sys, vllm_ascend.netloader; "
        "print(*[m in sys.modules for m in ('vllm', 'fastapi', 'httpx', 'torch')])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False", "False", "False"]
