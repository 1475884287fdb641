"""Overrides of the kernels of vLLM's `vllm/v1/worker/gpu/spec_decode/acceptance_estimator.py`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

OVERRIDES: dict[str, Callable[..., Any]] = {}
