"""Triton cache keys that do not depend on what the process compiled before.

A JIT function's cache key (part of every on-disk cache key of its kernels) folds in the
``tl.constexpr`` globals its callees read. Triton 3.6 merges a callee's globals into the caller
*before* computing the callee's key, so a callee whose key was not computed yet contributes none:
``_threshold_kernel``'s key then depends on whether another kernel sharing its helpers was compiled
first in the process (upstream computes the callee's key first since; 3.9 is order-free). Processes
with different histories (the warm-up's compile workers, a server after ``vllm-ascend warmup`` built
its cache) then look up different keys for the same variant and compile it again. :func:`settle`
recomputes the keys of a kernel and of everything it calls, callees first, which gives each function
the key upstream's fixed order gives, whatever ran before.
"""

from __future__ import annotations

import ast
import inspect
import threading
from collections.abc import Iterable
from types import ModuleType
from typing import Any

_lock = threading.Lock()
_settled: set[int] = set()


def _jit_callable() -> type | None:
    try:
        from triton.runtime.jit import JITCallable
    except ImportError:  # older Triton (triton-ascend 3.2): JITFunction is the only kind
        try:
            from triton.runtime.jit import JITFunction
        except ImportError:
            return None
        return JITFunction
    return JITCallable


def _resolve(node: ast.AST, scope: dict[str, Any]) -> Any:
    """The object a name or a ``module.attr`` chain in a kernel's body refers to (None otherwise)."""
    if isinstance(node, ast.Name):
        return scope.get(node.id)
    if isinstance(node, ast.Attribute):
        base = _resolve(node.value, scope)
        if isinstance(base, ModuleType):
            return getattr(base, node.attr, None)
    return None


def callees(fn: Any, kind: type) -> list[Any]:
    """The JIT functions ``fn``'s body refers to (through its globals, closure or module attributes),
    as Triton's dependency finder resolves them; a name a local variable hides may be included."""
    scope = {**fn.fn.__globals__, **inspect.getclosurevars(fn.fn).nonlocals}
    found: dict[int, Any] = {}
    for node in ast.walk(fn.parse()):
        value = _resolve(node, scope)
        if isinstance(value, kind) and value is not fn:
            found.setdefault(id(value), value)
    return list(found.values())


def settle(functions: Iterable[Any]) -> None:
    """Recompute the cache keys of ``functions`` (JIT functions; anything else is skipped) and of all
    they call, each after its callees'. Once per function per process."""
    kind = _jit_callable()
    if kind is None:
        return
    with _lock:
        order: list[Any] = []
        seen: set[int] = set()

        def visit(fn: Any) -> None:
            if id(fn) in seen or id(fn) in _settled:
                return
            seen.add(id(fn))
            for callee in callees(fn, kind):
                visit(callee)
            order.append(fn)

        for fn in functions:
            if isinstance(fn, kind):
                visit(fn)
        for fn in order:
            fn.hash = None  # Triton's memo of the key (the attribute ``cache_key`` fills)
        for fn in order:
            fn.cache_key  # noqa: B018  callees first: their globals are known when a caller merges them
            _settled.add(id(fn))


def settle_module(module: ModuleType) -> None:
    """:func:`settle` every JIT function defined in ``module``."""
    settle(
        v
        for v in vars(module).values()
        if getattr(getattr(v, "fn", None), "__module__", None) == module.__name__
    )
