"""Every oracle test runs vLLM's kernels with upstream Triton's interpreter gaps worked around
(``_interpreter_fixes``: standard-library JIT functions made callable, int masks read as bool)."""

from __future__ import annotations

import pytest

from vllm_ascend.testing.v2_references import FORMS, use_reference_form

from ._interpreter_fixes import interpreter_fixes


@pytest.fixture(autouse=True)
def _triton_interpreter_fixes(monkeypatch: pytest.MonkeyPatch) -> None:
    interpreter_fixes(monkeypatch)


@pytest.fixture(params=FORMS)
def reference_form(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The V2 references with two forms run as ``"grid"`` (torch) and as ``"host"`` (numpy) (``use_reference_form``)."""
    use_reference_form(monkeypatch, request.param)
    return request.param
