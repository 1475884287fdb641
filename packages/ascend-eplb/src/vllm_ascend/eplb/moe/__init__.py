"""Reference-device MoE layer: an Ascend ``MoERunner`` for vLLM 0.32 with EPLB expert maps.

Nothing here imports vLLM. :func:`register_moe_runner` (called from the eplb extension's
``register()``) acts only in a process where vLLM is loaded and our platform is active, and even then
defers the replacement until vLLM itself imports its ``MoERunner`` module, so processes that never
build a model (the API front end, the EPLB policy process) pay nothing.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import threading
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

#: The vLLM 0.32 pluggable layer this subpackage replaces, and the module defining it.
MOE_RUNNER_NAME = "MoERunner"
MOE_RUNNER_MODULE = "vllm.model_executor.layers.fused_moe.runner.moe_runner"

_lock = threading.Lock()


def register_moe_runner() -> bool:
    """Arrange for vLLM's ``MoERunner`` to be replaced by
    :class:`~vllm_ascend.eplb.moe.runner.AscendMoERunner` when vLLM is loaded and our platform is active:
    now if vLLM's module is already imported, else right after vLLM imports it. Idempotent; returns
    whether the replacement is (or will be) in place."""
    if "vllm" not in sys.modules:
        return False
    from vllm_ascend.core.device.detection import detect

    try:
        active = detect().active
    except ValueError:
        return False
    if not active:
        return False
    with _lock:
        if MOE_RUNNER_MODULE in sys.modules:
            _register_now()
        elif not any(isinstance(f, _RegisterAfterImport) for f in sys.meta_path):
            sys.meta_path.insert(0, _RegisterAfterImport())
    return True


def _register_now() -> None:
    from vllm.model_executor.custom_op import PluggableLayer, op_registry_oot

    from vllm_ascend.eplb.moe.runner import AscendMoERunner

    current = op_registry_oot.get(MOE_RUNNER_NAME)
    if current is AscendMoERunner:
        return
    if current is not None:
        raise RuntimeError(
            f"vLLM's {MOE_RUNNER_NAME} is already replaced by {current.__module__}.{current.__qualname__}; "
            "the Ascend EPLB MoE runner cannot also replace it"
        )
    PluggableLayer.register_oot(AscendMoERunner, name=MOE_RUNNER_NAME)


class _RegisterAfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself; when vLLM's ``MoERunner`` module is imported, registers ours right after it runs."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname != MOE_RUNNER_MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        run_module = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run_module(module)
            _register_now()

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec
