"""The package surface: lazy public names, registrations, no vLLM import."""

from __future__ import annotations

import subprocess
import sys

import pytest

import vllm_ascend.eplb as eplb


def test_public_names_resolve():
    for name in eplb.__all__:
        assert getattr(eplb, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        eplb.nope  # noqa: B018


def test_extension_registers_the_config_validator_and_the_schedule():
    from vllm_ascend.core.registry import CONFIG_SECTIONS, MOE_PLACEMENTS, registering_as
    from vllm_ascend.eplb._extension import EXTENSION, register
    from vllm_ascend.eplb.schedule import schedule_for

    with registering_as("vllm-ascend-eplb"):  # as core's extension loader does
        register()
        register()
    assert CONFIG_SECTIONS.get("eplb_config") is eplb.validate_eplb_config
    assert CONFIG_SECTIONS.owner("eplb_config") == "vllm-ascend-eplb"
    assert MOE_PLACEMENTS.get("default") is schedule_for
    assert MOE_PLACEMENTS.owner("default") == "vllm-ascend-eplb"
    assert EXTENSION.provides == ("config_sections", "moe_placements")


def test_policy_registry_resolves_the_builtin_table():
    from vllm_ascend.eplb.policy.factory import BUILTIN_POLICIES, POLICY_NAMES_BY_CODE

    for name, (code, path) in BUILTIN_POLICIES.items():
        cls = eplb.EPLB_POLICIES.get(name)
        assert cls is getattr(eplb, path.rsplit(":", 1)[1]) and issubclass(cls, eplb.EplbPolicy)
        assert POLICY_NAMES_BY_CODE[code] == name and eplb.EPLB_POLICIES.owner(name) == "vllm-ascend-eplb"
    assert sorted(POLICY_NAMES_BY_CODE) == [0, 1, 2, 3]


def test_policies_import_without_vllm():
    code = (
        "import sys, numpy as np; import vllm_ascend.eplb as e; "
        "p = e.PolicyFactory.generate_policy('flashlb'); "
        "p.rebalance_experts(np.array([[[0, 1], [2, 3]]]), np.ones((1, 2, 2))); "
        "assert not any(m == 'vllm' or m.startswith('vllm.') for m in sys.modules), 'vllm imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_factory_works_after_core_loaded_the_extension():
    import subprocess
    import sys

    code = (
        "from vllm_ascend.core.extensions import load_extensions\n"
        "assert load_extensions()['eplb'].status.value == 'loaded'\n"
        "from vllm_ascend.eplb import PolicyFactory\n"
        "print(type(PolicyFactory.generate_policy('swift')).__name__, type(PolicyFactory.generate_policy(3)).__name__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["SwiftBalanceEplb", "FlashLB"]


def test_submit_copies_the_workload():
    import numpy as np

    from vllm_ascend.eplb import EplbProcess

    proc = EplbProcess("default", mode="thread")
    table = np.array([[[0, 1], [2, 3]]])
    load = np.array([[[6.0, 2.0], [1.0, 1.0]]])
    proc.submit(table, load)
    load[:] = 0  # the caller reuses its buffer at once, as EplbUpdator does
    plan = proc.get(timeout=30)
    assert plan is not None and plan.imbalance_before[0] > 1.5


def test_schedule_over_several_expert_parallel_ranks(monkeypatch, tmp_path):
    """Each process is one rank: no schedule unless eplb_config asks for one; then weights move between
    ranks (D2D over the expert-parallel group) and only rank 0 runs the policy process."""
    from types import SimpleNamespace

    import torch.distributed as dist

    from vllm_ascend.eplb import schedule
    from vllm_ascend.eplb.config import EplbConfig
    from vllm_ascend.eplb.movers import D2DWeightMover, LocalWeightMover

    monkeypatch.setattr(schedule, "get_section", lambda name: EplbConfig())
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/rdzv", rank=0, world_size=1)
    try:
        group = SimpleNamespace(world_size=2, device_group=dist.group.WORLD, cpu_group=dist.group.WORLD)
        assert schedule.schedule_for(object(), group) is None
        config = EplbConfig()  # any weak-referenceable object stands for the vLLM config
        one = schedule.schedule_for(config, None)
        assert isinstance(one.mover, LocalWeightMover) and schedule.schedule_for(config, None) is one
        monkeypatch.setattr(schedule, "get_section", lambda name: EplbConfig(dynamic_eplb=True))
        vllm_config = EplbConfig()
        ranks = schedule.schedule_for(vllm_config, group)
        assert isinstance(ranks.mover, D2DWeightMover) and ranks.mover.rank == 0
        assert ranks.process is not None  # rank 0 plans
        ranks.shutdown()
    finally:
        dist.destroy_process_group()
