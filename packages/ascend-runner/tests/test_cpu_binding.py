"""CPU binding: the plan of each mode on synthetic CPU lists, a fake ``npu-smi`` for the topology
modes, and the warning when the host does not allow the binding."""

from __future__ import annotations

import logging
import os
import stat

import pytest

from vllm_ascend.core.device.profile import CPUBindingMode
from vllm_ascend.runner.cpu_binding import (
    CpuBindingError,
    bind_cpus,
    format_cpu_list,
    parse_cpu_list,
    parse_topo_affinity,
    plan_cpus,
    split_evenly,
    visible_npu_index,
)

A2_TOPO = """\
           NPU0       NPU1       NPU2       NPU3       CPU Affinity
NPU0       X          HCCS       HCCS       HCCS       0-7
NPU1       HCCS       X          HCCS       HCCS       0-7
NPU2       HCCS       HCCS       X          HCCS       8-15
NPU3       HCCS       HCCS       HCCS       X          8-15

Legend:

  X    = Self
  SYS  = Path traversing PCIe and NUMA nodes. Nodes are connected through SMP, such as QPI, UPI.
  PHB  = Path traversing PCIe and the PCIe host bridge of a CPU.
  PIX  = Path traversing a single PCIe switch
  PXB  = Path traversing multipul PCIe switches
  HCCS = Connection traversing HCCS.
  NA   = Unknown relationship.
"""


@pytest.fixture
def fake_npu_smi(tmp_path, monkeypatch):
    """``VLLM_ASCEND_NPU_SMI`` points at a script that prints ``A2_TOPO`` for ``info -t topo``."""
    (tmp_path / "topo.txt").write_text(A2_TOPO)
    script = tmp_path / "npu-smi"
    script.write_text(
        f'#!/bin/sh\n[ "$*" = "info -t topo" ] || {{ echo "unexpected: $*" >&2; exit 2; }}\n'
        f'cat "{tmp_path / "topo.txt"}"\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("VLLM_ASCEND_NPU_SMI", str(script))
    monkeypatch.delenv("ASCEND_RT_VISIBLE_DEVICES", raising=False)
    return script


@pytest.fixture
def warnings_seen(caplog):
    caplog.set_level("WARNING", logger="vllm_ascend")
    root = logging.getLogger("vllm_ascend")
    propagate, root.propagate = root.propagate, True
    yield caplog
    root.propagate = propagate


@pytest.fixture
def setaffinity_calls(monkeypatch):
    """Record ``os.sched_setaffinity`` calls instead of changing this process's affinity."""
    calls = []
    monkeypatch.setattr(os, "sched_setaffinity", lambda pid, cpus: calls.append((pid, set(cpus))))
    return calls


def test_parse_cpu_list_and_back():
    assert parse_cpu_list("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cpu_list(" 5 ") == [5]
    assert format_cpu_list([11, 0, 1, 2, 3, 8, 10]) == "0-3,8,10-11"
    with pytest.raises(CpuBindingError, match=r"invalid CPU list '0-a': '0-a' is not N or N-M"):
        parse_cpu_list("0-a")
    with pytest.raises(CpuBindingError, match=r"range '7-3' is reversed"):
        parse_cpu_list("7-3")


def test_average_splits_the_allowed_cpus_among_local_ranks():
    available = [0, 1, 2, 3, 8, 9, 10, 11, 12, 13]  # a cpuset with a hole
    plans = [plan_cpus(CPUBindingMode.AVERAGE, rank, 3, available) for rank in range(3)]
    assert plans == [[0, 1, 2, 3], [8, 9, 10], [11, 12, 13]]  # the remainder goes to rank 0
    assert plan_cpus(CPUBindingMode.AVERAGE, 0, 1, {5, 4}) == [4, 5]
    assert [plan_cpus(CPUBindingMode.AVERAGE, r, 2, range(4)) for r in range(2)] == [[0, 1], [2, 3]]
    assert plan_cpus(CPUBindingMode.NONE, 0, 2, range(4)) is None


def test_split_needs_a_cpu_per_rank_and_an_existing_share():
    with pytest.raises(CpuBindingError, match=r"3 usable CPUs \(0-2\) cannot be split among 4 ranks"):
        split_evenly([0, 1, 2], 4, 0)
    with pytest.raises(CpuBindingError, match="share 2 does not exist among 2 ranks"):
        split_evenly([0, 1, 2], 2, 2)


def test_parse_topo_affinity():
    assert parse_topo_affinity(A2_TOPO) == {
        0: list(range(8)),
        1: list(range(8)),
        2: list(range(8, 16)),
        3: list(range(8, 16)),
    }
    multi = "      NPU0  NPU1  CPU Affinity\nNPU0  X     HCCS  0-3,64-67\nNPU1  HCCS  X     4-7\n"
    assert parse_topo_affinity(multi) == {0: [0, 1, 2, 3, 64, 65, 66, 67], 1: [4, 5, 6, 7]}
    with pytest.raises(CpuBindingError, match="no 'CPU Affinity' column"):
        parse_topo_affinity("NPU0 X\n")
    with pytest.raises(CpuBindingError, match="has no CPU affinity entry"):
        parse_topo_affinity("      NPU0  NPU1  CPU Affinity\nNPU0  X     HCCS\n")


def test_visible_devices_map_local_rank_to_npu():
    assert visible_npu_index(1, "") == 1
    assert visible_npu_index(1, "2,3") == 3
    with pytest.raises(
        CpuBindingError, match=r"local rank 2 has no device in ASCEND_RT_VISIBLE_DEVICES='2,3'"
    ):
        visible_npu_index(2, "2,3")


def test_topo_affinity_splits_each_npus_node_through_npu_smi(fake_npu_smi, monkeypatch):
    plans = [plan_cpus(CPUBindingMode.TOPO_AFFINITY, rank, 4, range(16)) for rank in range(4)]
    assert plans == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    # CPUs outside this process's cpuset are not used; the rank's NPU comes from the visible devices
    assert plan_cpus(CPUBindingMode.TOPO_AFFINITY, 0, 1, [0, 1, 2, 3, 4, 8, 9]) == [0, 1, 2]
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "3,2")
    assert plan_cpus(CPUBindingMode.TOPO_AFFINITY, 0, 2, range(16)) == [12, 13, 14, 15]
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "7")
    with pytest.raises(CpuBindingError, match=r"NPU 7 \(local rank 0\) is not among the NPUs npu-smi lists"):
        plan_cpus(CPUBindingMode.TOPO_AFFINITY, 0, 1, range(16))


def test_cpu_pools_950_leave_a_polling_cpu(fake_npu_smi):
    assert plan_cpus(CPUBindingMode.CPU_POOLS_950, 2, 4, range(16)) == [8, 9, 10]
    with pytest.raises(CpuBindingError, match=r"needs at least 2 per rank, got 1: 0$"):
        plan_cpus(CPUBindingMode.CPU_POOLS_950, 0, 4, [0, 1, 8, 9, 10, 11, 12, 13])


def test_bind_cpus_applies_the_plan(fake_npu_smi, setaffinity_calls, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    assert bind_cpus(CPUBindingMode.TOPO_AFFINITY, 3, 4) == {12, 13, 14, 15}
    assert bind_cpus(CPUBindingMode.AVERAGE, 1, 2) == set(range(8, 16))
    assert setaffinity_calls == [(0, {12, 13, 14, 15}), (0, set(range(8, 16)))]


def test_bind_cpus_warns_when_the_host_has_too_few_cpus(setaffinity_calls, warnings_seen):
    ranks = len(os.sched_getaffinity(0)) + 1
    assert bind_cpus(CPUBindingMode.AVERAGE, 0, ranks) is None
    assert setaffinity_calls == []
    assert "CPU binding (average) of local rank 0 is not possible on this host" in warnings_seen.text
    assert f"cannot be split among {ranks} ranks" in warnings_seen.text


def test_bind_cpus_warns_when_the_os_refuses(monkeypatch, warnings_seen):
    def refuse(pid, cpus):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "sched_setaffinity", refuse)
    assert bind_cpus(CPUBindingMode.AVERAGE, 0, 1) is None
    assert "[Errno 1] Operation not permitted" in warnings_seen.text


def test_bind_cpus_warns_without_npu_smi(monkeypatch, setaffinity_calls, warnings_seen):
    monkeypatch.setenv("VLLM_ASCEND_NPU_SMI", "/nonexistent/npu-smi")
    assert bind_cpus(CPUBindingMode.TOPO_AFFINITY, 0, 1) is None
    assert setaffinity_calls == []
    assert "`/nonexistent/npu-smi info -t topo` failed" in warnings_seen.text
    assert "set VLLM_ASCEND_NPU_SMI to the npu-smi path" in warnings_seen.text


def test_none_mode_binds_nothing_and_says_so(setaffinity_calls, warnings_seen):
    assert bind_cpus(CPUBindingMode.NONE, 0, 1) is None
    assert setaffinity_calls == []
    assert "profile binds no CPUs" in warnings_seen.text


def test_bind_cpus_really_sets_the_affinity():
    before = os.sched_getaffinity(0)
    try:
        assert bind_cpus(CPUBindingMode.AVERAGE, 0, 1) == before
        assert os.sched_getaffinity(0) == before
        if len(before) >= 2:
            first = bind_cpus(CPUBindingMode.AVERAGE, 0, 2)
            assert first == set(sorted(before)[: -(-len(before) // 2)])
            assert os.sched_getaffinity(0) == first
    finally:
        os.sched_setaffinity(0, before)
