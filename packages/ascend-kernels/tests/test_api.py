"""Public surface: lazy exports, backend choice and the no-Triton fallback."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import textwrap
import types

import pytest
import torch

import vllm_ascend.kernels as K
from vllm_ascend.kernels import _backend


def test_every_public_function_is_documented_and_resolves_lazily():
    for name in K._EXPORTS:
        value = getattr(K, name)
        assert name in K.__all__ and name in dir(K)
        assert value is getattr(importlib.import_module(K._EXPORTS[name]), name)
        if callable(value) and not isinstance(value, type):
            assert value.__doc__ and len(value.__doc__) > 80, f"{name} needs a documented signature"


def test_unknown_attribute_is_a_clear_error():
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        K.nope  # noqa: B018


def test_triton_is_chosen_on_cpu_under_the_interpreter():
    assert _backend.use_triton(torch.device("cpu"))
    impl = _backend.dispatch("temperature", "apply_temperature", lambda *a: None, torch.device("cpu"))
    assert impl.__module__ == "vllm_ascend.kernels._triton.temperature"


def test_torch_backend_forces_the_reference(monkeypatch):
    monkeypatch.setenv("VLLM_ASCEND_KERNEL_BACKEND", "torch")
    ref = object()
    assert _backend.dispatch("temperature", "apply_temperature", ref, torch.device("cpu")) is ref


def test_invalid_backend_value_names_the_variable(monkeypatch):
    monkeypatch.setenv("VLLM_ASCEND_KERNEL_BACKEND", "cuda")
    with pytest.raises(_backend.KernelBackendError, match="VLLM_ASCEND_KERNEL_BACKEND='cuda' is invalid"):
        K.apply_temperature(torch.zeros(1, 4), torch.ones(1))


def _device(kind: str):
    # torch.device("npu") needs torch_npu; the backend only reads ``.type``.
    return types.SimpleNamespace(type=kind)


@pytest.mark.parametrize("device", ["cuda", "npu", "meta"])
def test_other_devices_are_refused_under_the_interpreter(device):
    reason = _backend.triton_unusable_reason(_device(device))
    assert reason == f"TRITON_INTERPRET=1 runs kernels on the cpu only, not on {device}"


def test_device_rules_without_the_interpreter(monkeypatch):
    monkeypatch.setattr(_backend, "_interpreting", lambda: False)
    assert _backend.triton_unusable_reason(_device("cuda")) is None
    assert _backend.triton_unusable_reason(_device("meta")) == "no Triton backend for device type 'meta'"
    monkeypatch.setattr(_backend, "_has_ascend_backend", lambda triton: False)  # true in the Ascend lane
    assert "triton-ascend" in _backend.triton_unusable_reason(_device("npu"))
    monkeypatch.setattr(_backend, "_has_ascend_backend", lambda triton: True)
    assert _backend.triton_unusable_reason(_device("npu")) is None


def test_forced_triton_on_an_unusable_device_raises(monkeypatch):
    monkeypatch.setenv("VLLM_ASCEND_KERNEL_BACKEND", "triton")
    with pytest.raises(_backend.KernelBackendError, match="Triton cannot run here"):
        _backend.use_triton(torch.device("meta"))


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if k != "VLLM_ASCEND_KERNEL_BACKEND"}
    full_env.update(env)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=120,
    )


_BLOCK_TRITON = """
import sys
class _NoTriton:
    def find_spec(self, name, path=None, target=None):
        if name == "triton" or name.startswith("triton."):
            raise ImportError("triton is blocked for this test")
sys.meta_path.insert(0, _NoTriton())
"""


def test_without_triton_the_package_falls_back_and_logs_once():
    proc = _run(
        _BLOCK_TRITON
        + """
import torch
import vllm_ascend.kernels as K
from vllm_ascend.kernels import temperature
logits = torch.tensor([[2.0, -4.0, 1.0]])
K.apply_temperature(logits, torch.tensor([2.0]))
assert logits.tolist() == [[1.0, -2.0, 0.5]], logits
tokens = K.gumbel_sample(logits, torch.tensor([0.0]), torch.tensor([1]), torch.tensor([0]))
assert tokens.tolist() == [0]
assert "triton" not in sys.modules and not any(m == "vllm" or m.startswith("vllm.") for m in sys.modules)
print("OK")
""",
        TRITON_INTERPRET="1",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "OK"
    assert proc.stderr.count("using the torch reference kernels on cpu") == 1, proc.stderr
    assert "triton is not importable" in proc.stderr


def test_without_triton_forcing_triton_is_a_clear_error():
    proc = _run(
        _BLOCK_TRITON
        + """
import torch
import vllm_ascend.kernels as K
try:
    K.apply_min_p(torch.zeros(1, 3), torch.tensor([0.1]))
except K.KernelBackendError as exc:
    print(exc)
""",
        VLLM_ASCEND_KERNEL_BACKEND="triton",
    )
    assert proc.returncode == 0, proc.stderr
    assert (
        "VLLM_ASCEND_KERNEL_BACKEND=triton but Triton cannot run here: triton is not importable"
        in proc.stdout
    )


def test_cpu_without_interpreter_uses_the_reference():
    proc = _run(
        """
import torch
from vllm_ascend.kernels import _backend
print(_backend.triton_unusable_reason(torch.device("cpu")))
print(_backend.use_triton(torch.device("cpu")))
""",
        TRITON_INTERPRET="0",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:2] == ["device is cpu and TRITON_INTERPRET=1 is not set", "False"]
