"""Swap names inside vLLM modules for the duration of a call.

vLLM's GPU classes construct their collaborators by module-level name (``InputBatch(...)``,
``Sampler(...)``, ``MultiGroupBlockTable(...)``). Rebinding those names while the inherited
code runs makes it build ours instead, without copying vLLM's code.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from types import ModuleType
from typing import Any


@contextmanager
def replaced_names(module: ModuleType, replacements: Mapping[str, Any]) -> Iterator[None]:
    """Rebind ``module.<name>`` to the given objects, restoring the originals afterwards."""
    missing = [name for name in replacements if not hasattr(module, name)]
    if missing:
        raise AttributeError(
            f"{module.__name__} has no {', '.join(missing)}: this vLLM version is not supported by vllm-ascend-runner"
        )
    saved = {name: getattr(module, name) for name in replacements}
    try:
        for name, value in replacements.items():
            setattr(module, name, value)
        yield
    finally:
        for name, value in saved.items():
            setattr(module, name, value)
