"""Expert-map JSON files: ``{"moe_layer_count", "layer_list": [{"layer_id", "device_count",
"device_list": [{"device_id", "device_expert": [logical ids in slot order]}]}]}``."""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from vllm_ascend.core.sdk import JsonInputError, read_json_file
from vllm_ascend.eplb.validation import EplbInputError, as_expert_table


def _field(obj: Any, key: str, where: str, kind: type | tuple[type, ...]) -> Any:
    if not isinstance(obj, dict) or key not in obj:
        raise EplbInputError(f"expert map {where}: missing field {key!r}")
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise EplbInputError(f"expert map {where}.{key} must be {names}, got {value!r}")
    return value


def parse_expert_map(data: Any) -> np.ndarray:
    """Validate a decoded expert-map document and return the ``[layers, ranks, slots]`` table."""
    count = _field(data, "moe_layer_count", "root", int)
    layers = _field(data, "layer_list", "root", list)
    if count < 1 or count != len(layers):
        raise EplbInputError(
            f"expert map moe_layer_count={count} must be >= 1 and equal len(layer_list)={len(layers)}"
        )
    rows = []
    for li, layer in enumerate(layers):
        where = f"layer_list[{li}]"
        layer_id = _field(layer, "layer_id", where, int)
        if layer_id != li:
            raise EplbInputError(
                f"expert map {where}.layer_id={layer_id}; layers must be listed in order 0..{count - 1}"
            )
        devices = _field(layer, "device_list", where, list)
        n_dev = _field(layer, "device_count", where, int)
        if n_dev < 1 or n_dev != len(devices):
            raise EplbInputError(
                f"expert map {where}.device_count={n_dev} must be >= 1 and equal len(device_list)={len(devices)}"
            )
        ranks = []
        for di, dev in enumerate(devices):
            dwhere = f"{where}.device_list[{di}]"
            dev_id = _field(dev, "device_id", dwhere, int)
            if dev_id != di:
                raise EplbInputError(
                    f"expert map {dwhere}.device_id={dev_id}; devices must be listed in order 0..{n_dev - 1}"
                )
            experts = _field(dev, "device_expert", dwhere, list)
            # A layer of n_dev ranks x len(experts) slots can only place ids below that slot count.
            limit = n_dev * len(experts)
            if not experts or any(
                isinstance(e, bool) or not isinstance(e, int) or not 0 <= e < limit for e in experts
            ):
                raise EplbInputError(
                    f"expert map {dwhere}.device_expert must be a non-empty list of expert ids in "
                    f"0..{max(limit - 1, 0)} (the layer's {n_dev} devices x {len(experts)} slots)"
                )
            ranks.append(experts)
        rows.append(ranks)
    shapes = {(len(r), len(d)) for r in rows for d in r}
    if len({len(r) for r in rows}) > 1 or len({s[1] for s in shapes}) > 1:
        raise EplbInputError(
            "expert map: every layer needs the same device_count and every device the same "
            "number of device_expert entries (slots per rank)"
        )
    return as_expert_table(np.asarray(rows, dtype=np.int64), "expert map")


def expert_file_to_tensor(path: str | os.PathLike[str]):
    """Read an expert-map JSON file → ``(table tensor [layers, ranks, slots], layers, ranks)``."""
    import torch

    try:
        data = read_json_file(path)
    except JsonInputError as exc:
        raise EplbInputError(f"expert map file {exc}") from None
    table = parse_expert_map(data)
    return torch.from_numpy(table), table.shape[0], table.shape[1]


def expert_map_document(table: Any) -> dict[str, Any]:
    """The JSON document for a ``[layers, ranks, slots]`` table."""
    arr = as_expert_table(table, "expert_table")
    return {
        "moe_layer_count": arr.shape[0],
        "layer_list": [
            {
                "layer_id": li,
                "device_count": arr.shape[1],
                "device_list": [
                    {"device_id": di, "device_expert": dev.tolist()} for di, dev in enumerate(layer)
                ],
            }
            for li, layer in enumerate(arr)
        ],
    }


def save_expert_map(table: Any, path: str | os.PathLike[str]) -> None:
    """Write a table as an expert-map JSON file (atomically)."""
    doc = expert_map_document(table)
    tmp = f"{os.fspath(path)}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f)
    os.replace(tmp, path)
