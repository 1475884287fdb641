"""ModelSlim ``quant_model_description.json``: parse, validate and map layers to scheme names.

The description maps every tensor of a quantized checkpoint (``"<prefix>.weight"``,
``"<prefix>.weight_scale"``, ...) to a type string (``"FLOAT"`` = not quantized) and carries a few
global keys (``model_quant_type``, ``version``, ``group_size``, ...). Validation collects every
problem before raising, so one error lists all of them with the field and the allowed values.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping, Sequence
from itertools import islice
from pathlib import Path
from typing import Any

from vllm_ascend.core.sdk import INT_MAX, JsonInputError, read_json_file
from vllm_ascend.quant import types as qt

DESCRIPTION_FILE = "quant_model_description.json"

DEFAULT_PACKED_MODULES: dict[str, tuple[str, ...]] = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
}
"""Fused module name → the checkpoint shards it is built from (vLLM's packed modules)."""

UNQUANTIZED = "unquantized"
"""Scheme name of a layer whose weights are ``FLOAT``."""

_EXPERT_WEIGHT = re.compile(r"^(?P<prefix>.+\.experts)\.(?P<index>\d+)\.(?P<proj>[^.]+)\.weight$")
_EXPERT_TENSOR = re.compile(r"^(?P<prefix>.+\.experts)\.\d+\.[^.]+\.[^.]+$")
EXPERT_PAIRS: tuple[tuple[str, str], ...] = (("gate_proj", "up_proj"), ("w1", "w3"))
"""Expert projections vLLM fuses into one ``w13`` weight: a checkpoint with one of a pair has both."""
_LISTED = 8
_INDEX_DIGITS = 9
"""Names listed in one problem before the rest are only counted."""
_JSON_TYPES = {dict: "an object", list: "an array", str: "a string", bool: "true/false", type(None): "null"}


def listing(names: Sequence[str], limit: int = _LISTED) -> str:
    """``names`` joined by commas; past ``limit`` the rest are counted ("... (N in all)")."""
    if len(names) <= limit:
        return ", ".join(names)
    return f"{', '.join(names[:limit])}, ... ({len(names)} in all)"


def layer_of(tensor: str) -> tuple[str, str]:
    """The layer a described tensor belongs to and its kind: ``("<prefix>.experts", "moe")`` for an expert's
    tensor, else ``(<tensor name without its last part>, "linear")``."""
    expert = _EXPERT_TENSOR.match(tensor)
    if expert:
        return expert["prefix"], "moe"
    return tensor.rpartition(".")[0], "linear"


class QuantDescriptionError(ValueError):
    """A quant description that cannot be used; ``problems`` lists every issue found."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"invalid quant description {source}: {len(self.problems)} problem(s)\n{lines}")


def _positive_int(minimum: int) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= INT_MAX:
            return f"an integer in {minimum}..{INT_MAX}"
        return None

    return check


def _one_of(allowed: tuple[str, ...]) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        return None if isinstance(value, str) and value in allowed else f"one of {', '.join(allowed)}"

    return check


def _non_empty_str(value: Any) -> str | None:
    return None if isinstance(value, str) and value.strip() else "a non-empty string"


def _bool(value: Any) -> str | None:
    return None if isinstance(value, bool) else "true or false"


class QuantDescription:
    """A validated ModelSlim quant description for one device family.

    ``source`` is the parsed JSON object, a path to the JSON file, or a model directory holding
    ``quant_model_description.json``. ``family`` is the device family (an ``AscendDeviceType``, its
    value ``"A2"``/``"A3"``/``"A5"``/``"310P"``, or a SOC name); types that need a hardware capability
    (W8A8S/W8A8SC: ``sparse_weight``) are accepted only for a family whose profile has it.
    """

    def __init__(
        self,
        source: Mapping[str, Any] | str | os.PathLike[str],
        *,
        family: Any = None,
        packed_modules: Mapping[str, tuple[str, ...]] | None = None,
    ) -> None:
        from vllm_ascend.core.sdk import AscendDeviceType

        self.family: str | None = None if family is None else AscendDeviceType.parse(family).value
        self.packed_modules = dict(DEFAULT_PACKED_MODULES if packed_modules is None else packed_modules)
        raw, self.source = _read(source)
        problems: list[str] = []
        self.tensors: dict[str, str] = {}
        globals_: dict[str, Any] = {}
        for key, value in raw.items():
            if key in _GLOBAL_CHECKS:
                globals_[key] = value
            elif isinstance(key, str) and "." in key:
                self._check_tensor(key, value, problems)
            else:
                problems.append(
                    f"unknown key {key!r}: expected a tensor name ('<prefix>.weight', ...) or one of "
                    f"the global keys {', '.join(_GLOBAL_CHECKS)}"
                )
        if "model_quant_type" not in globals_:
            problems.append(
                f"missing required key 'model_quant_type' (one of {', '.join(self._model_types())})"
            )
        for key, value in globals_.items():
            if key == "model_quant_type":
                problem = self._type_problem(key, value, self._model_types())
                if problem is not None:
                    problems.append(problem)
            elif (expected := _GLOBAL_CHECKS[key](value)) is not None:
                problems.append(f"{key} = {value!r}: expected {expected}")
        problems.extend(self._check_fused())
        if problems:
            raise QuantDescriptionError(self.source, problems)
        self.model_quant_type: str = globals_["model_quant_type"]
        self.version: str | None = globals_.get("version")
        self.group_size: int | None = globals_.get("group_size")
        self.fa_quant_type: str | None = globals_.get("fa_quant_type")
        self.indexer_quant_type: str | None = globals_.get("indexer_quant_type")
        self.kv_cache_type: str | None = globals_.get("kv_cache_type")
        self.max_supported_tp: int | None = globals_.get("max_supported_tp")
        self.is_rot_used: bool = globals_.get("is_rot_used", False)

    def __repr__(self) -> str:
        return (
            f"QuantDescription({self.model_quant_type}, {len(self.tensors)} tensors, "
            f"family={self.family}, source={self.source})"
        )

    # -- validation ---------------------------------------------------------------------------

    def _model_types(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys((*qt.linear_types(self.family), *qt.MOE_TYPES)))

    def _type_problem(self, field: str, value: Any, allowed: tuple[str, ...]) -> str | None:
        if isinstance(value, str) and value in allowed:
            return None
        needed = qt.family_requirement(value) if isinstance(value, str) else None
        if needed is not None:
            return (
                f"{field} = {value!r}: {value} is only supported on the {needed} family, "
                f"this description is for family {self.family}"
            )
        return f"{field} = {value!r}: expected one of {', '.join(allowed)}"

    def _check_tensor(self, key: str, value: Any, problems: list[str]) -> None:
        problem = self._type_problem(key, value, qt.tensor_types(self.family))
        if problem is None:
            self.tensors[key] = value
        else:
            problems.append(problem)

    def add_packed_modules(self, mapping: Mapping[str, Sequence[str]]) -> None:
        """Add fused-module definitions (fused name -> shard names) the model declares, then re-check that
        every fused layer's shards share one quant type (``QuantDescriptionError`` naming each that does not)."""
        new = {k: tuple(v) for k, v in mapping.items() if self.packed_modules.get(k) != tuple(v)}
        if not new:
            return
        self.packed_modules.update(new)
        problems = self._check_fused()
        if problems:
            raise QuantDescriptionError(self.source, problems)

    def _check_fused(self) -> list[str]:
        """Fused layers (packed modules, MoE experts) whose described shards mix types or are incomplete.

        A linear fused layer is incomplete here when at least two of its shards are described but not all
        (one shard alone may be an unfused layer of that name, e.g. MLA's ``q_proj``; the layer itself needs
        every shard: :meth:`layer_type`). An MoE layer is incomplete when its experts ``0..max`` do not all
        carry the same projections, a gate/up pair (:data:`EXPERT_PAIRS`) included.
        """
        problems: list[str] = []
        shard_of = {shard: fused for fused, shards in self.packed_modules.items() for shard in shards}
        groups: dict[str, dict[str, str]] = {}
        experts: dict[str, dict[tuple[int, str], str]] = {}
        for key, value in self.tensors.items():
            expert = _EXPERT_WEIGHT.match(key)
            if expert:
                if len(expert["index"]) > _INDEX_DIGITS:
                    problems.append(f"{key}: expert index out of range (at most {_INDEX_DIGITS} digits)")
                else:
                    experts.setdefault(expert["prefix"], {})[int(expert["index"]), expert["proj"]] = value
                continue
            if not key.endswith(".weight"):
                continue
            module = key[: -len(".weight")]
            parent, _, leaf = module.rpartition(".")
            if leaf in shard_of:
                fused = f"{parent}.{shard_of[leaf]}" if parent else shard_of[leaf]
                groups.setdefault(fused, {})[leaf] = value
        for fused, members in groups.items():
            problems.extend(_mixed(fused, [(m, t) for m, t in members.items()]))
            shards = self.packed_modules[fused.rpartition(".")[2]]
            missing = [s for s in shards if s not in members]
            if len(members) > 1 and missing:
                parent = fused.rpartition(".")[0]
                names = [f"{parent}.{s}.weight" if parent else f"{s}.weight" for s in missing]
                problems.append(
                    f"fused layer {fused!r} is missing shard(s) {', '.join(missing)}: {listing(names)} not "
                    f"described (described: {', '.join(s for s in shards if s in members)}); a fused layer "
                    f"needs all of {', '.join(shards)}"
                )
        for prefix, described in experts.items():
            problems.extend(_mixed(prefix, [(f"{i}.{p}", t) for (i, p), t in described.items()]))
            projections = {p for _, p in described}
            projections |= {b for a, b in EXPERT_PAIRS if a in projections} | {
                a for a, b in EXPERT_PAIRS if b in projections
            }
            count = max(i for i, _ in described) + 1
            absent = count * len(projections) - len(described)
            if absent:
                every = ((i, p) for i in range(count) for p in sorted(projections))
                first = [f"{i}.{p}" for i, p in islice((e for e in every if e not in described), _LISTED)]
                more = f", ... ({absent} in all)" if absent > len(first) else ""
                problems.append(
                    f"MoE layer {prefix!r} is missing expert shard(s) {', '.join(first)}{more} "
                    f"('{prefix}.<expert>.<proj>.weight'); experts 0..{count - 1} must each describe "
                    f"{', '.join(sorted(projections))}"
                )
        return problems

    # -- queries ------------------------------------------------------------------------------

    def tensor_type(self, name: str) -> str:
        """The type string of tensor ``name``."""
        try:
            return self.tensors[name]
        except KeyError:
            raise KeyError(f"tensor {name!r} is not in the quant description {self.source}") from None

    def layer_type(self, prefix: str, layer_kind: str) -> str:
        """The quant type of the layer at ``prefix`` (``"FLOAT"`` when unquantized)."""
        qt.allowed_for(layer_kind, self.family)  # validates layer_kind
        if layer_kind == "linear":
            return self._linear_type(prefix)
        if layer_kind == "moe":
            return self._moe_type(prefix)
        return self._attention_type(prefix)

    def scheme_for(self, prefix: str, layer_kind: str) -> str:
        """The scheme name (``"<layer_kind>:<type>"`` or ``"unquantized"``) for the layer at ``prefix``."""
        quant_type = self.layer_type(prefix, layer_kind)
        if quant_type == qt.FLOAT:
            return UNQUANTIZED
        allowed = qt.allowed_for(layer_kind, self.family)
        if quant_type not in allowed:
            raise QuantDescriptionError(
                self.source,
                [
                    f"layer {prefix!r} has quant type {quant_type!r}, which has no {layer_kind} scheme; "
                    f"allowed for {layer_kind}: {', '.join(allowed)}"
                ],
            )
        return f"{layer_kind}:{quant_type}"

    def check_tensor_parallel(self, tp_size: int) -> None:
        """Raise when ``tp_size`` exceeds the description's ``max_supported_tp``."""
        if self.max_supported_tp is not None and tp_size > self.max_supported_tp:
            raise ValueError(
                f"tensor_parallel_size={tp_size} exceeds max_supported_tp={self.max_supported_tp} "
                f"of the quant description {self.source}"
            )

    def _linear_type(self, prefix: str) -> str:
        parent, _, leaf = prefix.rpartition(".")
        shards = self.packed_modules.get(leaf)
        if shards is None:
            return self.tensor_type(f"{prefix}.weight")
        names = [f"{parent}.{s}.weight" if parent else f"{s}.weight" for s in shards]
        found = {n: self.tensors[n] for n in names if n in self.tensors}
        if not found:
            raise KeyError(
                f"fused layer {prefix!r}: none of its shards {', '.join(names)} is in the quant "
                f"description {self.source}"
            )
        missing = [s for s, n in zip(shards, names, strict=True) if n not in found]
        if missing:
            raise KeyError(
                f"fused layer {prefix!r} is missing shard(s) {', '.join(missing)}: "
                f"{', '.join(n for n in names if n not in found)} not in the quant description {self.source}"
            )
        return next(iter(found.values()))  # shards agree: checked at parse time

    def _moe_type(self, prefix: str) -> str:
        types = {
            t for k, t in self.tensors.items() if (m := _EXPERT_WEIGHT.match(k)) and m["prefix"] == prefix
        }
        if not types:
            raise KeyError(
                f"MoE layer {prefix!r}: no '{prefix}.<expert>.<proj>.weight' entries in the quant "
                f"description {self.source}"
            )
        return types.pop()  # experts agree: checked at parse time

    def _attention_type(self, prefix: str) -> str:
        attention = set(qt.ATTENTION_TYPES + qt.KV_CACHE_TYPES)
        types = {t for k, t in self.tensors.items() if k.startswith(f"{prefix}.") and t in attention}
        if len(types) > 1:
            raise QuantDescriptionError(
                self.source,
                [f"attention layer {prefix!r} mixes attention quant types {', '.join(sorted(types))}"],
            )
        if types:
            return types.pop()
        return self.fa_quant_type or self.kv_cache_type or qt.FLOAT


def _mixed(layer: str, shards: list[tuple[str, str]]) -> list[str]:
    """The problem of a fused layer whose ``(shard, type)`` pairs carry more than one type."""
    if len({t for _, t in shards}) <= 1:
        return []
    return [
        f"fused layer {layer!r} mixes quant types across its shards "
        f"({listing([f'{m}={t}' for m, t in shards])}); all shards must share one type"
    ]


_GLOBAL_CHECKS: dict[str, Callable[[Any], str | None]] = {
    "model_quant_type": _non_empty_str,  # checked against the family's types in QuantDescription
    "version": _non_empty_str,
    "group_size": _positive_int(0),
    "fa_quant_type": _one_of(qt.ATTENTION_TYPES),
    "indexer_quant_type": _one_of(qt.ATTENTION_TYPES),
    "kv_cache_type": _one_of(qt.KV_CACHE_TYPES),
    "max_supported_tp": _positive_int(1),
    "is_rot_used": _bool,
}


def _read(source: Mapping[str, Any] | str | os.PathLike[str]) -> tuple[Mapping[str, Any], str]:
    """The raw JSON object and a label naming where it came from."""
    if isinstance(source, Mapping):
        return source, "<dict>"
    if not isinstance(source, str | os.PathLike):
        raise TypeError(f"quant description must be a mapping or a path, got {type(source).__name__}")
    path = Path(source)
    if path.is_dir():
        path = path / DESCRIPTION_FILE
    label = str(path)
    if not path.exists():
        raise FileNotFoundError(f"quant description not found: {label}")
    try:
        raw = read_json_file(path)
    except JsonInputError as exc:
        raise QuantDescriptionError(label, [exc.problem]) from None
    if not isinstance(raw, dict):
        raise QuantDescriptionError(label, [f"top level must be a JSON object, got {json_type(raw)}"])
    return raw, label


def json_type(value: Any) -> str:
    """What ``value`` is, in JSON's words ("an array", "a string", "null", ...)."""
    return _JSON_TYPES.get(type(value), "a number")
