"""The runner's Triton-kernel overrides, handed to vLLM's kernel dispatcher.

Two tables: the V1 runner's (slot mapping, the draft-model input builders: plain functions of the
launch arguments) and Model Runner V2's (``vllm_ascend.kernels.v2``: every kernel V2 launches, Ascend
Triton on NPUs, torch references on the reference device). Both go through
``vllm.triton_utils.dispatcher.register_kernels``, vLLM's own mechanism for platform kernels. V2's
kernels often read their request count from the launch grid, which the dispatcher's wrapper drops, so
the V2 wrappers are given :class:`GridLaunch`'s launch: the grid and the arguments bound by vLLM's
parameter names reach the override as ``override(grid, **arguments)``.

Registration rebinds every copy of a kernel held in ``sys.modules``. vLLM 0.32's scan reads ``vars()`` of
every module attribute and breaks on objects whose ``__dict__`` is not a mapping (llvmlite's lazily wrapped
library functions, present once numba is imported: V1's n-gram proposer imports it), so registration runs
the same rebinding through :func:`rebind_kernel_copies`, which skips such objects.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from vllm.triton_utils import dispatcher

#: Triton launch options vLLM passes beside a kernel's own arguments; they mean nothing to an override.
LAUNCH_OPTIONS = frozenset(
    {"num_warps", "num_stages", "num_ctas", "maxnreg", "enable_fp_fusion", "launch_pdl"}
)


class GridLaunch(dispatcher.KernelOverride):
    """A dispatcher override whose launches keep their grid: ``kernel[grid](*args, **kw)`` calls
    ``impl(grid, **arguments)``, positional arguments named by the kernel's parameters."""

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        return functools.partial(self._launch_with_grid, grid)

    def _launch_with_grid(self, grid: Any, *args: Any, **kwargs: Any) -> Any:
        if len(args) > len(self.arg_names):
            raise TypeError(
                f"{self.__name__}: {len(args)} launch arguments for {len(self.arg_names)} parameters"
            )
        arguments = dict(zip(self.arg_names, args, strict=False))
        for name, value in kwargs.items():
            if name in LAUNCH_OPTIONS:
                continue
            if name not in self.arg_names:
                raise TypeError(f"{self.__name__}: unexpected launch argument {name!r}")
            arguments[name] = value
        if callable(grid):
            grid = grid(arguments)
        grid = tuple(int(g) for g in (grid if isinstance(grid, tuple | list) else (grid,)))
        return self._impl(grid, **arguments)


def _next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def provide_host_helpers() -> None:
    """V2's launch sites size tiles with ``triton.next_power_of_2`` on the host; without Triton, vLLM's
    ``triton`` is a placeholder module lacking it, so the same function is given to the placeholder."""
    from vllm.triton_utils import triton as vllm_triton

    if not hasattr(vllm_triton, "next_power_of_2"):
        vllm_triton.next_power_of_2 = _next_power_of_2


def _instance_mapping(value: Any) -> Mapping[str, Any] | None:
    """``value``'s own attribute mapping, read without ``__getattr__`` hooks; None where it has none."""
    try:
        namespace = object.__getattribute__(value, "__dict__")
    except (AttributeError, TypeError):
        return None
    return namespace if isinstance(namespace, Mapping) else None


def rebind_kernel_copies(pairs: list[tuple[Any, Any]]) -> None:
    """Point every holder of an original kernel at its override: module attributes (``from m import k``
    copies) and the ``kernel`` attribute of JIT warmup owners (whose cached argument names are dropped)."""
    by_id = {id(original): (original, wrapper) for original, wrapper in pairs}

    def override_of(value: Any) -> Any:
        hit = by_id.get(id(value))
        return hit[1] if hit is not None and hit[0] is value else None

    for module in list(sys.modules.values()):
        namespace = _instance_mapping(module)
        if namespace is None:
            continue
        for attr, value in list(namespace.items()):
            wrapper = override_of(value)
            if wrapper is not None:
                setattr(module, attr, wrapper)
                continue
            owned = _instance_mapping(value)
            wrapper = override_of(owned.get("kernel")) if owned is not None else None
            if wrapper is None:
                continue
            value.kernel = wrapper
            if not isinstance(value, type):
                value.__dict__.pop("_kernel_arg_names", None)


@contextlib.contextmanager
def _safe_rebinding() -> Iterator[None]:
    vllms = dispatcher._rebind_kernels
    dispatcher._rebind_kernels = rebind_kernel_copies
    try:
        yield
    finally:
        dispatcher._rebind_kernels = vllms


def register_kernels(overrides: Mapping[str, Callable[..., Any]]) -> None:
    """vLLM's ``register_kernels``, rebinding kernel copies with :func:`rebind_kernel_copies`."""
    with _safe_rebinding():
        dispatcher.register_kernels(overrides)


def register_grid_kernels(overrides: Mapping[str, Callable[..., Any]]) -> None:
    """``register_kernels`` for overrides taking the launch grid first (see :class:`GridLaunch`). A module
    whose kernels are all served this way and that checks ``HAS_TRITON`` itself before launching them (V2's
    n-gram speculator) is told they can run."""
    provide_host_helpers()
    register_kernels(overrides)
    for name in overrides:
        host, attr = dispatcher._resolve_kernel(name)
        wrapper = getattr(host, attr)
        if not isinstance(wrapper, dispatcher.KernelOverride):
            raise RuntimeError(f"vLLM's dispatcher did not install an override for {name}")
        wrapper.__class__ = GridLaunch
        if getattr(host, "HAS_TRITON", True) is False:
            host.HAS_TRITON = True


def bind_sampling_functions() -> None:
    """Serve vLLM's ``apply_top_k_top_p`` with :func:`vllm_ascend.kernels.apply_top_k_top_p` (Triton threshold
    search on NPUs, the torch reference on the reference device).

    vLLM's samplers call it by module-level name: Model Runner V2's sampler and sampler states, the rejection
    samplers, V1's top-k/top-p sampler. It is a plain function, not a Triton kernel, so the dispatcher does
    not reach it: the source module's name is rebound (later ``from`` imports get ours) and so is every copy
    already imported. Same contract: ``k`` ``[B]`` (``k >= V`` skips the row), ``p`` ``[B]`` (``p >= 1``
    skips), the logits masked to ``-inf`` in place and returned."""
    from vllm.v1.sample.ops import topk_topp_sampler

    from vllm_ascend import kernels

    ours = kernels.apply_top_k_top_p
    original = topk_topp_sampler.apply_top_k_top_p
    if original is not ours:
        rebind_kernel_copies([(original, ours)])


@functools.cache
def v2_kernel_table() -> dict[str, Callable[..., Any]]:
    from vllm_ascend.kernels.v2 import v2_kernel_overrides

    return v2_kernel_overrides()
