"""Initial placement, expert maps and logical→physical maps."""

from __future__ import annotations

import numpy as np

from vllm_ascend.eplb.validation import EplbInputError, as_expert_table, local_slots


def generate_global_placement(
    num_experts: int, num_ranks: int, num_redundant_experts: int = 0, num_layers: int | None = None
) -> np.ndarray:
    """``[ranks, slots]`` (or ``[layers, ranks, slots]``): experts ``0..n-1`` then ``(0..R-1) % n``,
    laid out rank by rank. ``(n + R)`` must be divisible by the rank count and no rank may receive
    one expert twice."""
    for field, value, lo in (
        ("num_experts", num_experts, 1),
        ("num_ranks", num_ranks, 1),
        ("num_redundant_experts", num_redundant_experts, 0),
    ):
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < lo:
            raise EplbInputError(f"{field} must be an integer >= {lo}, got {value!r}")
    total = num_experts + num_redundant_experts
    if total % num_ranks:
        raise EplbInputError(
            f"num_redundant_experts={num_redundant_experts} is impossible: num_experts + num_redundant_experts "
            f"({total}) must be divisible by num_ranks={num_ranks}"
        )
    order = np.concatenate([np.arange(num_experts), np.arange(num_redundant_experts) % num_experts])
    table = order.reshape(num_ranks, -1)
    if any(len(set(row.tolist())) < len(row) for row in table):
        raise EplbInputError(
            f"num_redundant_experts={num_redundant_experts} is impossible for {num_experts} experts on "
            f"{num_ranks} ranks: a rank would hold one expert twice"
        )
    if num_layers is None:
        return table
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
        raise EplbInputError(f"num_layers must be an integer >= 1, got {num_layers!r}")
    return np.broadcast_to(table, (num_layers, *table.shape)).copy()


def generate_expert_map(table: object) -> np.ndarray:
    """``[layers, ranks, n]``: local slot of each logical expert on each rank, -1 where absent."""
    arr = as_expert_table(table, "expert_table")
    return local_slots(arr, int(arr.max()) + 1)


def generate_log2phy_map(table: object, tp_size: int = 1) -> np.ndarray:
    """``[layers, ranks, n]`` physical id (rank × slots + slot) each rank routes each expert to.

    A rank holding the expert uses its own copy; otherwise replicas are spread: rank ``r`` takes
    replica ``(r // tp_size) % k`` (replicas ordered by physical id), so the ranks of one tensor
    parallel group route identically."""
    arr = as_expert_table(table, "expert_table")
    if isinstance(tp_size, bool) or not isinstance(tp_size, int) or tp_size < 1 or arr.shape[1] % tp_size:
        raise EplbInputError(
            f"tp_size must be a positive divisor of the rank count {arr.shape[1]}, got {tp_size!r}"
        )
    layers, ranks, slots = arr.shape
    n = int(arr.max()) + 1
    flat = arr.reshape(layers, -1)
    order = np.argsort(flat * (ranks * slots) + np.arange(ranks * slots), axis=1, kind="stable")
    counts = np.stack([np.bincount(row, minlength=n) for row in flat])
    first = np.cumsum(counts, axis=1) - counts  # start of each expert's replica run in `order`
    choice = (np.arange(ranks) // tp_size)[None, :, None] % counts[:, None, :]
    phys = np.take_along_axis(order, (first[:, None, :] + choice).reshape(layers, -1), axis=1)
    phys = phys.reshape(layers, ranks, n)
    own = local_slots(arr, n)
    own_phys = np.arange(ranks)[None, :, None] * slots + own
    return np.where(own >= 0, own_phys, phys)


def rank_maps(rank_table: object, tp_size: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """``(expert_map [ranks, n], log2phy [ranks, n])`` of one layer's ``[ranks, slots]`` placement."""
    table = np.asarray(rank_table)[None]
    return generate_expert_map(table)[0], generate_log2phy_map(table, tp_size)[0]
