"""Worker, policy process, the EPLB schedule with the in-process mover, and D2D moves over gloo."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from vllm_ascend.eplb import EplbConfig, EplbProcess, EplbUpdator, EplbWorker, LocalWeightMover
from vllm_ascend.eplb.expert_map_file import expert_file_to_tensor
from vllm_ascend.eplb.placement import generate_global_placement
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
def test_d2d_mover_moves_weights_bitwise_over_gloo(tmp_path, world):
    results = _run_job("d2d", world, tmp_path)
    assert all(r["checked"] == 3 * (8 + world) // world for r in results)
    assert sum(r["received"] for r in results) == results[0]["changed"] > 0


def test_schedule_with_d2d_mover_over_gloo(tmp_path):
    results = _run_job("updator", 2, tmp_path)
    for r in results:
        # the first plan (window of steps 2-4, taken at step 6) moves 3 layers, one per forward; later
        # plans on the balanced placement change nothing
        assert r["rebalances"] == 1 and r["first_step"] == 9 and not r["last_plan_changed"]
        assert r["matches_offline_plan"] and r["end"] < r["start"]
        assert r["checked"] == 3 * 5


LAYERS, EXPERTS, RANKS, SLOTS = 2, 4, 2, 3
HOT = np.array([[1.0, 5.0, 10.0, 50.0]] * LAYERS)  # logical tokens per forward


def canonical(layer: int, expert: int) -> torch.Tensor:
    return torch.full((3, 2), float(layer * 100 + expert))


class HostLayer:
    """Every rank's slots of one MoE layer in this process (physical slot ``rank * slots + slot``)."""

    def __init__(self, layer: int, rank_table: np.ndarray) -> None:
        self.w13 = torch.stack([canonical(layer, int(e)) for e in rank_table.reshape(-1)])
        self.w2 = -self.w13.clone()
        self.moe_load = torch.zeros(rank_table.size, dtype=torch.int64)
        self.placement: np.ndarray | None = None

    def expert_weights(self) -> list[torch.Tensor]:
        return [self.w13, self.w2]

    def set_placement(self, rank_table: np.ndarray) -> None:
        self.placement = rank_table.copy()


def _schedule(**options) -> tuple[EplbUpdator, np.ndarray]:
    config = EplbConfig(dynamic_eplb=True, eplb_policy_type="default", **options)
    schedule = EplbUpdator(config, LocalWeightMover(), EplbProcess("default", mode="thread"))
    table = generate_global_placement(EXPERTS, RANKS, RANKS * SLOTS - EXPERTS, LAYERS)
    for li in range(LAYERS):
        schedule.register(HostLayer(li, table[li]))
    schedule.start(table)
    return schedule, table


def _forward(schedule: EplbUpdator, phase: str) -> None:
    """Route HOT over the layers' current placements, then end the forward."""
    for li, layer in enumerate(schedule.layers):
        load = slot_weights(layer.placement[None], HOT[li : li + 1])[0].reshape(-1)
        layer.moe_load += torch.as_tensor(np.rint(load * 10), dtype=torch.int64)
    schedule.forward_end(phase)


def test_local_schedule_warmup_phase_record_and_layer_by_layer_moves(tmp_path):
    record = tmp_path / "placement.json"
    schedule, initial = _schedule(
        expert_heat_collection_interval=3,
        algorithm_execution_interval=2,
        num_warmup_iterations=1,
        load_collection_phase="decode",
        expert_map_record_path=str(record),
    )
    assert [layer.placement.tolist() for layer in schedule.layers] == initial.tolist()
    one = np.stack([slot_weights(initial[li : li + 1], HOT[li : li + 1])[0] for li in range(LAYERS)]) * 10
    _forward(schedule, "decode")  # step 1: warm-up, not recorded
    assert not schedule.load.any() and not any(layer.moe_load.any() for layer in schedule.layers)
    _forward(schedule, "prefill")  # step 2: other phase, counted in the window but not recorded
    _forward(schedule, "decode")  # step 3
    assert np.allclose(schedule.load.reshape(initial.shape), np.rint(one))
    _forward(schedule, "decode")  # step 4: window full (3 forwards) -> submitted
    assert schedule.submitted_at == 4 and not schedule.load.any() and not record.exists()
    _forward(schedule, "decode")  # step 5: the policy runs meanwhile
    assert schedule.submitted_at == 4 and not record.exists()
    _forward(schedule, "decode")  # step 6: plan taken, recorded, first layer move started
    plan = schedule.last_plan
    assert plan is not None and plan.changed and schedule.submitted_at is None
    expected = EplbWorker("default").do_update(initial, np.rint(one) * 2)
    assert np.array_equal(plan.new_table, expected.new_table)
    assert np.array_equal(expert_file_to_tensor(record)[0].numpy(), plan.new_table)
    moved = [u.layer_id for u in plan.updates]
    assert schedule.mover.busy and schedule.layers[moved[0]].placement.tolist() == initial[moved[0]].tolist()
    for step, layer_id in enumerate(moved, start=7):  # one layer switches per forward
        _forward(schedule, "decode")
        assert schedule.layers[layer_id].placement.tolist() == plan.new_table[layer_id].tolist()
        assert schedule.step == step
    assert not schedule.busy and schedule.rebalances[0][0] == 6 + len(moved)
    for li, layer in enumerate(schedule.layers):
        for slot, expert in enumerate(plan.new_table[li].reshape(-1)):
            assert torch.equal(layer.w13[slot], canonical(li, int(expert)))
            assert torch.equal(layer.w2[slot], -canonical(li, int(expert)))
    assert imbalance(plan.new_table, HOT).max() < imbalance(initial, HOT).max()
    schedule.shutdown()


def test_a_window_without_matching_batches_submits_nothing():
    schedule, initial = _schedule(expert_heat_collection_interval=2, load_collection_phase="prefill")
    for _ in range(5):
        _forward(schedule, "decode")
    assert schedule.process.pending == 0 and schedule.submitted_at is None and not schedule.rebalances
    assert [layer.placement.tolist() for layer in schedule.layers] == initial.tolist()
    schedule.shutdown()


def test_static_schedule_keeps_running_totals_and_checks_its_inputs():
    schedule = EplbUpdator(EplbConfig(), LocalWeightMover())
    layer = HostLayer(0, np.array([[0, 1], [2, 3]]))
    schedule.register(layer)
    with pytest.raises(RuntimeError, match=r"start\(\) must run before"):
        schedule.forward_end()
    with pytest.raises(ValueError, match="the placement has 2 layers; 1 MoE layers registered"):
        schedule.start(np.zeros((2, 2, 2), dtype=np.int64) + np.array([[0, 1], [2, 3]]))
    schedule.start(np.array([[[0, 1], [2, 3]]]))
    with pytest.raises(RuntimeError, match="registered before the placement starts"):
        schedule.register(HostLayer(1, np.array([[0, 1], [2, 3]])))
    for _ in range(3):
        layer.moe_load += torch.tensor([1, 2, 3, 4])
        schedule.forward_end()
    assert schedule.process is None and schedule.step == 3 and layer.moe_load.tolist() == [3, 6, 9, 12]


def test_relayout_moves_weights_written_in_another_layout_back_into_the_placement():
    """A weight update writes layer 0's experts laid out as another table (the slots reversed): ``relayout``
    moves each back to the slot the placement gives it, weights and routing maps consistent again; ``settle``
    with nothing in flight changes nothing."""
    schedule, table = _schedule()
    layer = schedule.layers[0]
    laid = table[0].reshape(-1)[::-1].reshape(table[0].shape).copy()
    layer.w13.copy_(torch.stack([canonical(0, int(e)) for e in laid.reshape(-1)]))
    layer.w2.copy_(-layer.w13)
    pointers = [w.data_ptr() for w in layer.expert_weights()]
    schedule.settle()
    schedule.relayout(0, laid)
    assert layer.placement.tolist() == table[0].tolist()
    assert [w.data_ptr() for w in layer.expert_weights()] == pointers
    for slot, expert in enumerate(table[0].reshape(-1)):
        assert torch.equal(layer.w13[slot], canonical(0, int(expert)))
        assert torch.equal(layer.w2[slot], -canonical(0, int(expert)))
    schedule.relayout(0, table[0])  # already laid out as the placement: nothing moves
    assert not schedule.mover.busy
    schedule.shutdown()
