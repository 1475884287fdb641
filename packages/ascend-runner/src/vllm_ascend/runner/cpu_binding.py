"""Bind each worker process to its share of the host's CPUs (``additional_config.enable_cpu_binding``).

The mode comes from the device's hardware profile (``CPUBindingMode``):

- ``average``: the CPUs this process may use (``os.sched_getaffinity``) are split evenly, in order,
  among the node's local ranks; local rank ``i`` gets the ``i``-th share;
- ``topo_affinity``: ``npu-smi info -t topo`` (``VLLM_ASCEND_NPU_SMI``) gives each NPU's ``CPU
  Affinity``; the NPUs with the same affinity split those CPUs evenly, and the rank's NPU (its
  entry in ``ASCEND_RT_VISIBLE_DEVICES``) picks its share;
- ``cpu_pools_950``: as ``topo_affinity``, leaving the last CPU of the share to communication
  polling threads;
- ``none``: no binding.

Where the host does not allow the binding (fewer CPUs than ranks, no npu-smi, the OS refusing),
the worker logs a warning and keeps its current affinity: binding is a performance setting.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterable, Sequence

from vllm_ascend.core.sdk import CPUBindingMode, envs, init_logger

logger = init_logger(__name__)


class CpuBindingError(RuntimeError):
    """A binding plan that this host cannot satisfy, or npu-smi output that cannot be read."""


def parse_cpu_list(text: str) -> list[int]:
    """``"0-3,8,10-11"`` → ``[0, 1, 2, 3, 8, 10, 11]`` (the Linux cpulist format)."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if match is None:
            raise CpuBindingError(f"invalid CPU list {text!r}: {part!r} is not N or N-M")
        low = int(match.group(1))
        high = int(match.group(2)) if match.group(2) is not None else low
        if high < low:
            raise CpuBindingError(f"invalid CPU list {text!r}: range {part!r} is reversed")
        cpus.update(range(low, high + 1))
    return sorted(cpus)


def format_cpu_list(cpus: Iterable[int]) -> str:
    """Inverse of :func:`parse_cpu_list` with maximal ranges (for log messages)."""
    ordered = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


def split_evenly(cpus: Sequence[int], parts: int, index: int) -> list[int]:
    """Share ``index`` of ``cpus`` cut into ``parts`` contiguous shares (lower shares take the remainder)."""
    if not 0 <= index < parts:
        raise CpuBindingError(f"share {index} does not exist among {parts} ranks")
    if len(cpus) < parts:
        raise CpuBindingError(
            f"{len(cpus)} usable CPUs ({format_cpu_list(cpus) or 'none'}) cannot be split among {parts} ranks"
        )
    base, extra = divmod(len(cpus), parts)
    start = index * base + min(index, extra)
    return list(cpus[start : start + base + (1 if index < extra else 0)])


def parse_topo_affinity(text: str) -> dict[int, list[int]]:
    """``{npu index: CPUs}`` from the ``CPU Affinity`` column of ``npu-smi info -t topo``."""
    lines = text.splitlines()
    header_idx = next((i for i, line in enumerate(lines) if "CPU Affinity" in line), None)
    if header_idx is None:
        raise CpuBindingError("no 'CPU Affinity' column in `npu-smi info -t topo` output")
    n_links = sum(1 for token in lines[header_idx].split() if re.fullmatch(r"NPU\d+", token))
    affinity: dict[int, list[int]] = {}
    for line in lines[header_idx + 1 :]:
        tokens = line.split()
        match = re.fullmatch(r"NPU(\d+)", tokens[0]) if tokens else None
        if match is None:
            if affinity:
                break
            continue
        rest = tokens[1 + n_links :]
        if not rest:
            raise CpuBindingError(f"topology row {line.strip()!r} has no CPU affinity entry")
        affinity[int(match.group(1))] = parse_cpu_list("".join(rest))
    if not affinity:
        raise CpuBindingError("no NPU rows under the 'CPU Affinity' header of `npu-smi info -t topo`")
    return affinity


def visible_npu_index(local_rank: int, visible: str | None = None) -> int:
    """The physical NPU index of ``local_rank`` under ``ASCEND_RT_VISIBLE_DEVICES``."""
    visible = os.environ.get("ASCEND_RT_VISIBLE_DEVICES") if visible is None else visible
    if not visible:
        return local_rank
    ids = [int(v) for v in visible.split(",") if v.strip()]
    if not 0 <= local_rank < len(ids):
        raise CpuBindingError(
            f"local rank {local_rank} has no device in ASCEND_RT_VISIBLE_DEVICES={visible!r}"
        )
    return ids[local_rank]


def _npu_smi_topo() -> str:
    command = [envs.VLLM_ASCEND_NPU_SMI, "info", "-t", "topo"]
    try:
        return subprocess.run(command, check=True, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise CpuBindingError(
            f"`{' '.join(command)}` failed: {exc} (set VLLM_ASCEND_NPU_SMI to the npu-smi path)"
        ) from exc


def _topo_share(local_rank: int, available: Iterable[int]) -> list[int]:
    affinity = parse_topo_affinity(_npu_smi_topo())
    npu = visible_npu_index(local_rank)
    if npu not in affinity:
        raise CpuBindingError(
            f"NPU {npu} (local rank {local_rank}) is not among the NPUs npu-smi lists: {sorted(affinity)}"
        )
    near = affinity[npu]
    sharing = sorted(n for n, cpus in affinity.items() if cpus == near)
    allowed = set(available)
    return split_evenly([c for c in near if c in allowed], len(sharing), sharing.index(npu))


def plan_cpus(
    mode: CPUBindingMode, local_rank: int, local_world_size: int, available: Iterable[int]
) -> list[int] | None:
    """The CPUs local rank ``local_rank`` binds to under ``mode`` (None for ``none``)."""
    if mode is CPUBindingMode.NONE:
        return None
    if mode is CPUBindingMode.AVERAGE:
        return split_evenly(sorted(available), local_world_size, local_rank)
    cpus = _topo_share(local_rank, available)
    if mode is CPUBindingMode.CPU_POOLS_950:
        if len(cpus) < 2:
            raise CpuBindingError(
                f"cpu_pools_950 keeps one CPU for communication polling and needs at least 2 per rank, "
                f"got {len(cpus)}: {format_cpu_list(cpus) or 'none'}"
            )
        cpus = cpus[:-1]
    return cpus


def bind_cpus(mode: CPUBindingMode, local_rank: int, local_world_size: int) -> set[int] | None:
    """Bind this process to its planned CPUs; None (with a warning) where the host does not allow it."""
    available = os.sched_getaffinity(0)
    try:
        cpus = plan_cpus(mode, local_rank, local_world_size, available)
        if cpus is None:
            logger.warning("enable_cpu_binding is set but this device's profile binds no CPUs (mode none)")
            return None
        os.sched_setaffinity(0, cpus)
    except (CpuBindingError, OSError) as exc:
        logger.warning(
            "CPU binding (%s) of local rank %d is not possible on this host, keeping CPUs %s: %s",
            mode.value, local_rank, format_cpu_list(available), exc,
        )  # fmt: skip
        return None
    logger.info("Local rank %d bound to CPUs %s (%s)", local_rank, format_cpu_list(cpus), mode.value)
    return set(cpus)
