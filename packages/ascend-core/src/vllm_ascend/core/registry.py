"""Typed, name-keyed registries that sibling distributions fill.

Core never imports a sibling: siblings put what they provide (quantization methods, EPLB
policies, workers, ...) into these registries from their extension's ``register()``.
A value is either the object itself or a lazy ``"module:attribute"`` path that is imported
on first :meth:`Registry.load`, so registering stays import-free.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class RegistryError(LookupError):
    """Unknown or duplicate name in a registry, or a value of the wrong type."""

    def __str__(self) -> str:  # LookupError would quote the message like a key
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class Entry:
    name: str
    value: Any
    owner: str


_state = threading.local()


def _current_owner() -> str:
    return getattr(_state, "owner", None) or "vllm-ascend-core"


@contextmanager
def registering_as(owner: str) -> Iterator[list[tuple[Registry[Any], str]]]:
    """Attribute registrations to ``owner``; on error, undo every registration made inside."""
    journal: list[tuple[Registry[Any], str]] = []
    previous = (getattr(_state, "owner", None), getattr(_state, "journal", None))
    _state.owner, _state.journal = owner, journal
    try:
        yield journal
    except BaseException:
        for registry, name in reversed(journal):
            registry.unregister(name)
        raise
    finally:
        _state.owner, _state.journal = previous


def load_object(path: str) -> Any:
    """Import ``"package.module:attr.sub"`` (or ``"package.module.attr"``)."""
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ValueError(f"invalid object path {path!r}: expected 'module:attribute'")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _top_level_names(body: list[ast.stmt]) -> set[str]:
    """Names a module binds at its top level (also inside top-level ``if``/``try`` blocks)."""
    names: set[str] = set()
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).partition(".")[0] for a in node.names)
        elif isinstance(node, ast.If | ast.Try):
            blocks = [node.body, node.orelse]
            if isinstance(node, ast.Try):
                blocks += [node.finalbody, *(h.body for h in node.handlers)]
            for block in blocks:
                names |= _top_level_names(block)
    return names


def check_object_path(path: str) -> None:
    """Check ``"module:attr"`` without importing the module: it is found and binds ``attr`` at top level.

    Raises ``ImportError``/``AttributeError`` like :func:`load_object` would. A module without Python
    source, or with a module-level ``__getattr__``, is imported instead (it cannot be read statically).
    """
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ValueError(f"invalid object path {path!r}: expected 'module:attribute'")
    spec = importlib.util.find_spec(module_name)
    if spec is None:
        raise ModuleNotFoundError(f"No module named {module_name!r}", name=module_name)
    origin = spec.origin or ""
    if not origin.endswith(".py"):
        load_object(path)
        return
    names = _top_level_names(ast.parse(Path(origin).read_bytes(), origin).body)
    if "__getattr__" in names:
        load_object(path)
        return
    head = attr.partition(".")[0]
    if head not in names:
        raise AttributeError(f"module {module_name!r} has no top-level name {head!r} ({origin})")


class Registry(Generic[T]):
    """Name → object (or lazy ``"module:attr"`` path) with clear errors on unknown or duplicate names."""

    def __init__(
        self,
        kind: str,
        check: Callable[[Any], bool] | None = None,
        expected: str = "",
        *,
        import_at_load: bool = True,
    ) -> None:
        self.kind = kind
        #: Whether extension loading imports this registry's lazy paths (else: checked without importing;
        #: for registries whose entries are heavy and imported by vLLM's serving path anyway).
        self.import_at_load = import_at_load
        self._check = check
        self._expected = expected
        self._entries: dict[str, Entry] = {}
        self._loaded: dict[str, T] = {}
        self._lock = threading.RLock()

    def register(self, name: str, value: T | str) -> T | str:
        """Add ``value`` under ``name``. The same owner re-registering the same value is a no-op."""
        if not isinstance(name, str) or not name:
            raise RegistryError(f"{self.kind} name must be a non-empty string, got {name!r}")
        if not isinstance(value, str) and self._check is not None and not self._check(value):
            raise RegistryError(
                f"{self.kind} {name!r}: expected {self._expected or 'a valid value'}, got {value!r}"
            )
        owner = _current_owner()
        with self._lock:
            existing = self._entries.get(name)
            if existing is not None:
                if existing.owner == owner and (existing.value is value or existing.value == value):
                    return value
                raise RegistryError(
                    f"duplicate {self.kind} {name!r}: already registered by {existing.owner}, "
                    f"cannot register it again for {owner}"
                )
            self._entries[name] = Entry(name, value, owner)
            journal = getattr(_state, "journal", None)
            if journal is not None:
                journal.append((self, name))
        return value

    def unregister(self, name: str) -> None:
        with self._lock:
            self._entries.pop(name, None)
            self._loaded.pop(name, None)

    def _unknown(self, name: str) -> RegistryError:
        known = ", ".join(sorted(self._entries)) or "none"
        return RegistryError(f"unknown {self.kind} {name!r}; registered: {known}")

    def entry(self, name: str) -> Entry:
        try:
            return self._entries[name]
        except KeyError:
            raise self._unknown(name) from None

    def get(self, name: str) -> T:
        """The registered object, importing a lazy path on first use."""
        with self._lock:
            if name in self._loaded:
                return self._loaded[name]
            value = self.entry(name).value
            if isinstance(value, str):
                value = load_object(value)
                if self._check is not None and not self._check(value):
                    raise RegistryError(
                        f"{self.kind} {name!r}: {self._entries[name].value!r} resolved to {value!r}, "
                        f"expected {self._expected or 'a valid value'}"
                    )
            self._loaded[name] = value
            return value

    def owner(self, name: str) -> str:
        return self.entry(name).owner

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {self.names()})"


class CliError(Exception):
    """A mistake on a ``vllm-ascend`` command line (an option's value, a file): the CLI prints
    ``vllm-ascend <command>: <message>`` as one line and exits with status 2, without a traceback."""


@dataclass(frozen=True)
class CliCommand:
    """A ``vllm-ascend`` subcommand: ``configure`` adds its arguments, ``run`` returns the exit status
    (and raises :class:`CliError` for a user's mistake)."""

    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


def _is_class(value: Any) -> bool:
    return isinstance(value, type)


#: vLLM quantization method name -> a vLLM ``QuantizationConfig`` subclass (registered with vLLM).
QUANT_METHODS: Registry[type] = Registry(
    "quantization method", _is_class, "a QuantizationConfig class", import_at_load=False
)
#: ``speculative_config.method`` -> a proposer class with ``from_vllm_config(vllm_config)`` and vLLM's
#: CPU-drafter ``propose(...)`` signature; the platform refuses other methods, the runner drafts with it.
SPEC_DECODE_METHODS: Registry[type] = Registry(
    "speculative decoding method", _is_class, "a proposer class", import_at_load=False
)
#: vLLM ``load_format`` -> a vLLM model loader class (registered with vLLM).
MODEL_LOADERS: Registry[type] = Registry(
    "model loader", _is_class, "a model loader class", import_at_load=False
)
#: any name -> a :class:`~vllm_ascend.core.device.overlay.DeviceOverlay` for one family (checked without
#: importing at load: an overlay imports torch; ``vllm-ascend doctor`` imports it).
DEVICE_OVERLAYS: Registry[Any] = Registry("device overlay", import_at_load=False)
#: adaptor family (``DeviceAdaptorFamily`` value: ``"reference"``, ``"a2a3"``, ``"a5"``) -> the
#: ``BaseDeviceAdaptor`` subclass implementing core's op contract for it (ascend-kernels registers them).
DEVICE_ADAPTORS: Registry[type] = Registry(
    "device adaptor", _is_class, "a BaseDeviceAdaptor subclass", import_at_load=False
)
#: ``kv_transfer_config.kv_connector`` -> a vLLM ``KVConnectorBase_V1`` subclass (handed to vLLM's
#: ``KVConnectorFactory`` by its lazy path; the platform refuses connectors not registered here).
KV_CONNECTORS: Registry[type] = Registry(
    "KV connector", _is_class, "a KVConnectorBase_V1 subclass", import_at_load=False
)
#: ``OffloadingConnector``'s ``spec_name`` -> a vLLM ``OffloadingSpec`` subclass (handed to vLLM's
#: ``OffloadingSpecFactory``; the platform names the first one for a connector left at vLLM's default spec).
KV_OFFLOAD_SPECS: Registry[type] = Registry(
    "KV offloading spec", _is_class, "an OffloadingSpec subclass", import_at_load=False
)
#: ``weight_transfer_config.backend`` -> a vLLM ``WeightTransferEngine`` subclass whose ``trainer_engine`` class
#: attribute is its ``TrainerWeightTransferEngine`` (both handed to vLLM's weight-transfer factories by lazy path;
#: the platform serves only the name equal to the device's collective backend, ``profile.dist_backend``).
WEIGHT_TRANSFER_ENGINES: Registry[type] = Registry(
    "weight transfer engine", _is_class, "a WeightTransferEngine subclass", import_at_load=False
)
#: any name -> ``probe() -> dict[str, str]``: what ``vllm-ascend doctor`` shows about something a sibling
#: depends on at run time (label -> one line), e.g. whether a transfer engine initializes here.
DOCTOR_PROBES: Registry[Callable[..., Any]] = Registry(
    "doctor probe", callable, "a callable returning label -> line", import_at_load=False
)
#: ``vllm-ascend <name>`` -> a :class:`~vllm_ascend.core.cli.CliCommand`.
CLI_COMMANDS: Registry[Any] = Registry("CLI subcommand")
#: ``"default"`` -> the worker class vLLM runs on this platform.
WORKERS: Registry[type] = Registry("worker", _is_class, "a worker class", import_at_load=False)
#: ``additional_config`` section owned by a sibling -> ``validate(raw_mapping, vllm_config) -> object``,
#: called once per :func:`~vllm_ascend.core.config.init_ascend_config` (checked without importing at load).
CONFIG_SECTIONS: Registry[Callable[..., Any]] = Registry(
    "config section", callable, "a validator callable", import_at_load=False
)

#: ``"default"`` -> ``schedule_for(vllm_config, ep_size) -> schedule | None``: the expert-placement schedule
#: (EPLB) the runner's MoE layers register with: ``register(layer)``, ``started``, ``begin(num_experts)``,
#: ``rank_maps(rank_table)``, ``forward_end(phase)``, ``layers``; around a weight update ``settle()`` and
#: ``relayout(layer_index, laid_out_as)`` (checked without importing at load).
MOE_PLACEMENTS: Registry[Callable[..., Any]] = Registry(
    "MoE expert placement", callable, "a schedule factory", import_at_load=False
)

ALL_REGISTRIES: dict[str, Registry[Any]] = {
    "quant_methods": QUANT_METHODS,
    "spec_decode_methods": SPEC_DECODE_METHODS,
    "model_loaders": MODEL_LOADERS,
    "device_overlays": DEVICE_OVERLAYS,
    "device_adaptors": DEVICE_ADAPTORS,
    "kv_connectors": KV_CONNECTORS,
    "kv_offload_specs": KV_OFFLOAD_SPECS,
    "weight_transfer_engines": WEIGHT_TRANSFER_ENGINES,
    "doctor_probes": DOCTOR_PROBES,
    "cli_commands": CLI_COMMANDS,
    "workers": WORKERS,
    "config_sections": CONFIG_SECTIONS,
    "moe_placements": MOE_PLACEMENTS,
}
