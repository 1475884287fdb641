"""Discovery and loading of sibling distributions through the ``vllm_ascend.extensions`` group.

Each sibling exposes one :class:`ExtensionDescriptor`. Loading is ordered (by extension name),
happens once per process, isolates failures (a sibling that fails, even with ``SystemExit``, is
logged and skipped with its registrations rolled back; core keeps working), checks every lazy path
a sibling registers, honours ``VLLM_ASCEND_DISABLED_EXTENSIONS`` and skips siblings built for
another core version. When two distributions declare one extension name, an official
``vllm-ascend-*`` distribution wins; the other is recorded as shadowed and never imported.
"""

from __future__ import annotations

import enum
import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from vllm_ascend.core._version import __version__ as CORE_VERSION
from vllm_ascend.core.logger import init_logger
from vllm_ascend.core.registry import ALL_REGISTRIES, Registry, check_object_path, registering_as

logger = init_logger(__name__)

ENTRY_POINT_GROUP = "vllm_ascend.extensions"
DISABLE_ENV = "VLLM_ASCEND_DISABLED_EXTENSIONS"
_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")
#: This project's distributions are named ``vllm-ascend-<leaf>`` and ship their code under ``vllm_ascend.``.
OFFICIAL_DIST_PREFIX = "vllm-ascend-"
OFFICIAL_MODULE_PREFIX = "vllm_ascend."


class DescriptorError(ValueError):
    """An extension descriptor with a missing or invalid field."""


@dataclass(frozen=True)
class ExtensionDescriptor:
    """What a sibling distribution tells core about itself.

    ``provides`` names the core registries the sibling fills (keys of
    :data:`vllm_ascend.core.registry.ALL_REGISTRIES`); ``register`` fills them and must be
    cheap: store ``"module:attr"`` paths rather than importing heavy modules.
    """

    name: str
    version: str
    core_requires: str
    provides: tuple[str, ...]
    register: Callable[[], None]
    description: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME_RE.match(self.name):
            raise DescriptorError(f"name must match {_NAME_RE.pattern}, got {self.name!r}")
        try:
            Version(self.version)
        except (InvalidVersion, TypeError):
            raise DescriptorError(f"version must be a PEP 440 version, got {self.version!r}") from None
        try:
            SpecifierSet(self.core_requires)
        except (InvalidSpecifier, TypeError):
            raise DescriptorError(
                f"core_requires must be a version specifier such as '>=0.1,<0.2', got {self.core_requires!r}"
            ) from None
        if not isinstance(self.provides, tuple) or not all(isinstance(p, str) for p in self.provides):
            raise DescriptorError(f"provides must be a tuple of registry names, got {self.provides!r}")
        unknown = sorted(set(self.provides) - set(ALL_REGISTRIES))
        if unknown:
            raise DescriptorError(
                f"provides names unknown registries {unknown}; allowed: {', '.join(sorted(ALL_REGISTRIES))}"
            )
        if not callable(self.register):
            raise DescriptorError(f"register must be callable, got {self.register!r}")

    def supports_core(self, core_version: str = CORE_VERSION) -> bool:
        return SpecifierSet(self.core_requires).contains(core_version, prereleases=True)


class ExtensionStatus(enum.StrEnum):
    LOADED = "loaded"
    DISABLED = "disabled"
    INCOMPATIBLE = "incompatible"
    FAILED = "failed"
    SHADOWED = "shadowed"


@dataclass(frozen=True)
class ExtensionRecord:
    """The outcome of loading one extension; what ``vllm-ascend doctor`` reports."""

    name: str
    dist: str
    version: str
    status: ExtensionStatus
    reason: str = ""
    provides: tuple[str, ...] = field(default_factory=tuple)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "dist": self.dist,
            "version": self.version,
            "status": self.status.value,
            "reason": self.reason,
            "provides": list(self.provides),
        }


_lock = threading.RLock()
_records: dict[str, ExtensionRecord] | None = None
_shadowed: list[ExtensionRecord] = []


def disabled_names(value: str | None = None) -> set[str]:
    import os

    raw = os.environ.get(DISABLE_ENV, "") if value is None else value
    return {part.strip() for part in raw.split(",") if part.strip()}


def _dist_name(ep: metadata.EntryPoint) -> str:
    return ep.dist.name if ep.dist is not None else "<unknown>"


def is_official(ep: metadata.EntryPoint) -> bool:
    """Whether the entry point comes from one of this project's distributions (name and module)."""
    dist = _dist_name(ep).lower().replace("_", "-")
    return dist.startswith(OFFICIAL_DIST_PREFIX) and ep.value.startswith(OFFICIAL_MODULE_PREFIX)


def _discover() -> list[metadata.EntryPoint]:
    """Entry points of the group, one per distribution (a dist seen twice on sys.path counts once)."""
    seen: set[tuple[str, str]] = set()
    found = []
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        key = (_dist_name(ep).lower().replace("_", "-"), ep.name)
        if key in seen:
            continue
        seen.add(key)
        found.append(ep)
    return found


def _describe(exc: BaseException) -> str:
    if isinstance(exc, SystemExit):
        return f"SystemExit({exc.code!r}): the extension called sys.exit()"
    return f"{type(exc).__name__}: {exc}"


class _UnresolvedPath(Exception):
    """A lazy path an extension registered does not resolve."""


def _check_registered(journal: list[tuple[Registry[Any], str]]) -> None:
    """Resolve every lazy path registered (import-free check where the registry's entries are heavy)."""
    for registry, name in journal:
        path = registry.entry(name).value
        if not isinstance(path, str):
            continue
        try:
            if registry.import_at_load:
                registry.get(name)
            else:
                check_object_path(path)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:
            raise _UnresolvedPath(f"{registry.kind} {name!r} -> {path!r}: {_describe(exc)}") from exc


def _load_one(ep: metadata.EntryPoint, disabled: set[str]) -> ExtensionRecord:
    dist = _dist_name(ep)
    dist_version = ep.dist.version if ep.dist is not None else "?"
    where = f"{dist} {dist_version}"
    if ep.name in disabled:
        return ExtensionRecord(
            ep.name, dist, dist_version, ExtensionStatus.DISABLED, f"listed in {DISABLE_ENV}"
        )
    try:
        descriptor = ep.load()
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        reason = f"import failed: {_describe(exc)}"
        logger.warning("Skipping vLLM Ascend extension %r (%s): %s", ep.name, where, reason)
        return ExtensionRecord(ep.name, dist, dist_version, ExtensionStatus.FAILED, reason)
    if not isinstance(descriptor, ExtensionDescriptor):
        reason = (
            f"malformed descriptor: entry point {ep.value!r} is a {type(descriptor).__name__}, "
            "expected vllm_ascend.core.extensions.ExtensionDescriptor"
        )
        logger.warning("Skipping vLLM Ascend extension %r (%s): %s", ep.name, where, reason)
        return ExtensionRecord(ep.name, dist, dist_version, ExtensionStatus.FAILED, reason)
    if descriptor.name != ep.name:
        reason = (
            f"malformed descriptor: name {descriptor.name!r} differs from its entry point name {ep.name!r}"
        )
        logger.warning("Skipping vLLM Ascend extension %r (%s): %s", ep.name, where, reason)
        return ExtensionRecord(ep.name, dist, dist_version, ExtensionStatus.FAILED, reason)
    if not descriptor.supports_core():
        reason = (
            f"needs vllm-ascend-core{descriptor.core_requires} but {CORE_VERSION} is installed; "
            f"install a matching {dist}"
        )
        logger.warning("Skipping vLLM Ascend extension %r (%s): %s", ep.name, where, reason)
        return ExtensionRecord(
            ep.name, dist, descriptor.version, ExtensionStatus.INCOMPATIBLE, reason, descriptor.provides
        )
    try:
        with registering_as(dist) as journal:
            descriptor.register()
            _check_registered(journal)
    except KeyboardInterrupt:
        raise
    except _UnresolvedPath as exc:
        reason = f"registered path does not resolve: {exc}"
    except BaseException as exc:
        reason = f"register() failed: {_describe(exc)}"
    else:
        return ExtensionRecord(
            ep.name, dist, descriptor.version, ExtensionStatus.LOADED, "", descriptor.provides
        )
    logger.warning("Skipping vLLM Ascend extension %r (%s): %s", ep.name, where, reason)
    return ExtensionRecord(
        ep.name, dist, descriptor.version, ExtensionStatus.FAILED, reason, descriptor.provides
    )


def _by_precedence(eps: Iterable[metadata.EntryPoint]) -> dict[str, list[metadata.EntryPoint]]:
    """Extension name -> its entry points, official distributions first, then in discovery order."""
    groups: dict[str, list[metadata.EntryPoint]] = {}
    for ep in eps:
        groups.setdefault(ep.name, []).append(ep)
    return {name: sorted(groups[name], key=lambda ep: not is_official(ep)) for name in sorted(groups)}


def load_extensions(entry_points: Iterable[metadata.EntryPoint] | None = None) -> dict[str, ExtensionRecord]:
    """Load every installed extension once per process and return what happened to each name.

    Each name is owned by one distribution (see :func:`_by_precedence`); the others are recorded
    as shadowed (:func:`all_extension_records`). Repeated calls return the first call's records
    without loading anything again.
    """
    global _records
    with _lock:
        if _records is not None:
            return dict(_records)
        groups = _by_precedence(_discover() if entry_points is None else entry_points)
        disabled = disabled_names()
        records: dict[str, ExtensionRecord] = {}
        shadowed: list[ExtensionRecord] = []
        for name, (owner, *others) in groups.items():
            records[name] = _load_one(owner, disabled)
            for ep in others:
                reason = f"extension name {name!r} is already provided by {_dist_name(owner)}"
                if is_official(owner) and not is_official(ep):
                    reason += " (official vllm-ascend distributions take precedence)"
                dist_version = ep.dist.version if ep.dist is not None else "?"
                logger.warning(
                    "Skipping vLLM Ascend extension %r (%s %s): %s",
                    name,
                    _dist_name(ep),
                    dist_version,
                    reason,
                )
                shadowed.append(
                    ExtensionRecord(name, _dist_name(ep), dist_version, ExtensionStatus.SHADOWED, reason)
                )
        unknown = sorted(disabled - set(groups))
        if unknown:
            logger.warning(
                "%s names unknown extension(s): %s; installed: %s",
                DISABLE_ENV,
                ", ".join(unknown),
                ", ".join(sorted(records)) or "none",
            )
        loaded = [name for name, rec in records.items() if rec.status is ExtensionStatus.LOADED]
        logger.debug("vLLM Ascend extensions loaded: %s", ", ".join(loaded) or "none")
        _records = records
        _shadowed[:] = shadowed
        return dict(records)


def all_extension_records() -> list[ExtensionRecord]:
    """Every distribution's record, shadowed ones included, by extension name (what doctor lists)."""
    records = load_extensions()
    return sorted(
        [*records.values(), *_shadowed], key=lambda rec: (rec.name, rec.status is ExtensionStatus.SHADOWED)
    )


def extension_records() -> dict[str, ExtensionRecord]:
    """Records of the loading done in this process (loading first if needed)."""
    return load_extensions()


def _reset_for_tests() -> None:
    global _records
    with _lock:
        _records = None
        _shadowed.clear()
