"""Kernel tests run the Triton kernels in Triton's CPU interpreter, against the torch references.

``TRITON_INTERPRET=1`` must be set before any ``@triton.jit`` decorator runs, so it is set here,
before the kernel modules are imported.

Two lanes run them: upstream Triton (the workspace env) and triton-ascend (``scripts/kernels-ascend-lane``,
which sets ``ASCEND_KERNELS_LANE=triton-ascend``). In the triton-ascend lane, the cases of
:data:`ASCEND_LANE_SKIPS` are skipped and those of :data:`ASCEND_INTERPRETER_GAPS` are strict expected
failures: both still run on upstream Triton.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"

import types

import pytest
import torch

LANE_ENV = "ASCEND_KERNELS_LANE"
ASCEND_LANE = os.environ.get(LANE_ENV, "") == "triton-ascend"

_BF16_CONST = (
    "a bfloat16 constant (tl.full, a float met by a bf16 tensor): InterpreterBuilder has no get_bf16"
)
_SCALAR_MASK = "a scalar store ignores a false scalar mask (`if not mask` reads the tensor's value)"


# Gaps of triton-ascend 3.2.0's interpreter, not of the kernels (README: "Known gaps of the triton-ascend
# interpreter"; tests/test_lane.py reproduces each): ``<file>::<test id>`` -> the gap it hits.
ASCEND_INTERPRETER_GAPS: dict[str, str] = {
    **{f"test_penalties_bad_words.py::test_bad_words[{d}]": _SCALAR_MASK for d in ("dtype0", "dtype1")},
    "test_sampling.py::test_min_p[5-dtype1]": _BF16_CONST,
    "test_sampling.py::test_min_p[12-dtype1]": _BF16_CONST,
    **{
        f"test_sampling.py::test_top_k_top_p_matches_the_sort_reference[{m}-{f}-dtype1]": _BF16_CONST
        for m in ("k", "p", "kp")
        for f in ("False", "True")
    },
    **{f"test_sampling.py::test_top_k_top_p_edge_rows[{v}-dtype1]": _BF16_CONST for v in (7, 300, 1000)},
    "test_sampling.py::test_top_p_alone_splits_its_search_and_falls_back_when_the_bracket_overflows[dtype1]": (
        _BF16_CONST
    ),
    "test_warmup.py::test_kernel_warmup_runs_the_built_in_items": _BF16_CONST,
    "test_warmup.py::test_warmup_command_fills_the_cache_dir_it_names": _BF16_CONST,
}

# Whole test files that need what the triton-ascend lane does not install.
ASCEND_LANE_SKIPS: dict[str, str] = {
    "test_lowering.py": "needs upstream Triton's CUDA compiler front end (triton.backends.nvidia), "
    "which the triton-ascend lane does not install",
    "test_cache_keys.py": "shows the order dependence of upstream Triton 3.4-3.6 keys (callees' constexpr globals "
    "folded in), which triton-ascend 3.2's key formula does not have",
    "test_precompile.py": "compiles for an sm_90 target with upstream Triton's CUDA backend (triton.backends.nvidia), "
    "which the triton-ascend lane does not install; triton-ascend 3.2 also lacks the jit_cache_hook",
}


@pytest.fixture
def lane_tables():
    """``(ASCEND_INTERPRETER_GAPS, ASCEND_LANE_SKIPS)`` for the tests that check them."""
    return ASCEND_INTERPRETER_GAPS, ASCEND_LANE_SKIPS


def pytest_configure(config):
    """Refuse a triton-ascend lane that is not running triton-ascend (it would test upstream Triton)."""
    lane = os.environ.get(LANE_ENV, "")
    if lane not in ("", "triton-ascend"):
        raise pytest.UsageError(f"{LANE_ENV}={lane!r} is invalid; allowed: unset or 'triton-ascend'")
    if ASCEND_LANE and not _triton_is_ascend():
        raise pytest.UsageError(f"{LANE_ENV}=triton-ascend but the installed triton has no Ascend backend")


def _triton_is_ascend() -> bool:
    from vllm_ascend.kernels import _backend

    triton = _backend._triton_module()
    return not isinstance(triton, BaseException) and _backend._has_ascend_backend(triton)


def pytest_terminal_summary(terminalreporter):
    """Which Triton ran the kernels and whether the Triton path (not the torch reference) was taken
    (a summary line: the workspace's ``-q`` hides the session header)."""
    from vllm_ascend.kernels import _backend

    lane = "triton-ascend" if ASCEND_LANE else "upstream"
    triton = _backend._triton_module()
    if isinstance(triton, BaseException):
        terminalreporter.write_line(f"kernels lane: {lane}; triton: not importable")
        return
    reason = _backend.triton_unusable_reason(torch.device("cpu"))
    path = "Triton interpreter" if reason is None else f"torch reference ({reason})"
    backend = "Ascend backend" if _triton_is_ascend() else "no Ascend backend"
    terminalreporter.write_line(
        f"kernels lane: {lane}; triton {triton.__version__} ({backend}); cpu kernels: {path}"
    )


def pytest_collection_modifyitems(config, items):
    if not ASCEND_LANE:
        return
    for item in items:
        skip = ASCEND_LANE_SKIPS.get(item.path.name)
        if skip is not None:
            item.add_marker(pytest.mark.skip(reason=f"triton-ascend lane: {skip}"))
        gap = ASCEND_INTERPRETER_GAPS.get(f"{item.path.name}::{item.name}")
        if gap is not None:
            item.add_marker(
                pytest.mark.xfail(reason=f"triton-ascend lane, interpreter gap: {gap}", strict=True)
            )


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
    "gated_delta_rule",
    "state_copy",
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
