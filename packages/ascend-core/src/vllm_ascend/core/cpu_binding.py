"""Bind each worker to CPUs close to its NPU, from ``npu-smi`` output.

``npu-smi info`` lists the NPUs (id, chip, name, bus id); ``npu-smi info -t topo`` has a
``CPU Affinity`` column giving the CPUs of each NPU's NUMA node. The binding mode comes from the
device's hardware profile (``CPUBindingMode``):

- ``topo_affinity``: NPUs sharing a node split that node's usable CPUs evenly
  (:meth:`CpuAlloc.average_distribute`); a rank left with fewer than ``min_cpus`` CPUs borrows
  unused CPUs from the nearest NUMA nodes (:meth:`CpuAlloc.extend_numa`);
- ``average``: all usable CPUs split evenly across the NPUs, ignoring topology;
- ``cpu_pools_950``: as ``topo_affinity``, then each rank's set is split into a main pool (the
  worker) and a poll pool reserved for communication polling threads
  (:func:`build_ascend_950_cpu_pools`);
- ``none``: no binding.
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from vllm_ascend.core import envs
from vllm_ascend.core.device.profile import CPUBindingMode
from vllm_ascend.core.logger import init_logger

logger = init_logger(__name__)


class CpuBindingError(RuntimeError):
    """npu-smi output that cannot be parsed, or a binding plan that cannot be built."""


def parse_cpu_list(text: str) -> list[int]:
    """``"0-3,8,10-11"`` → ``[0, 1, 2, 3, 8, 10, 11]`` (the Linux cpulist format)."""
    cpus: list[int] = []
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
        cpus.extend(range(low, high + 1))
    return sorted(set(cpus))


def format_cpu_list(cpus: Iterable[int]) -> str:
    """Inverse of :func:`parse_cpu_list` with maximal ranges."""
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


def cpu_to_mask(cpus: Iterable[int]) -> str:
    """Affinity mask as hex (``[0, 1, 4]`` → ``"0x13"``), the form taskset and ACL accept."""
    mask = 0
    for cpu in cpus:
        mask |= 1 << cpu
    return hex(mask)


@dataclass(frozen=True)
class NpuEntry:
    """One logical NPU from ``npu-smi info``."""

    logical_id: int
    npu_id: int
    chip_id: int
    name: str
    bus_id: str


_ROW = re.compile(r"^\|\s*(\d+)\s+(\S.*?)\s*\|")
_CHIP_ROW = re.compile(
    r"^\|\s*(\d+)\s*(\d*)\s*\|\s*([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d)\s*\|"
)


def parse_npu_info(text: str) -> list[NpuEntry]:
    """Enumerate NPUs from ``npu-smi info`` in listed order (logical id = position).

    Each device occupies a name row (``| <npu> <name> | <health> | ...``) followed by one chip
    row per chip (``| <chip> [<phy id>] | <bus id> | ...``). The process table below the device
    table is ignored.
    """
    entries: list[NpuEntry] = []
    current: tuple[int, str] | None = None
    for line in text.splitlines():
        if "Process id" in line or "Process name" in line:
            break
        chip = _CHIP_ROW.match(line)
        if chip is not None and current is not None:
            entries.append(NpuEntry(len(entries), current[0], int(chip.group(1)), current[1], chip.group(3)))
            continue
        row = _ROW.match(line)
        if row is not None:
            current = (int(row.group(1)), row.group(2).split()[0])
    if not entries:
        raise CpuBindingError(
            "no NPU found in `npu-smi info` output (expected rows like '| 0  910B3 | OK | ...')"
        )
    return entries


def parse_topo_affinity(text: str) -> dict[int, list[int]]:
    """``{npu index: CPUs}`` from the ``CPU Affinity`` column of ``npu-smi info -t topo``."""
    lines = text.splitlines()
    header_idx = next((i for i, line in enumerate(lines) if "CPU Affinity" in line), None)
    if header_idx is None:
        raise CpuBindingError("no 'CPU Affinity' column in `npu-smi info -t topo` output")
    header = lines[header_idx].split()
    n_links = sum(1 for token in header if re.fullmatch(r"NPU\d+", token))
    affinity: dict[int, list[int]] = {}
    for line in lines[header_idx + 1 :]:
        tokens = line.split()
        if not tokens:
            continue
        match = re.fullmatch(r"NPU(\d+)", tokens[0])
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


def read_numa_nodes(sysfs: str = "/sys/devices/system/node") -> dict[int, list[int]]:
    """``{node: CPUs}`` from sysfs (empty where sysfs has no NUMA information)."""
    nodes: dict[int, list[int]] = {}
    if not os.path.isdir(sysfs):
        return nodes
    for name in os.listdir(sysfs):
        match = re.fullmatch(r"node(\d+)", name)
        if match is None:
            continue
        with open(os.path.join(sysfs, name, "cpulist"), encoding="ascii") as f:
            nodes[int(match.group(1))] = parse_cpu_list(f.read())
    return nodes


def is_arm_cpu() -> bool:
    return platform.machine().lower() in ("aarch64", "arm64")


@dataclass
class CpuAlloc:
    """Builds per-NPU CPU sets from affinity, usable CPUs and NUMA nodes."""

    num_npus: int
    available: list[int]
    affinity: dict[int, list[int]] = field(default_factory=dict)
    numa_nodes: dict[int, list[int]] = field(default_factory=dict)
    min_cpus: int = 1

    def average_distribute(self) -> dict[int, list[int]]:
        """Split CPUs evenly (contiguous, lowest NPU first gets any remainder) among NPUs of one node."""
        usable = set(self.available)
        groups: dict[tuple[int, ...], list[int]] = {}
        for npu in range(self.num_npus):
            near = self.affinity.get(npu)
            key = tuple(c for c in near if c in usable) if near else tuple(sorted(usable))
            groups.setdefault(key, []).append(npu)
        plan: dict[int, list[int]] = {}
        for shared, npus in groups.items():
            base, extra = divmod(len(shared), len(npus))
            start = 0
            for i, npu in enumerate(sorted(npus)):
                take = base + (1 if i < extra else 0)
                plan[npu] = list(shared[start : start + take])
                start += take
        return plan

    def extend_numa(self, plan: dict[int, list[int]]) -> dict[int, list[int]]:
        """Give ranks below ``min_cpus`` unused CPUs from the nearest NUMA nodes (by node id)."""
        used = {c for cpus in plan.values() for c in cpus}
        usable = set(self.available)
        node_of = {c: node for node, cpus in self.numa_nodes.items() for c in cpus}
        out = {npu: list(cpus) for npu, cpus in plan.items()}
        for npu in sorted(out):
            cpus = out[npu]
            if len(cpus) >= self.min_cpus:
                continue
            near = cpus or self.affinity.get(npu) or []
            home = (
                node_of.get(near[0], min(self.numa_nodes, default=0))
                if near
                else min(self.numa_nodes, default=0)
            )
            for node in sorted(self.numa_nodes, key=lambda n: (abs(n - home), n)):
                for cpu in self.numa_nodes[node]:
                    if len(cpus) >= self.min_cpus:
                        break
                    if cpu in usable and cpu not in used:
                        cpus.append(cpu)
                        used.add(cpu)
            if len(cpus) < self.min_cpus:
                raise CpuBindingError(
                    f"NPU {npu} gets {len(cpus)} CPUs but min_cpus={self.min_cpus}: only "
                    f"{len(usable)} usable CPUs for {self.num_npus} NPUs"
                )
            out[npu] = sorted(cpus)
        return out

    def plan(self) -> dict[int, list[int]]:
        if not self.available:
            raise CpuBindingError("no usable CPUs to bind to")
        return self.extend_numa(self.average_distribute())


def _run_npu_smi(*args: str) -> str:
    command = [envs.VLLM_ASCEND_NPU_SMI, "info", *args]
    try:
        return subprocess.run(command, check=True, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise CpuBindingError(
            f"`{' '.join(command)}` failed: {exc} (set VLLM_ASCEND_NPU_SMI to the npu-smi path)"
        ) from exc


def visible_npu_index(rank_local: int, visible: str | None = None) -> int:
    """The physical NPU index of local rank ``rank_local`` under ``ASCEND_RT_VISIBLE_DEVICES``."""
    visible = os.environ.get("ASCEND_RT_VISIBLE_DEVICES") if visible is None else visible
    if not visible:
        return rank_local
    ids = [int(v) for v in visible.split(",") if v.strip()]
    if not 0 <= rank_local < len(ids):
        raise CpuBindingError(
            f"local rank {rank_local} has no device in ASCEND_RT_VISIBLE_DEVICES={visible!r}"
        )
    return ids[rank_local]


@dataclass(frozen=True)
class CpuPools:
    """An Ascend 950 rank's CPUs: ``main`` for the worker, ``poll`` for communication polling threads."""

    main: list[int]
    poll: list[int]


def build_ascend_950_cpu_pools(cpus: Sequence[int], poll_cpus: int = 1) -> CpuPools:
    """Reserve the last ``poll_cpus`` CPUs of a rank's set for polling; the rest run the worker."""
    ordered = sorted(cpus)
    if poll_cpus < 1 or len(ordered) <= poll_cpus:
        raise CpuBindingError(
            f"an Ascend 950 CPU pool needs more than poll_cpus={poll_cpus} CPUs (>= 1) per rank, "
            f"got {len(ordered)}: {format_cpu_list(ordered) or 'none'}"
        )
    return CpuPools(main=ordered[:-poll_cpus], poll=ordered[-poll_cpus:])


def _current_binding_mode() -> CPUBindingMode:
    from vllm_ascend.core.device.profile import get_current_hardware_profile

    return get_current_hardware_profile().cpu_binding


def bind_cpus(
    rank_local: int,
    *,
    mode: CPUBindingMode | str | None = None,
    info_text: str | None = None,
    topo_text: str | None = None,
    available: Sequence[int] | None = None,
    numa_nodes: dict[int, list[int]] | None = None,
    min_cpus: int = 1,
    poll_cpus: int = 1,
    setaffinity: Callable[[int, set[int]], None] = os.sched_setaffinity,
) -> CpuPools | None:
    """Bind this process to the CPUs planned for local rank ``rank_local``'s NPU.

    ``mode`` defaults to the running device's profile; texts default to running npu-smi;
    ``available`` to this process's current affinity. Returns the rank's pools (``poll`` is
    empty outside ``cpu_pools_950``; the process is bound to ``main``), or None when the mode is
    ``none`` or the OS refused (a warning: e.g. no ``CAP_SYS_NICE``, or a cpuset excluding them).
    """
    try:
        binding = CPUBindingMode(mode) if mode is not None else _current_binding_mode()
    except ValueError:
        allowed = ", ".join(m.value for m in CPUBindingMode)
        raise CpuBindingError(f"CPU binding mode {mode!r} is unknown; allowed: {allowed}") from None
    if binding is CPUBindingMode.NONE:
        return None
    info = parse_npu_info(info_text if info_text is not None else _run_npu_smi())
    npu = visible_npu_index(rank_local)
    if npu >= len(info):
        raise CpuBindingError(
            f"NPU {npu} (local rank {rank_local}) is not among the {len(info)} NPUs npu-smi lists"
        )
    affinity: dict[int, list[int]] = {}
    if binding is not CPUBindingMode.AVERAGE:
        affinity = parse_topo_affinity(topo_text if topo_text is not None else _run_npu_smi("-t", "topo"))
    alloc = CpuAlloc(
        num_npus=len(info),
        available=sorted(available if available is not None else os.sched_getaffinity(0)),
        affinity=affinity,
        numa_nodes=numa_nodes if numa_nodes is not None else read_numa_nodes(),
        min_cpus=min_cpus,
    )
    cpus = alloc.plan()[npu]
    pools = (
        build_ascend_950_cpu_pools(cpus, poll_cpus)
        if binding is CPUBindingMode.CPU_POOLS_950
        else CpuPools(main=cpus, poll=[])
    )
    try:
        setaffinity(0, set(pools.main))
    except OSError as exc:
        logger.warning(
            "CPU binding of rank %d to CPUs %s refused: %s", rank_local, format_cpu_list(pools.main), exc
        )
        return None
    logger.info(
        "Rank %d (NPU %d) bound to CPUs %s (%s)%s",
        rank_local,
        npu,
        format_cpu_list(pools.main),
        binding.value,
        f", poll CPUs {format_cpu_list(pools.poll)}" if pools.poll else "",
    )
    return pools
