"""The vLLM entry points: activation rules of ``register()`` and its import cost."""

import os
import subprocess
import sys

import pytest

from vllm_ascend.core import plugin
from vllm_ascend.core.envs import EnvError


def test_inactive_without_npu_or_variable(monkeypatch):
    monkeypatch.delenv("VLLM_ASCEND_DEVICE", raising=False)
    assert plugin.register() is None


@pytest.mark.parametrize("value", ["reference", "REFERENCE", " reference "])
def test_reference_device_activates_platform(monkeypatch, value):
    monkeypatch.setenv("VLLM_ASCEND_DEVICE", value)
    assert plugin.register() == "vllm_ascend.core.platform.ReferencePlatform"
    assert plugin.PLATFORM_QUALNAMES["reference"] == plugin.register()
    assert not hasattr(plugin, "PLATFORM_QUALNAME")


def test_platform_qualnames_name_the_platform_classes():
    import importlib

    from vllm_ascend.core.device.detection import DeviceMode
    from vllm_ascend.core.platform import AscendPlatform

    assert set(plugin.PLATFORM_QUALNAMES) == {DeviceMode.NPU.value, DeviceMode.REFERENCE.value}
    for mode, qualname in plugin.PLATFORM_QUALNAMES.items():
        module, _, name = qualname.rpartition(".")
        cls = getattr(importlib.import_module(module), name)
        assert issubclass(cls, AscendPlatform) and cls is not AscendPlatform, mode


def test_off_never_activates(monkeypatch):
    monkeypatch.setenv("VLLM_ASCEND_DEVICE", "off")
    assert plugin.register() is None


def test_invalid_value_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("VLLM_ASCEND_DEVICE", "gpu")
    with pytest.raises(EnvError) as err:
        plugin.register()
    message = "VLLM_ASCEND_DEVICE='gpu' is invalid; allowed values: auto, npu, reference, off"
    assert str(err.value) == message
    # vLLM swallows exceptions from platform plugins, so the error must also reach the log.
    code = "from vllm_ascend.core.plugin import register\ntry:\n    register()\nexcept ValueError:\n    pass"
    env = {**os.environ, "VLLM_ASCEND_DEVICE": "gpu"}
    stderr = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env).stderr
    assert f"vLLM Ascend platform not activated: {message}" in stderr


def test_npu_requested_but_absent(monkeypatch):
    monkeypatch.setenv("VLLM_ASCEND_DEVICE", "npu")
    with pytest.raises(RuntimeError, match=r"^VLLM_ASCEND_DEVICE=npu but torch_npu is not installed$"):
        plugin.register()


def test_register_imports_nothing_heavy():
    code = (
        "import sys, os; os.environ['VLLM_ASCEND_DEVICE']='reference';"
        "from vllm_ascend.core.plugin import register; assert register();"
        "print(sorted(m for m in ('torch', 'vllm', 'numpy', 'torch_npu') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
