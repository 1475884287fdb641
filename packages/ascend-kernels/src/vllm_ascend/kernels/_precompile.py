"""Parallel ahead-of-time compilation of the Triton variants a warm-up launches.

A warm-up that launches every kernel variant compiles them one after the other in one process (212 s
for the sampling kernels on a 16-core H200 host). Here the warm-up runs in passes under Triton's
``jit_cache_hook``, which Triton calls on every launch that misses its in-memory cache with that
launch's own specialization (the binder's signature, constants and attributes, and the options), before
compiling. The hook computes the launch's on-disk cache key as ``triton.compile`` does: a variant on
disk goes ahead (Triton loads and launches it); a missing one is neither compiled nor launched but
queued, and from then on the pass launches nothing (later kernels could read the skipped one's unset
output), it only queues what is missing. The queued variants are compiled into Triton's on-disk cache by
worker processes (:mod:`._job_pool`: compilation needs the target, not the device, so they never touch
it), each checking that the variant lands under the key the launch computed, with the launcher Triton
builds on a variant's first launch (a C extension per signature on Triton 3.6). Then the pass runs
again, until one skips nothing: that pass launched everything and only loaded. A variant that failed to
compile ahead is compiled by its launch; ``compiled_at_launch`` names every launch that compiled.
Both sides settle the kernels' cache keys first (:mod:`._cache_keys`: Triton 3.6's depend on what the
process compiled before, and each worker has its own history).
Where the Triton in use lacks the hook (triton-ascend 3.2), :func:`supported` is False and the warm-up
compiles serially as it launches.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, TypeVar

from vllm_ascend.core.sdk import init_logger
from vllm_ascend.kernels import _cache_keys, _job_pool

logger = init_logger(__name__)

T = TypeVar("T")

#: Passes that may queue variants; if the last of them still skipped a launch, one more pass compiles
#: whatever it meets as it launches (a chain of variants each reached only once the one before ran).
MAX_PASSES = 4
COMPILE_JOB = f"{__name__}:compile_job"


def supported() -> bool:
    """Whether this Triton can hold a launch back before compiling (``knobs.runtime.jit_cache_hook``
    with serialized specialization data, Triton >= 3.4)."""
    try:
        import triton
    except ImportError:
        return False
    runtime = getattr(getattr(triton, "knobs", None), "runtime", None)
    return runtime is not None and hasattr(runtime, "jit_cache_hook")


def default_workers() -> int:
    """The CPUs this process may run on (a serving worker is bound to its own share)."""
    return max(1, len(os.sched_getaffinity(0)))


def _tuples(value: Any) -> Any:
    """JSON turned the tuples of a specialization into lists; Triton signatures never hold lists."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def _plain(options: dict[str, Any]) -> dict[str, Any]:
    """Serialized launch options as ``triton.compile`` takes them (JSON made their tuples lists)."""
    return {key: tuple(value) if isinstance(value, list) else value for key, value in options.items()}


def cache_entry(source: Any, backend: Any, options: dict[str, Any]) -> tuple[str, bool]:
    """``(hash, on disk)`` of the variant ``triton.compile(source, target, options)`` makes, with
    ``backend`` the target's: its cache directory's name and whether Triton's on-disk cache holds it
    (``triton.compile``'s own key and lookup)."""
    from triton.compiler import compiler as triton_compiler

    parsed = backend.parse_options(dict(_plain(options), **source.parse_options()))
    env = triton_compiler.get_cache_invalidating_env_vars()
    key = triton_compiler.get_cache_key(source, backend, parsed, env_vars=env)
    digest = hashlib.sha256(key.encode("utf-8")).hexdigest()
    metadata = f"{source.name[:150]}.json"
    group = triton_compiler.get_cache_manager(digest).get_group(metadata) or {}
    return digest, group.get(metadata) is not None


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


def _source(spec: str) -> tuple[str, Any, Any, dict[str, Any]]:
    """``(kernel name, ASTSource, target, options)`` of a serialized specialization: the source its
    launch compiles. Imports the kernel's module."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    data = json.loads(spec)
    module_name, _, qualname = data["name"].rpartition(".")
    fn = getattr(importlib.import_module(module_name), qualname)
    _cache_keys.settle([fn])  # the key the launch computed (see _cache_keys)
    constexprs = {
        tuple(key): _decode_constant(value)
        for key, value in zip(data["constant_keys"], data["constant_vals"], strict=True)
    }
    attrs = {tuple(key): value for key, value in zip(data["attrs_keys"], data["attrs_vals"], strict=True)}
    signature = {key: _tuples(value) for key, value in data["signature"].items()}
    source = ASTSource(fn, signature, constexprs, attrs)
    return str(data["name"]), source, GPUTarget(**data["target"]), data["options"]


def _driver_class(target: Any) -> Any:
    """The driver of the Triton backend that compiles for ``target`` (backends are keyed by package
    name, ``nvidia``, not by target, ``cuda``)."""
    from triton.backends import backends

    (backend,) = [b for b in backends.values() if b.compiler.supports_target(target)]
    return backend.driver


_driver: Any = None


def _build_launcher(kernel: Any, target: Any) -> bool:
    """Build (into Triton's cache) the launcher the kernel's first launch would build; False where
    this Triton or machine cannot (the launch then builds it). The worker's driver is set active
    without asking the device whether it is there."""
    global _driver
    try:
        from triton.runtime.driver import driver

        if _driver is None:
            _driver = _driver_class(target)()
            driver.set_active(_driver)
        _driver.launcher_cls(kernel.src, kernel.metadata)
    except Exception as exc:
        logger.debug("launcher of %s not built ahead (%s)", kernel.name, exc)
        return False
    return True


class KeyMismatchError(RuntimeError):
    """A variant compiled ahead landed under another cache key than its launch computed."""


def compile_job(payload: dict[str, str]) -> dict[str, Any]:
    """Worker job: compile ``payload["spec"]`` into Triton's on-disk cache and build its launcher;
    ``payload["hash"]`` is the cache entry its launch looks up. Never touches the device."""
    import triton

    name, source, target, options = _source(payload["spec"])
    kernel = triton.compile(source, target=target, options=_plain(options))
    if kernel.hash != payload["hash"]:
        raise KeyMismatchError(
            f"{name}: rebuilt from its serialized specialization it is cached as {kernel.hash}, "
            f"its launch looks up {payload['hash']}"
        )
    return {"name": name, "launcher": _build_launcher(kernel, target)}


@dataclass
class Pass:
    """What one pass of the warm-up met: ``missing`` variants (serialized specialization -> the cache
    hash its launch looks up) it skipped, how many it ``loaded`` from disk, and the kernels it
    ``compiled`` as they launched (a cache miss inside ``triton.compile``)."""

    missing: dict[str, str] = field(default_factory=dict)
    loaded: int = 0
    compiled: list[str] = field(default_factory=list)


_current: ContextVar[Pass | None] = ContextVar("warmup_pass", default=None)


def skipped_launches() -> bool:
    """Whether the pass running now has skipped a launch: later calls may meet its unset outputs."""
    current = _current.get()
    return current is not None and bool(current.missing)


@contextmanager
def guarded(let_through: frozenset[str] = frozenset()) -> Iterator[Pass]:
    """One pass: launches whose variant is on disk (or in ``let_through``, compiled as they launch)
    go ahead until the first one that is missing; from there on nothing launches and the missing
    variants are collected in the yielded :class:`Pass`."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.driver import driver

    state = Pass()
    backends: dict[str, Any] = {}  # serialized target -> its compiler backend

    def hook(*, fn: Any, compile: dict[str, Any], **_: Any) -> bool:
        data = json.loads(compile["specialization_data"])
        if "target" not in data:  # Triton 3.6 leaves it out: the device's current one
            data["target"] = vars(driver.active.get_current_target())
        spec = json.dumps(data)
        if spec in let_through:
            return bool(state.missing)
        target = json.dumps(data["target"], sort_keys=True)
        if target not in backends:
            backends[target] = make_backend(GPUTarget(**data["target"]))
        _cache_keys.settle([fn.jit_function])  # the same key in the compile workers (see _cache_keys)
        source = ASTSource(fn.jit_function, compile["signature"], compile["constants"], compile["configs"][0])
        digest, on_disk = cache_entry(source, backends[target], data["options"])
        if not on_disk:
            state.missing.setdefault(spec, digest)
            return True  # handled: Triton returns before compiling or launching
        if state.missing:
            return True  # on disk, but its inputs may be unset outputs of a skipped launch
        state.loaded += 1
        return False

    runtime = triton.knobs.runtime
    previous = runtime.jit_cache_hook
    runtime.jit_cache_hook = hook
    token = _current.set(state)
    try:
        with listening(state.compiled):
            yield state
    finally:
        _current.reset(token)
        runtime.jit_cache_hook = previous


@contextmanager
def listening(compiled: list[str]) -> Iterator[None]:
    """While active, the name of every kernel ``triton.compile`` compiles (rather than loads) is
    appended to ``compiled``."""
    import triton

    def listener(*, src: Any, cache_hit: bool, **_: Any) -> None:
        if not cache_hit:
            compiled.append(getattr(src, "name", str(src)))

    compilation = triton.knobs.compilation
    previous = compilation.listener
    compilation.listener = listener
    try:
        yield
    finally:
        compilation.listener = previous


def compile_specs(missing: dict[str, str], workers: int) -> tuple[dict[str, int], int, set[str]]:
    """Compile ``missing`` (spec -> the hash its launch looks up) in ``workers`` processes; returns
    ``({kernel name: variants compiled}, launchers built, specs that failed)``. A failure is logged
    (one line each; the traceback at debug level) and left to the launch to compile."""
    specs = list(missing)
    outcomes = _job_pool.run_jobs(COMPILE_JOB, [{"spec": s, "hash": missing[s]} for s in specs], workers)
    counts: dict[str, int] = {}
    launchers = 0
    failed: set[str] = set()
    lost: list[tuple[str, _job_pool.Outcome]] = []
    for spec, outcome in zip(specs, outcomes, strict=True):
        name = json.loads(spec)["name"]
        if outcome.ok:
            counts[name] = counts.get(name, 0) + 1
            launchers += bool(outcome.value["launcher"])
            continue
        failed.add(spec)
        if outcome.lost:
            lost.append((name, outcome))
        else:
            logger.warning(
                "ahead-of-time compile of %s failed (%s); its launch compiles it", name, outcome.error
            )
            logger.debug("%s", outcome.detail)
    if lost:
        _report_dead_workers(lost)
    return counts, launchers, failed


def _report_dead_workers(lost: Sequence[tuple[str, _job_pool.Outcome]]) -> None:
    """One warning for the variants (kernel name, outcome) lost with compile processes that died,
    naming the signals that killed them; what the processes wrote to stderr at debug level."""
    from vllm_ascend.core.sdk import signal_death

    codes = sorted({outcome.exit for _, outcome in lost if outcome.exit is not None})
    deaths = [
        signal_death("an ahead-of-time compile process", -code)
        if code < 0
        else f"an ahead-of-time compile process exited with status {code}"
        for code in codes
    ]
    logger.warning(
        "%s; %d variants (%s) were not compiled ahead of time: their launches compile them",
        "\n".join(deaths) or "an ahead-of-time compile process exited abruptly",
        len(lost),
        ", ".join(sorted({name for name, _ in lost})),
    )
    for detail in sorted({outcome.detail for _, outcome in lost if outcome.detail}):
        logger.debug("a dead compile process's stderr:\n%s", detail)


@dataclass
class PrecompileReport:
    """What :func:`run_passes` did: variants compiled ahead per kernel, launchers built with them,
    variants found on disk by the first pass (``cached``), variants that failed to compile ahead,
    kernels compiled as they launched, passes run, and seconds spent in passes that skipped launches
    (``record_s``), compiling (``compile_s``) and in the final pass (``launch_s``)."""

    workers: int
    variants: dict[str, int] = field(default_factory=dict)
    launchers: int = 0
    cached: int = 0
    failed: int = 0
    compiled_at_launch: list[str] = field(default_factory=list)
    passes: int = 0
    record_s: float = 0.0
    compile_s: float = 0.0
    launch_s: float = 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "workers": self.workers,
            "passes": self.passes,
            "kernels": len(self.variants),
            "variants": sum(self.variants.values()),
            "launchers": self.launchers,
            "cached": self.cached,
            "failed": self.failed,
            "compiled_at_launch": list(self.compiled_at_launch),
            "record_s": round(self.record_s, 3),
            "compile_s": round(self.compile_s, 3),
            "launch_s": round(self.launch_s, 3),
        }


def run_passes(run_pass: Callable[[], T], workers: int) -> tuple[T, PrecompileReport]:
    """Run ``run_pass`` (the warm-up's items) in guarded passes, compiling what each skipped in
    ``workers`` processes, until a pass skips nothing; returns that pass's result."""
    report = PrecompileReport(workers)
    failed: set[str] = set()
    for _ in range(MAX_PASSES):
        start = time.perf_counter()
        with guarded(frozenset(failed)) as state:
            result = run_pass()
        elapsed = time.perf_counter() - start
        if not report.passes:
            report.cached = state.loaded
        report.passes += 1
        report.compiled_at_launch += state.compiled
        if not state.missing:
            report.launch_s = elapsed
            return result, report
        report.record_s += elapsed
        start = time.perf_counter()
        counts, launchers, newly_failed = compile_specs(state.missing, workers)
        report.compile_s += time.perf_counter() - start
        for name, count in counts.items():
            report.variants[name] = report.variants.get(name, 0) + count
        report.launchers += launchers
        report.failed += len(newly_failed)
        failed |= newly_failed
    start = time.perf_counter()
    with listening(report.compiled_at_launch):
        result = run_pass()
    report.passes += 1
    report.launch_s = time.perf_counter() - start
    return result, report
