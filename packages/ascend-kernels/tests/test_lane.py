"""The triton-ascend lane (``scripts/kernels-ascend-lane``) really runs the Triton kernels through
triton-ascend's interpreter, and each known gap of that interpreter (``conftest.ASCEND_INTERPRETER_GAPS``)
still reproduces in a minimal kernel: when triton-ascend fixes one, these tests and the strict expected
failures it caused fail, and the table must shrink."""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import os
from pathlib import Path

import pytest
import torch

import vllm_ascend.kernels as K
from vllm_ascend.kernels import _backend, temperature

HERE = Path(__file__).parent
lane_only = pytest.mark.skipif(
    os.environ.get("ASCEND_KERNELS_LANE") != "triton-ascend", reason="runs in the triton-ascend lane only"
)


def test_every_gap_and_skip_names_a_test_of_this_suite(lane_tables):
    gaps, skips = lane_tables
    defined = {
        (path.name, node.name)
        for path in HERE.glob("test_*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
    }
    for key, reason in gaps.items():
        file, test = key.split("::")
        assert (file, test.split("[")[0]) in defined, key
        assert reason
    assert all((HERE / name).is_file() for name in skips)


@lane_only
def test_the_lane_runs_triton_ascend_and_not_upstream_triton():
    import triton

    assert importlib.metadata.version("triton-ascend").startswith("3.2.")
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version("triton")  # upstream Triton must never share the venv
    assert triton.__version__.startswith("3.2.")
    assert _backend._has_ascend_backend(triton)
    assert _backend.triton_unusable_reason(torch.device("cpu")) is None


@lane_only
def test_public_kernels_take_the_triton_path_through_its_interpreter(monkeypatch):
    from triton.runtime import interpreter

    launches = []
    real_call = interpreter.GridExecutor.__call__

    def counting_call(self, *args, **kwargs):
        launches.append(self.fn.__name__)
        return real_call(self, *args, **kwargs)

    monkeypatch.setattr(interpreter.GridExecutor, "__call__", counting_call)
    logits = torch.randn(3, 40)
    t = torch.tensor([0.5, 0.0, 2.0])
    want = temperature.apply_temperature_torch(logits.clone(), t)
    assert torch.equal(K.apply_temperature(logits, t), want)
    assert launches == ["_temperature_kernel"]


@pytest.fixture
def kernel_file(tmp_path, monkeypatch):
    """Import a kernel module written to ``tmp_path`` (Triton reads a kernel's source from its file)."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def load(name: str, src: str):
        (tmp_path / f"{name}.py").write_text("import triton\nimport triton.language as tl\n\n\n" + src)
        return importlib.import_module(name)

    return load


@lane_only
def test_gap_invert_of_a_bool_tensor(kernel_file):
    from triton.runtime.errors import InterpreterError

    mod = kernel_file(
        "gap_invert",
        "@triton.jit\ndef k(x_ptr, o_ptr):\n"
        "    i = tl.arange(0, 4)\n"
        "    tl.store(o_ptr + i, (~(tl.load(x_ptr + i) > 0)).to(tl.int32))\n",
    )
    out = torch.zeros(4, dtype=torch.int32)
    with pytest.raises(InterpreterError, match="get_int1_ty"):
        mod.k[(1,)](torch.tensor([1.0, -1.0, 2.0, -2.0]), out)


@lane_only
def test_gap_bf16_constant(kernel_file):
    from triton.runtime.errors import InterpreterError

    mod = kernel_file(
        "gap_bf16",
        "@triton.jit\ndef k(x_ptr):\n"
        "    i = tl.arange(0, 4)\n"
        "    x = tl.load(x_ptr + i)\n"
        "    tl.store(x_ptr + i, tl.where(x < 0, float('-inf'), x))\n",
    )
    with pytest.raises(InterpreterError, match="get_bf16"):
        mod.k[(1,)](torch.tensor([1.0, -1.0, 2.0, -2.0], dtype=torch.bfloat16))


@lane_only
def test_gap_false_scalar_mask_on_a_scalar_store(kernel_file):
    mod = kernel_file(
        "gap_scalar_mask",
        "@triton.jit\ndef k(o_ptr, flag_ptr):\n    tl.store(o_ptr, 1.0, mask=tl.load(flag_ptr) == 0)\n",
    )
    out = torch.zeros(1)
    mod.k[(1,)](out, torch.tensor([3]))
    assert out.item() == 1.0  # the mask is false: upstream Triton leaves 0.0
