"""Parallel ahead-of-time compilation of the Triton specializations a warm-up needs.

A warm-up that launches every kernel variant compiles them one after the other in one process (212 s
for the sampling kernels on a 16-core H200 host). Here the warm-up first runs with Triton's
``jit_cache_hook`` answering "skip": every specialization it would compile is recorded (as Triton's
own serialized specialization data) and nothing is compiled or launched. The recorded
specializations not in Triton's on-disk cache yet are then compiled into it by worker processes
(compilation needs the target, not the device, so workers never touch it), and the real warm-up
that follows only loads. Where the Triton in use lacks the hook (triton-ascend 3.2), :func:`supported` is False and the
warm-up compiles serially as before.
"""

from __future__ import annotations

import importlib
import json
import multiprocessing
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from typing import Any

from vllm_ascend.core.sdk import init_logger

logger = init_logger(__name__)


def supported() -> bool:
    """Whether this Triton can record specializations without compiling them (``knobs.runtime.
    jit_cache_hook`` with serialized specialization data, Triton >= 3.4)."""
    try:
        import triton
    except ImportError:
        return False
    runtime = getattr(getattr(triton, "knobs", None), "runtime", None)
    return runtime is not None and hasattr(runtime, "jit_cache_hook")


def default_workers() -> int:
    """The CPUs this process may run on (a serving worker is bound to its own share)."""
    return max(1, len(os.sched_getaffinity(0)))


@contextmanager
def recording() -> Iterator[dict[str, None]]:
    """While active, Triton kernel calls compile and launch nothing; the (ordered, de-duplicated)
    serialized specializations they would have compiled collect in the yielded dict's keys."""
    import triton
    from triton.runtime.driver import driver

    specs: dict[str, None] = {}
    target: dict[str, Any] = {}

    def hook(*, compile: dict[str, Any], **_: Any) -> bool:
        data = json.loads(compile["specialization_data"])
        if "target" not in data:  # some Triton versions leave it out: the device's current one
            if not target:
                target.update(vars(driver.active.get_current_target()))
            data["target"] = target
        specs.setdefault(json.dumps(data))
        return True  # "already handled": Triton returns before compiling or launching

    runtime = triton.knobs.runtime
    previous = runtime.jit_cache_hook
    runtime.jit_cache_hook = hook
    try:
        yield specs
    finally:
        runtime.jit_cache_hook = previous


def _decode_constant(value: Any) -> Any:
    import triton.language as tl

    if isinstance(value, str) and tl.dtype.is_dtype(value):
        return tl.dtype(value)
    if isinstance(value, dict):
        if "constexpr" in value:
            return tl.constexpr(_tuples(value["constexpr"]))
        if "jit_function" in value:  # "module:qualname" of a JIT function passed as a constexpr
            module, _, qualname = value["jit_function"].partition(":")
            return getattr(importlib.import_module(module), qualname)
    return _tuples(value)


def _tuples(value: Any) -> Any:
    """JSON turned the tuples of a specialization into lists; Triton signatures never hold lists."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def _source(spec: str) -> tuple[str, Any, Any, Any]:
    """``(kernel name, ASTSource, target, options)`` of a serialized specialization: the source the
    launch would compile (its cache key is the launch's own). Imports the kernel's module."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend

    data = json.loads(spec)
    module_name, _, qualname = data["name"].rpartition(".")
    fn = getattr(importlib.import_module(module_name), qualname)
    target = GPUTarget(**data["target"])
    constexprs = {
        tuple(key): _decode_constant(value)
        for key, value in zip(data["constant_keys"], data["constant_vals"], strict=True)
    }
    attrs = {tuple(key): value for key, value in zip(data["attrs_keys"], data["attrs_vals"], strict=True)}
    signature = {key: _tuples(value) for key, value in data["signature"].items()}
    options = make_backend(target).parse_options(
        {key: tuple(value) if isinstance(value, list) else value for key, value in data["options"].items()}
    )
    return str(data["name"]), ASTSource(fn, signature, constexprs, attrs), target, options


def compile_spec(spec: str) -> str:
    """Compile one serialized specialization into Triton's on-disk cache for the target it names;
    returns the kernel's name. Runs in a worker process, which never touches the device."""
    import triton

    name, source, target, options = _source(spec)
    triton.compile(source, target=target, options=options.__dict__)
    return name


def is_cached(spec: str) -> bool:
    """Whether Triton's on-disk cache already holds this specialization (as ``triton.compile`` looks
    it up); False when that cannot be told, so that it is compiled."""
    try:
        import hashlib

        from triton.compiler import compiler as triton_compiler
        from triton.compiler import make_backend

        _, source, target, options = _source(spec)
        env = triton_compiler.get_cache_invalidating_env_vars()
        key = triton_compiler.get_cache_key(source, make_backend(target), options, env_vars=env)
        manager = triton_compiler.get_cache_manager(hashlib.sha256(key.encode("utf-8")).hexdigest())
        metadata = f"{source.name[:150]}.json"
        return bool((manager.get_group(metadata) or {}).get(metadata))
    except Exception as exc:
        logger.debug("cannot tell whether a specialization is cached (%s); compiling it", exc)
        return False


def compile_specs(specs: Sequence[str], workers: int) -> dict[str, int]:
    """Compile ``specs`` in ``workers`` fresh (spawned) processes; returns ``{kernel name: variants}``.
    A specialization that fails to compile is logged and left to the warm-up's own launch."""
    counts: dict[str, int] = {}
    if not specs:
        return counts
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(workers, len(specs)), mp_context=context) as pool:
        futures = [pool.submit(compile_spec, spec) for spec in specs]
        processes = dict(
            getattr(pool, "_processes", None) or {}
        )  # started by submit; kept for their exit codes
        lost: list[str] = []
        for spec, future in zip(specs, futures, strict=True):
            try:
                name = future.result()
            except BrokenProcessPool:
                lost.append(json.loads(spec)["name"])
                continue
            except Exception:
                name = json.loads(spec)["name"]
                logger.warning(
                    "ahead-of-time compile of %s failed; the warm-up compiles it", name, exc_info=True
                )
                continue
            counts[name] = counts.get(name, 0) + 1
        if lost:
            _report_dead_workers(processes, lost)
    return counts


def _report_dead_workers(processes: Mapping[int, BaseProcess], lost: list[str]) -> None:
    """One warning for a pool broken by a dead compile process, naming the signal that killed it."""
    from vllm_ascend.core.sdk import signal_death

    deaths = []
    for pid, process in processes.items():
        process.join(timeout=10)  # a broken pool's processes are being stopped; their exit codes follow
        if process.exitcode is not None and process.exitcode < 0:
            deaths.append(signal_death(f"ahead-of-time compile process {pid}", -process.exitcode))
    logger.warning(
        "%s; %d specializations (%s) were not compiled ahead of time: the warm-up compiles them",
        "\n".join(deaths) or "a compile process exited abruptly",
        len(lost),
        ", ".join(sorted(set(lost))),
    )


@dataclass
class PrecompileReport:
    """What :func:`precompile` did: variants compiled per kernel, variants found already cached,
    processes, and the seconds spent recording (running the warm-up without compiling, then looking
    each variant up in the cache) and compiling."""

    workers: int
    variants: dict[str, int] = field(default_factory=dict)
    cached: int = 0
    record_s: float = 0.0
    compile_s: float = 0.0

    def summary(self) -> dict[str, float | int]:
        return {
            "workers": self.workers,
            "kernels": len(self.variants),
            "variants": sum(self.variants.values()),
            "cached": self.cached,
            "record_s": round(self.record_s, 3),
            "compile_s": round(self.compile_s, 3),
        }


def precompile(run_items: Callable[[], object], workers: int) -> PrecompileReport:
    """Record the specializations ``run_items`` (the warm-up) would compile, then compile them in
    ``workers`` processes."""
    report = PrecompileReport(workers)
    start = time.perf_counter()
    with recording() as specs:
        run_items()
    missing = [spec for spec in specs if not is_cached(spec)]
    report.cached = len(specs) - len(missing)
    report.record_s = time.perf_counter() - start
    report.variants = compile_specs(missing, workers)
    report.compile_s = time.perf_counter() - start - report.record_s
    return report
