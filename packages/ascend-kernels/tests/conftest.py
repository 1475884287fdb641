"""Kernel tests run the Triton kernels in Triton's CPU interpreter, against the torch references.

``TRITON_INTERPRET=1`` must be set before any ``@triton.jit`` decorator runs, so it is set here,
before the kernel modules are imported.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"

import types

import pytest
import torch

_TRITON_MODULES = (
    "temperature",
    "gumbel",
    "min_p",
    "top_k_top_p",
    "penalties",
    "bad_words",
    "logprobs",
    "kv_zero",
    "slot_mapping",
    "conv1d",
    "gdn_gating",
    "rejection",
    "rms_norm",
)


def poison_value(dtype: torch.dtype):
    """NaN for float outputs, a sentinel no kernel produces for integer outputs."""
    return float("nan") if dtype.is_floating_point else -(2**31) + 7


class _PoisonedTorch(types.ModuleType):
    """``torch`` with ``empty``/``empty_like`` returning poisoned memory (for output buffers)."""

    def __init__(self) -> None:
        super().__init__("torch")

    def __getattr__(self, name: str):
        return getattr(torch, name)

    @staticmethod
    def empty(*args, **kwargs):
        out = torch.empty(*args, **kwargs)
        return out.fill_(poison_value(out.dtype))

    @staticmethod
    def empty_like(*args, **kwargs):
        out = torch.empty_like(*args, **kwargs)
        return out.fill_(poison_value(out.dtype))


@pytest.fixture(autouse=True)
def _auto_backend(monkeypatch):
    monkeypatch.delenv("VLLM_ASCEND_KERNEL_BACKEND", raising=False)


@pytest.fixture(autouse=True)
def poisoned_outputs(monkeypatch):
    """Every output buffer the Triton wrappers allocate starts as NaN / sentinel, so an element a
    kernel forgets to write fails the comparison with the reference."""
    import importlib

    fake = _PoisonedTorch()
    for name in _TRITON_MODULES:
        monkeypatch.setattr(importlib.import_module(f"vllm_ascend.kernels._triton.{name}"), "torch", fake)


@pytest.fixture
def gen():
    """A fresh, randomly seeded generator per test (inputs differ on every run; the seed is printed)."""
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"torch seed {seed}")
    return torch.Generator().manual_seed(seed)


def assert_close_ulp(actual: torch.Tensor, expected: torch.Tensor, ulps: float | None = None) -> None:
    """Equal up to ``ulps`` units in the last place of the tensor's dtype (infinities must match).

    Default: 1 ulp for bf16/fp16 (the interpreter truncates the final cast), 4 ulps for float32
    (numpy's and torch's exp/log/sigmoid differ in the last bits)."""
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    if ulps is None:
        ulps = 4.0 if actual.dtype == torch.float32 else 1.0
    a, e = actual.double(), expected.double()
    assert not torch.isnan(a).any(), "output has NaN (unwritten element?)"
    same_inf = torch.isinf(a) & torch.isinf(e) & (torch.sign(a) == torch.sign(e))
    mant = {torch.float32: 23, torch.bfloat16: 7, torch.float16: 10}[actual.dtype]
    scale = torch.maximum(a.abs(), e.abs()).clamp_min(torch.finfo(actual.dtype).tiny)
    ulp = torch.exp2(torch.floor(torch.log2(scale)) - mant)
    bad = ~same_inf & ~((a - e).abs() <= ulps * ulp)
    assert not bad.any(), (
        f"{int(bad.sum())} elements off by more than {ulps} ulp, e.g. {a[bad][:4]} vs {e[bad][:4]}"
    )


@pytest.fixture
def close_ulp():
    return assert_close_ulp


def chi2_limit(dof: int, z: float = 3.719) -> float:
    """Chi-square quantile at p = 1e-4 (z: the normal quantile), Wilson-Hilferty approximation."""
    c = 2.0 / (9.0 * dof)
    return dof * (1.0 - c + z * c**0.5) ** 3


@pytest.fixture(name="chi2_limit")
def chi2_limit_fixture():
    return chi2_limit
