"""Worker, process, D2D weight moves over gloo, the updator lifecycle, controller and metrics."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from vllm_ascend.eplb import AscendEPLBController, EplbMetrics, EplbProcess, EplbUpdator, EplbWorker
from vllm_ascend.eplb.adaptor import VllmEplbAdaptor, unwrap_moe
from vllm_ascend.eplb.config import EplbSettings, init_eplb_config
from vllm_ascend.eplb.policy.packing import imbalance, slot_weights
from vllm_ascend.eplb.validation import EplbInputError
from vllm_ascend.eplb.worker import Transfer, compose_layer_transfers

JOB = Path(__file__).with_name("dist_job.py")


def _run_job(mode: str, world: int, tmp_path: Path) -> list[dict]:
    proc = subprocess.run(
        [sys.executable, str(JOB), mode, str(world), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]


def test_compose_transfers_exact():
    old = np.array([[0, 1, 2], [3, 4, 0]])
    new = np.array([[0, 4, 2], [3, 1, 0]])
    assert compose_layer_transfers(old, new) == (Transfer(4, 1, 1, 0, 1), Transfer(1, 0, 1, 1, 1))
    # a new replica of expert 0 is fed by the holder that has sent least so far
    old = np.array([[0, 1], [2, 3], [0, 4]])
    new = np.array([[0, 1], [2, 0], [3, 4]])
    assert compose_layer_transfers(old, new) == (Transfer(0, 0, 0, 1, 1), Transfer(3, 1, 1, 2, 0))


def test_worker_plan_sums_loads_and_reports_hotness():
    table = np.array([[[0, 1], [2, 3]]])
    per_rank = np.array([[[6.0, 4.0]], [[1.0, 1.0]]])  # [ranks, layers, slots]
    workload = EplbWorker.fetch_and_sum_load_info(np.stack([per_rank, per_rank]))  # two windows
    assert workload.tolist() == [[[12.0, 8.0], [2.0, 2.0]]]
    plan = EplbWorker("default").do_update(table, workload)
    assert plan.changed and [u.layer_id for u in plan.updates] == [0]
    assert plan.hotness.tolist() == [[0.5, 1 / 3, 1 / 12, 1 / 12]]
    assert plan.imbalance_before.tolist() == [20 / 12] and plan.imbalance_after.tolist() == [14 / 12]
    assert plan.new_table.tolist() == [[[0, 3], [2, 1]]]
    assert sorted(t.expert for t in plan.updates[0].transfers) == [1, 3]
    with pytest.raises(EplbInputError, match="loads must be"):
        EplbWorker.fetch_and_sum_load_info(np.ones(3))


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_eplb_process_matches_in_process_worker_and_reports_errors(mode):
    rng = np.random.default_rng(0)
    table = np.stack([rng.permutation(16).reshape(4, 4) for _ in range(3)])
    workload = rng.random((3, 4, 4)) ** 4 * 100
    proc = EplbProcess("swift", {"max_move_fraction": 0.5}, mode=mode)
    assert proc.mode == mode
    try:
        proc.submit(table, workload)
        plan = proc.get(timeout=120)
        local = EplbWorker("swift", {"max_move_fraction": 0.5}).do_update(table, workload)
        assert np.array_equal(plan.new_table, local.new_table) and plan.changed == local.changed
        assert proc.get(timeout=0) is None
        proc.submit(table, -workload)
        with pytest.raises(RuntimeError, match="negative load"):
            proc.get(timeout=120)
    finally:
        proc.shutdown()
    with pytest.raises(EplbInputError, match="mode must be"):
        EplbProcess("swift", mode="fork")


@pytest.mark.parametrize("world", [2, 4])
def test_d2d_moves_weights_bitwise_over_gloo(tmp_path, world):
    results = _run_job("d2d", world, tmp_path)
    assert all(r["checked"] == 3 * (8 + world) // world for r in results)
    assert sum(r["received"] for r in results) == results[0]["changed"] > 0


def test_updator_lifecycle_over_gloo(tmp_path):
    results = _run_job("updator", 2, tmp_path)
    for r in results:
        # one plan moves weights; later plans on the balanced placement change nothing
        assert r["plans"] >= 2 and r["applied"] == 1 and r["matches_offline_plan"]
        assert r["end"] < r["start"]
        assert r["checked"] == 3 * 5


class _Layer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w13_weight = torch.nn.Parameter(torch.zeros(2, 4, 2), requires_grad=False)
        self.w2_weight = torch.nn.Parameter(torch.zeros(2, 2, 2), requires_grad=False)
        self.expert_map = torch.full((2,), -1, dtype=torch.int32)
        self.log2phy = torch.zeros(2, dtype=torch.int64)
        self.moe_load = torch.zeros(2, dtype=torch.int64)


class _Wrapper(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.experts = _Layer()


def test_adaptor_and_controller_phase_filtering():
    wrapped = _Wrapper()
    assert unwrap_moe(wrapped) is wrapped.experts
    with pytest.raises(TypeError, match="not an EPLB-capable MoE layer"):
        unwrap_moe(torch.nn.Linear(2, 2))
    adaptor = VllmEplbAdaptor()
    adaptor.register_layer(wrapped)
    cfg = {"load_collection_phase": "decode", "expert_heat_collection_interval": 100}
    init = init_eplb_config(cfg, num_experts=2, num_ranks=1, num_layers=1)
    updator = EplbUpdator(
        EplbSettings.from_any(cfg), adaptor, init.global_table, process=EplbProcess("default")
    )
    controller = AscendEPLBController(updator)
    wrapped.experts.expert_map.fill_(-1)
    controller.setup_from_mapping(init)
    assert wrapped.experts.expert_map.tolist() == [0, 1] and wrapped.experts.log2phy.tolist() == [0, 1]
    for prefill, decode, load in [(5, 0, [7, 1]), (0, 3, [2, 2]), (1, 3, [9, 9]), (0, 1, [1, 0])]:
        controller.set_batch_phase(prefill, decode)
        controller.prepare_forward()
        wrapped.experts.moe_load.copy_(torch.tensor(load))
        controller.finish_forward()
    assert updator.load.tolist() == [[3.0, 2.0]] and updator.step == 4  # only decode batches recorded
    controller.prepare_forward(dummy_run=True)
    wrapped.experts.moe_load.copy_(torch.tensor([50, 50]))
    controller.finish_forward(dummy_run=True)
    assert updator.load.tolist() == [[3.0, 2.0]] and updator.step == 4  # dummy runs never count
    with pytest.raises(EplbInputError, match="load_collection_phase must be one of"):
        AscendEPLBController(updator, phase="mixed")
    updator.shutdown()


def test_metrics_handler_publishes_rank0_hotness():
    import prometheus_client as prometheus  # an optional runtime dependency; the test group installs it

    registry = prometheus.CollectorRegistry()
    metrics = EplbMetrics(registry)
    table = np.array([[[0, 1], [2, 3]]])
    plan = EplbWorker("default").do_update(table, slot_weights(table, np.array([[6.0, 2.0, 1.0, 1.0]])))
    metrics.eplb_do_update_hotness_handler(plan, rank=1)
    assert metrics.updates == 0
    metrics.eplb_do_update_hotness_handler(plan, rank=0)
    assert metrics.updates == 1
    assert registry.get_sample_value("vllm_ascend_eplb_expert_hotness", {"layer": "0", "expert": "0"}) == 0.6
    assert registry.get_sample_value("vllm_ascend_eplb_imbalance", {"layer": "0"}) == pytest.approx(8 / 5)
    assert np.isclose(imbalance(table, np.array([[6.0, 2.0, 1.0, 1.0]]))[0], 8 / 5)
