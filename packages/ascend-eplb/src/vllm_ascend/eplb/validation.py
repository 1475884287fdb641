"""Input checks and plan checks shared by every policy and utility.

Bad input raises :class:`EplbInputError` naming the field and what is allowed; a bad *plan*
(produced by a policy) is not an error: :func:`valid_layers` flags it so the layer keeps its
old placement.
"""

from __future__ import annotations

import numpy as np


class EplbInputError(ValueError):
    """An EPLB input (table, workload, config, expert-map file) is malformed."""


def as_expert_table(table: object, name: str = "current_expert_table") -> np.ndarray:
    """``[layers, ranks, slots]`` int64 logical ids; each layer holds every id in ``0..n-1``."""
    try:
        arr = _to_numpy(table)
    except (OverflowError, ValueError, TypeError) as exc:
        raise EplbInputError(f"{name} must be an int array [layers, ranks, slots]: {exc}") from None
    if arr.ndim != 3 or 0 in arr.shape:
        raise EplbInputError(
            f"{name} must be a non-empty int array [layers, ranks, slots], got shape {arr.shape}"
        )
    if not np.issubdtype(arr.dtype, np.integer):
        if (
            not np.issubdtype(arr.dtype, np.floating)
            or not np.all(np.isfinite(arr))
            or np.any(arr != np.round(arr))
        ):
            raise EplbInputError(f"{name} must hold integer logical expert ids, got dtype {arr.dtype}")
    if arr.min() < 0:
        raise EplbInputError(f"{name} holds negative expert id {arr.min()}; allowed ids are 0..n-1")
    # Every layer places each id 0..n-1 at least once, so n is at most the slots of one layer; checked
    # before any array is sized by an id.
    limit = arr.shape[1] * arr.shape[2]
    if arr.max() >= limit:
        raise EplbInputError(
            f"{name} holds expert id {arr.max()}; a layer of {arr.shape[1]} ranks x {arr.shape[2]} slots "
            f"can place ids 0..{limit - 1} only"
        )
    arr = arr.astype(np.int64)
    n = int(arr.max()) + 1
    present = _all_present(arr, n)
    if not present.all():
        layer, expert = np.argwhere(~present)[0]
        raise EplbInputError(
            f"{name} layer {layer} has no replica of logical expert {expert}; every layer must place all "
            f"experts 0..{n - 1}"
        )
    dup = duplicated_on_rank(arr, n)
    if dup.any():
        layer = int(np.argmax(dup))
        raise EplbInputError(f"{name} layer {layer} places one logical expert twice on a rank")
    return arr


def as_workload(
    workload: object, shape: tuple[int, ...], name: str = "expert_workload", allow_history: bool = False
) -> np.ndarray:
    """Finite, non-negative float64 loads of shape ``shape`` (or ``[samples, *shape]`` if allowed)."""
    arr = _to_numpy(workload).astype(np.float64, copy=False)
    shapes = [tuple(shape)] + ([("samples", *shape)] if allow_history else [])
    if arr.shape != tuple(shape) and not (
        allow_history and arr.ndim == len(shape) + 1 and arr.shape[1:] == tuple(shape) and arr.shape[0] > 0
    ):
        allowed = " or ".join(str(s) for s in shapes)
        raise EplbInputError(f"{name} has shape {arr.shape}; expected {allowed} to match the expert table")
    if not np.all(np.isfinite(arr)):
        raise EplbInputError(f"{name} contains NaN or infinite loads; loads must be finite and >= 0")
    if arr.size and arr.min() < 0:
        raise EplbInputError(f"{name} contains negative load {float(arr.min())}; loads must be >= 0")
    return arr


def _to_numpy(x: object) -> np.ndarray:
    if hasattr(x, "detach"):  # torch tensor, without importing torch
        x = x.detach().cpu().numpy()
    return np.asarray(x)


def _all_present(table: np.ndarray, n: int) -> np.ndarray:
    """``[layers, n]`` bool: does the layer hold the expert anywhere?"""
    layers = table.shape[0]
    flat = (np.arange(layers)[:, None] * n + table.reshape(layers, -1)).ravel()
    return np.bincount(flat, minlength=layers * n).reshape(layers, n) > 0


def duplicated_on_rank(table: np.ndarray, n: int) -> np.ndarray:
    """Per layer: does some rank hold one logical expert more than once?"""
    rows = np.sort(table, axis=2)
    return (rows[..., 1:] == rows[..., :-1]).any(axis=(1, 2))


def local_slots(table: np.ndarray, n: int) -> np.ndarray:
    """``[layers, ranks, n]`` slot index of each logical expert on each rank, -1 where absent."""
    layers, ranks, slots = table.shape
    out = np.full((layers, ranks, n), -1, dtype=np.int64)
    li, ri, si = np.meshgrid(np.arange(layers), np.arange(ranks), np.arange(slots), indexing="ij")
    out[li, ri, table] = si
    return out


def valid_layers(old: np.ndarray, new: np.ndarray, n: int) -> np.ndarray:
    """Per layer: is ``new`` an acceptable successor of ``old``?

    Rejected: other shape, ids outside ``0..n-1``, a missing expert, an expert twice on a rank, or an
    expert that stays on a rank but changes slot there (a pointless local move).
    """
    if new.shape != old.shape:
        return np.zeros(old.shape[0], dtype=bool)
    in_range = ((new >= 0) & (new < n)).all(axis=(1, 2))
    safe = np.clip(new, 0, n - 1)
    ok = in_range & _all_present(safe, n).all(axis=1) & ~duplicated_on_rank(safe, n)
    same = old[..., :, None] == safe[..., None, :]  # [layers, ranks, old slot, new slot]
    moved_locally = (same & ~np.eye(old.shape[2], dtype=bool)).any(axis=(1, 2, 3))
    return ok & ~moved_locally
