"""CPU binding from npu-smi sample outputs (texts written here, shaped like real npu-smi output)."""

from __future__ import annotations

import pytest

from vllm_ascend.core.cpu_binding import (
    CpuAlloc,
    CpuBindingError,
    CpuPools,
    bind_cpus,
    build_ascend_950_cpu_pools,
    cpu_to_mask,
    format_cpu_list,
    parse_cpu_list,
    parse_npu_info,
    parse_topo_affinity,
    read_numa_nodes,
    visible_npu_index,
)

A2_INFO = """\
+------------------------------------------------------------------------------------------------+
| npu-smi 24.1.0                   Version: 24.1.0                                               |
+---------------------------+---------------+----------------------------------------------------+
| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|
| Chip                      | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |
+===========================+===============+====================================================+
| 0     910B3               | OK            | 93.1        41                0    / 0             |
| 0                         | 0000:C1:00.0  | 0           0    / 0          3376 / 65536         |
+===========================+===============+====================================================+
| 1     910B3               | OK            | 90.4        40                0    / 0             |
| 0                         | 0000:C2:00.0  | 0           0    / 0          3375 / 65536         |
+===========================+===============+====================================================+
| 2     910B3               | OK            | 92.0        42                0    / 0             |
| 0                         | 0000:81:00.0  | 0           0    / 0          3375 / 65536         |
+===========================+===============+====================================================+
| 3     910B3               | OK            | 94.7        41                0    / 0             |
| 0                         | 0000:82:00.0  | 0           0    / 0          3376 / 65536         |
+===========================+===============+====================================================+
+---------------------------+---------------+----------------------------------------------------+
| NPU     Chip              | Process id    | Process name             | Process memory(MB)      |
+===========================+===============+====================================================+
| 0       0                 | 2345          | python                   | 1024                    |
+===========================+===============+====================================================+
"""

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

# A3: two chips per card; the chip row carries chip id and physical id.
A3_INFO = """\
| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|
| Chip  Phy-ID              | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |
+===========================+===============+====================================================+
| 0     Ascend910           | OK            | 180.2       38                0    / 0             |
| 0     0                   | 0000:9D:00.0  | 0           0    / 0          3200 / 65536         |
| 1     1                   | 0000:9F:00.0  | 0           0    / 0          2900 / 65536         |
+===========================+===============+====================================================+
| 1     Ascend910           | OK            | 175.0       37                0    / 0             |
| 0     2                   | 0000:99:00.0  | 0           0    / 0          3100 / 65536         |
| 1     3                   | 0000:9B:00.0  | 0           0    / 0          2800 / 65536         |
+===========================+===============+====================================================+
"""

NUMA = {0: list(range(0, 8)), 1: list(range(8, 16))}


def test_parse_cpu_list_and_back():
    assert parse_cpu_list("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cpu_list(" 5 ") == [5]
    assert format_cpu_list([11, 0, 1, 2, 3, 8, 10]) == "0-3,8,10-11"
    assert cpu_to_mask([0, 1, 4]) == "0x13"
    assert cpu_to_mask(range(8, 16)) == "0xff00"
    with pytest.raises(CpuBindingError, match=r"invalid CPU list '0-a': '0-a' is not N or N-M"):
        parse_cpu_list("0-a")
    with pytest.raises(CpuBindingError, match=r"range '7-3' is reversed"):
        parse_cpu_list("7-3")


def test_parse_npu_info_a2():
    npus = parse_npu_info(A2_INFO)
    assert [(n.logical_id, n.npu_id, n.chip_id, n.name, n.bus_id) for n in npus] == [
        (0, 0, 0, "910B3", "0000:C1:00.0"),
        (1, 1, 0, "910B3", "0000:C2:00.0"),
        (2, 2, 0, "910B3", "0000:81:00.0"),
        (3, 3, 0, "910B3", "0000:82:00.0"),
    ]


def test_parse_npu_info_a3_two_chips_per_card():
    npus = parse_npu_info(A3_INFO)
    assert [(n.logical_id, n.npu_id, n.chip_id, n.bus_id) for n in npus] == [
        (0, 0, 0, "0000:9D:00.0"),
        (1, 0, 1, "0000:9F:00.0"),
        (2, 1, 0, "0000:99:00.0"),
        (3, 1, 1, "0000:9B:00.0"),
    ]


def test_parse_npu_info_without_devices():
    with pytest.raises(CpuBindingError, match="no NPU found in `npu-smi info` output"):
        parse_npu_info("| No running processes found in NPU 0 |")


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


def test_average_distribute_splits_each_numa_node_among_its_npus():
    alloc = CpuAlloc(4, list(range(16)), parse_topo_affinity(A2_TOPO), NUMA)
    assert alloc.plan() == {0: [0, 1, 2, 3], 1: [4, 5, 6, 7], 2: [8, 9, 10, 11], 3: [12, 13, 14, 15]}


def test_uneven_split_gives_the_remainder_to_lower_npus_and_skips_unusable_cpus():
    usable = [0, 1, 2, 3, 4, 8, 9, 10, 11, 12, 13, 14, 15]  # 5, 6, 7 excluded by the cpuset
    alloc = CpuAlloc(4, usable, parse_topo_affinity(A2_TOPO), NUMA)
    assert alloc.average_distribute() == {0: [0, 1, 2], 1: [3, 4], 2: [8, 9, 10, 11], 3: [12, 13, 14, 15]}


def test_extend_numa_borrows_from_the_nearest_node():
    usable = [0, 1, 8, 9, 10, 11, 12, 13, 14, 15]  # node 0 has only two usable CPUs for two NPUs
    alloc = CpuAlloc(4, usable, parse_topo_affinity(A2_TOPO), NUMA, min_cpus=2)
    base = alloc.average_distribute()
    assert base[0] == [0] and base[1] == [1]
    # node 1's CPUs are all given to NPUs 2/3: nothing free to borrow
    with pytest.raises(CpuBindingError, match="NPU 0 gets 1 CPUs but min_cpus=2"):
        alloc.plan()
    spare = CpuAlloc(2, usable, {0: list(range(8)), 1: list(range(8))}, NUMA, min_cpus=3)
    assert spare.plan() == {0: [0, 8, 9], 1: [1, 10, 11]}


def test_no_affinity_splits_all_usable_cpus():
    alloc = CpuAlloc(3, list(range(10)), {}, {})
    assert alloc.plan() == {0: [0, 1, 2, 3], 1: [4, 5, 6], 2: [7, 8, 9]}
    with pytest.raises(CpuBindingError, match="no usable CPUs to bind to"):
        CpuAlloc(1, [], {}, {}).plan()


def test_visible_devices_map_local_rank_to_npu():
    assert visible_npu_index(1, "") == 1
    assert visible_npu_index(1, "2,3") == 3
    with pytest.raises(
        CpuBindingError, match=r"local rank 2 has no device in ASCEND_RT_VISIBLE_DEVICES='2,3'"
    ):
        visible_npu_index(2, "2,3")


def test_bind_cpus_applies_the_plan(monkeypatch):
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "2,3")
    calls = []
    pools = bind_cpus(
        1,
        mode="topo_affinity",
        info_text=A2_INFO,
        topo_text=A2_TOPO,
        available=range(16),
        numa_nodes=NUMA,
        setaffinity=lambda pid, cpus: calls.append((pid, cpus)),
    )
    assert pools == CpuPools(main=[12, 13, 14, 15], poll=[])
    assert calls == [(0, {12, 13, 14, 15})]


def _bind(mode, rank=1, **kw):
    calls = []
    pools = bind_cpus(
        rank,
        mode=mode,
        info_text=A2_INFO,
        topo_text=kw.pop("topo_text", A2_TOPO),
        available=kw.pop("available", range(16)),
        numa_nodes=NUMA,
        setaffinity=lambda pid, cpus: calls.append(cpus),
        **kw,
    )
    return pools, calls


def test_average_mode_ignores_topology(monkeypatch):
    monkeypatch.delenv("ASCEND_RT_VISIBLE_DEVICES", raising=False)
    # NPU 1's node is 0-7, but average mode splits 0..11 over 4 NPUs in order; no topo text is read
    pools, calls = _bind("average", available=range(12), topo_text="not npu-smi output")
    assert pools == CpuPools(main=[3, 4, 5], poll=[]) and calls == [{3, 4, 5}]


def test_ascend_950_pools_reserve_poll_cpus(monkeypatch):
    monkeypatch.delenv("ASCEND_RT_VISIBLE_DEVICES", raising=False)
    pools, calls = _bind("cpu_pools_950", rank=2, poll_cpus=2)
    assert pools == CpuPools(main=[8, 9], poll=[10, 11]) and calls == [{8, 9}]
    assert build_ascend_950_cpu_pools([5, 3, 4, 6]) == CpuPools(main=[3, 4, 5], poll=[6])
    with pytest.raises(CpuBindingError) as info:
        build_ascend_950_cpu_pools([0, 1], poll_cpus=2)
    assert (
        str(info.value)
        == "an Ascend 950 CPU pool needs more than poll_cpus=2 CPUs (>= 1) per rank, got 2: 0-1"
    )


def test_none_mode_binds_nothing_and_unknown_mode_is_an_error():
    pools, calls = _bind("none")
    assert pools is None and calls == []
    with pytest.raises(CpuBindingError) as info:
        _bind("numa")
    assert (
        str(info.value)
        == "CPU binding mode 'numa' is unknown; allowed: none, average, topo_affinity, cpu_pools_950"
    )


def test_mode_defaults_to_the_device_profile(monkeypatch):
    from vllm_ascend.core.device.config import clear_device_caches

    monkeypatch.setenv("VLLM_ASCEND_DEVICE", "reference")  # the reference profile does not bind
    clear_device_caches()
    try:
        assert bind_cpus(0, info_text=A2_INFO, setaffinity=lambda pid, cpus: pytest.fail("bound")) is None
    finally:
        clear_device_caches()


def test_bind_cpus_warns_and_returns_none_when_refused(monkeypatch, caplog):
    monkeypatch.delenv("ASCEND_RT_VISIBLE_DEVICES", raising=False)

    def refuse(pid, cpus):
        raise PermissionError(1, "Operation not permitted")

    caplog.set_level("WARNING", logger="vllm_ascend")
    import logging

    logging.getLogger("vllm_ascend").propagate = True
    try:
        result = bind_cpus(
            0,
            mode="topo_affinity",
            info_text=A2_INFO,
            topo_text=A2_TOPO,
            available=range(16),
            numa_nodes=NUMA,
            setaffinity=refuse,
        )
    finally:
        logging.getLogger("vllm_ascend").propagate = False
    assert result is None
    assert "CPU binding of rank 0 to CPUs 0-3 refused: [Errno 1] Operation not permitted" in caplog.text


def test_bind_cpus_rejects_a_rank_beyond_the_listed_npus(monkeypatch):
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "7")
    with pytest.raises(
        CpuBindingError, match="NPU 7 \\(local rank 0\\) is not among the 4 NPUs npu-smi lists"
    ):
        bind_cpus(
            0,
            mode="topo_affinity",
            info_text=A2_INFO,
            topo_text=A2_TOPO,
            available=range(16),
            numa_nodes=NUMA,
        )


def test_bind_cpus_really_sets_affinity_within_the_current_set(monkeypatch):
    import os

    monkeypatch.delenv("ASCEND_RT_VISIBLE_DEVICES", raising=False)
    before = os.sched_getaffinity(0)
    topo = "      NPU0  CPU Affinity\nNPU0  X     " + format_cpu_list(before) + "\n"
    info = "| 0     910B3               | OK   |\n| 0                         | 0000:C1:00.0  | 0 |\n"
    try:
        pools = bind_cpus(0, mode="topo_affinity", info_text=info, topo_text=topo, numa_nodes={})
        assert pools.main == sorted(before)
        assert os.sched_getaffinity(0) == set(pools.main)
    finally:
        os.sched_setaffinity(0, before)


def test_missing_npu_smi_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("VLLM_ASCEND_NPU_SMI", "/nonexistent/npu-smi")
    with pytest.raises(
        CpuBindingError, match=r"`/nonexistent/npu-smi info` failed: .*set VLLM_ASCEND_NPU_SMI"
    ):
        bind_cpus(0, mode="topo_affinity")


def test_read_numa_nodes_from_a_sysfs_tree(tmp_path):
    for node, cpus in {0: "0-3", 1: "4-7,16"}.items():
        (tmp_path / f"node{node}").mkdir()
        (tmp_path / f"node{node}" / "cpulist").write_text(cpus + "\n")
    (tmp_path / "possible").write_text("0-1\n")
    assert read_numa_nodes(str(tmp_path)) == {0: [0, 1, 2, 3], 1: [4, 5, 6, 7, 16]}
    assert read_numa_nodes(str(tmp_path / "missing")) == {}


@pytest.mark.parametrize(("machine", "arm"), [("aarch64", True), ("arm64", True), ("x86_64", False)])
def test_is_arm_cpu(monkeypatch, machine, arm):
    import platform

    from vllm_ascend.core.cpu_binding import is_arm_cpu

    monkeypatch.setattr(platform, "machine", lambda: machine)
    assert is_arm_cpu() is arm
