"""``launch_grid``: a kernel test run under both grids of :mod:`vllm_ascend.kernels._geometry`."""

from __future__ import annotations

import dataclasses

import pytest

from vllm_ascend.kernels import _geometry
from vllm_ascend.testing.v2_references import FORMS, use_reference_form


@pytest.fixture(params=_geometry.GRIDS)
def launch_grid(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):
    """The interpreter's geometry with grid ``"cores"`` (Ascend's: a few programs, each looping over its
    work items and splitting rows only when rows are fewer than cores) or ``"work"`` (CUDA's: a program
    per work item, every row cut into tiles)."""
    geometry = dataclasses.replace(_geometry.INTERPRETER, grid=request.param)
    monkeypatch.setattr(_geometry, "INTERPRETER", geometry)
    _geometry.geometry.cache_clear()
    yield request.param
    _geometry.geometry.cache_clear()


@pytest.fixture(params=FORMS)
def reference_form(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The V2 references with two forms run as ``"grid"`` (torch) and as ``"host"`` (numpy) (``use_reference_form``)."""
    use_reference_form(monkeypatch, request.param)
    return request.param
