"""Every oracle test runs vLLM's kernels with upstream Triton's interpreter gaps worked around
(``_interpreter_fixes``: standard-library JIT functions made callable, int masks read as bool)."""

from __future__ import annotations

import pytest

from ._interpreter_fixes import interpreter_fixes


@pytest.fixture(autouse=True)
def _triton_interpreter_fixes(monkeypatch: pytest.MonkeyPatch) -> None:
    interpreter_fixes(monkeypatch)
