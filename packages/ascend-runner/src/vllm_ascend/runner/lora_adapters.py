"""PEFT LoRA adapters checked against the served model before vLLM loads them on the worker.

vLLM 0.32 loads an adapter whose ``lora_A`` has the wrong input width, or whose tensors' rank differs from the
config's ``r``, without a word (the punica slots are zero-padded, so requests run on wrong weights); a
``lora_B`` of the wrong width, a string ``r`` or ``lora_alpha`` or a missing ``adapter_config.json`` fail with
errors that name neither the file nor the field. :class:`AscendWorkerLoRAManager` checks each adapter first
(:func:`check_adapter`) and raises :class:`InvalidLoRAAdapterError` naming the file, the field or tensor, and
what is allowed; the server answers it with 400 (``vllm_bridge.answer_invalid_lora_adapters_with_400``).
Target modules listed in the config but absent from the weights are ignored, as PEFT does.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import torch
from vllm.lora.peft_helper import PEFTHelper
from vllm.lora.request import LoRARequest
from vllm.lora.utils import get_adapter_absolute_path, parse_fine_tuned_lora_name
from vllm.lora.worker_manager import LRUCacheWorkerLoRAManager
from vllm.model_executor.layers.linear import LinearBase

from vllm_ascend.core.sdk import InvalidLoRAAdapterError

CONFIG_FILE = "adapter_config.json"
#: The weight files vLLM reads, in its order of preference.
WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin", "adapter_model.pt")
#: (in_features, out_features) of each LoRA-capable module, by vLLM module name (packed modules split into the
#: names the adapter uses, e.g. ``q_proj`` / ``k_proj`` / ``v_proj`` of ``qkv_proj``); ``None``: not a linear
#: module (embedding, LM head), whose shapes vLLM checks itself.
ModuleShapes = Mapping[str, tuple[int, int] | None]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def read_adapter_config(adapter_dir: str) -> dict[str, Any]:
    """The adapter's ``adapter_config.json`` as a dict (missing, unreadable JSON or not an object: refused)."""
    path = os.path.join(adapter_dir, CONFIG_FILE)
    where = f"{adapter_dir}: {CONFIG_FILE}"
    if not os.path.isfile(path):
        raise InvalidLoRAAdapterError(
            f"{where} is missing: a PEFT LoRA adapter directory holds {CONFIG_FILE} and one of {', '.join(WEIGHT_FILES)}"
        )
    try:
        with open(path) as f:
            config = json.load(f)
    except json.JSONDecodeError as exc:
        raise InvalidLoRAAdapterError(f"{where} is not valid JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise InvalidLoRAAdapterError(f"{where} must hold a JSON object; got {type(config).__name__}")
    return config


def check_config_fields(config: dict[str, Any], where: str, max_lora_rank: int) -> None:
    """The fields vLLM reads, by type and range: ``r`` and ``rank_pattern`` values in 1..max_lora_rank,
    ``lora_alpha`` and ``alpha_pattern`` values numbers, ``target_modules`` a string or a list of strings,
    ``use_rslora`` a boolean. ``where`` names the file in the messages."""

    def refuse(field: str, allowed: str, value: Any) -> InvalidLoRAAdapterError:
        return InvalidLoRAAdapterError(f"{where}: field '{field}' must be {allowed}; got {value!r}")

    ranks = f"an integer in 1..{max_lora_rank} (--max-lora-rank)"
    for field in ("r", "lora_alpha", "target_modules"):
        if field not in config:
            raise InvalidLoRAAdapterError(
                f"{where}: field '{field}' is missing (required: r, lora_alpha, target_modules)"
            )
    if not _is_int(config["r"]) or not 1 <= config["r"] <= max_lora_rank:
        raise refuse("r", ranks, config["r"])
    if not _is_number(config["lora_alpha"]):
        raise refuse("lora_alpha", "a number", config["lora_alpha"])
    targets = config["target_modules"]
    if not isinstance(targets, str) and not (
        isinstance(targets, list) and all(isinstance(t, str) for t in targets)
    ):
        raise refuse("target_modules", "a string (a regex) or a list of module names", targets)
    for field, check, allowed in (
        ("rank_pattern", lambda v: _is_int(v) and 1 <= v <= max_lora_rank, ranks),
        ("alpha_pattern", _is_number, "a number"),
    ):
        pattern = config.get(field) or {}
        if not isinstance(pattern, dict):
            raise refuse(field, "an object of module patterns", pattern)
        for key, value in pattern.items():
            if not check(value):
                raise refuse(f"{field}.{key}", allowed, value)
    if not isinstance(config.get("use_rslora", False), bool):
        raise refuse("use_rslora", "true or false", config["use_rslora"])


def _tensor_shapes(path: str) -> dict[str, tuple[int, ...]]:
    if path.endswith(".safetensors"):
        from safetensors import safe_open

        with safe_open(path, framework="pt") as f:  # type: ignore[no-untyped-call]
            return {key: tuple(f.get_slice(key).get_shape()) for key in f.keys()}
    tensors = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    return {key: tuple(value.shape) for key, value in tensors.items()}


def _inside_unchecked_module(module: str, shapes: ModuleShapes) -> bool:
    """Whether ``module`` lies inside a LoRA-capable module whose shapes vLLM checks itself (``None``)."""
    parts = module.split(".")
    return any(shapes.get(".".join(parts[:i]), ()) is None for i in range(1, len(parts)))


def check_weights(
    adapter_dir: str, config: dict[str, Any], shapes: ModuleShapes, weights_mapper: Any = None
) -> None:
    """Every ``lora_A`` / ``lora_B`` pair in the weight file: both present, ``lora_A`` [rank, in_features] and
    ``lora_B`` [out_features, rank] with the config's rank for the module and the model module's widths."""
    name = next((n for n in WEIGHT_FILES if os.path.isfile(os.path.join(adapter_dir, n))), None)
    if name is None:
        raise InvalidLoRAAdapterError(
            f"{adapter_dir}: {WEIGHT_FILES[0]} is missing: the adapter's weights are read from one of "
            f"{', '.join(WEIGHT_FILES)}"
        )
    where = f"{adapter_dir}: {name}"
    helper = PEFTHelper.from_dict(config)
    pairs: dict[str, dict[str, tuple[str, tuple[int, ...]]]] = {}
    for key, shape in _tensor_shapes(os.path.join(adapter_dir, name)).items():
        for part in ("lora_A", "lora_B"):
            if f".{part}." in key:
                hf_name = key.split(f".{part}.")[0].removeprefix("base_model.model.")
                pairs.setdefault(hf_name, {})[part] = (key, shape)
    allowed = sorted({module.rsplit(".", 1)[-1] for module in shapes})
    for hf_name, parts in pairs.items():
        present = next(iter(parts.values()))[0]
        module, _ = parse_fine_tuned_lora_name(present, weights_mapper)
        if _inside_unchecked_module(module, shapes):
            continue  # e.g. a fused-MoE layer's experts (per-expert or 3D tensors): vLLM's MoE LoRA layer checks them
        if module.rsplit(".", 1)[-1] not in allowed:
            raise InvalidLoRAAdapterError(
                f"{where}: tensor {present!r} targets module {module!r}, which is not a LoRA-capable module "
                f"of the model; allowed target modules: {', '.join(allowed)}"
            )
        for part in ("lora_A", "lora_B"):
            if part not in parts:
                raise InvalidLoRAAdapterError(f"{where}: tensor {present!r} has no {part} partner")
        (a_key, a_shape), (b_key, b_shape) = parts["lora_A"], parts["lora_B"]
        widths = shapes.get(module)
        if (
            widths is None
        ):  # not a linear module, or a path vLLM's manager resolves itself (as vLLM, by leaf name)
            continue
        rank = helper.get_rank_and_scaling(hf_name)[0]
        in_features, out_features = widths
        for key, shape, want in (
            (a_key, a_shape, (rank, in_features)),
            (b_key, b_shape, (out_features, rank)),
        ):
            if shape != want:
                raise InvalidLoRAAdapterError(
                    f"{where}: tensor {key!r} has shape {list(shape)}; the model's module and the config's "
                    f"rank (field 'r' / 'rank_pattern': {rank}) need {list(want)}"
                )


def check_adapter(
    adapter_dir: str, max_lora_rank: int, shapes: ModuleShapes, weights_mapper: Any = None
) -> None:
    """Refuse a malformed adapter directory with :class:`InvalidLoRAAdapterError` naming file and field. The
    messages read ``<adapter dir>: <file name>: ...``: vLLM's server replaces paths in error messages with
    ``<path>``, the file name stays."""
    config = read_adapter_config(adapter_dir)
    check_config_fields(config, f"{adapter_dir}: {CONFIG_FILE}", max_lora_rank)
    check_weights(adapter_dir, config, shapes, weights_mapper)


def module_shapes(
    lora_modules: Mapping[str, torch.nn.Module], packed: Mapping[str, list[str]]
) -> dict[str, tuple[int, int] | None]:
    """:data:`ModuleShapes` of the model's LoRA-wrapped modules (``lora_modules``: vLLM's adapter manager's
    ``modules``), a packed module split into its parts by its ``output_sizes``; widths are the whole layer's
    (``input_size`` / ``output_size(s)``, not a tensor-parallel rank's shard), as the adapter holds them."""
    shapes: dict[str, tuple[int, int] | None] = {}
    for name, wrapped in lora_modules.items():
        base = getattr(wrapped, "base_layer", None)
        prefix, _, leaf = name.rpartition(".")
        parts = packed.get(leaf, [])
        if not isinstance(base, LinearBase):
            shapes[name] = None
            shapes.update({f"{prefix}.{p}" if prefix else p: None for p in parts or [leaf]})
            continue
        sizes = getattr(base, "output_sizes", None)
        if parts and sizes is not None and len(sizes) == len(parts):
            for part, size in zip(parts, sizes, strict=True):
                shapes[f"{prefix}.{part}" if prefix else part] = (base.input_size, size)
        else:
            shapes[name] = (base.input_size, base.output_size)
    return shapes


class AscendWorkerLoRAManager(LRUCacheWorkerLoRAManager):
    """vLLM's LRU worker LoRA manager, with every adapter checked by :func:`check_adapter` before it loads
    (both through ``add_lora`` and when a request brings it). A path that is not a directory is left to vLLM
    (its ``LoRAAdapterNotFoundError``: 404 on the server)."""

    _shapes: dict[str, tuple[int, int] | None] | None = None

    def _load_adapter(self, lora_request: LoRARequest) -> Any:
        path = get_adapter_absolute_path(lora_request.lora_path)
        if os.path.isdir(path):
            manager = self._adapter_manager
            if self._shapes is None:
                self._shapes = module_shapes(manager.modules, manager.packed_modules_mapping)
            mapper = getattr(manager.model, "hf_to_vllm_mapper", None)
            check_adapter(
                path,
                self.lora_config.max_lora_rank,
                self._shapes,
                mapper.get_rename_mapper() if mapper is not None else None,
            )
        return super()._load_adapter(lora_request)


def load_lora_model(
    runner: Any, model: torch.nn.Module, vllm_config: Any, device: torch.device
) -> torch.nn.Module:
    """The runners' ``load_lora_model``: vLLM's, with :class:`AscendWorkerLoRAManager` as the manager."""
    from vllm.model_executor.models import supports_lora

    if not supports_lora(model):
        raise ValueError(f"{model.__class__.__name__} does not support LoRA yet.")
    runner.lora_manager = AscendWorkerLoRAManager(vllm_config, device, model.embedding_modules)
    return runner.lora_manager.create_lora_manager(model, vllm_config)
