"""FlashLB quality on upstream's policy-test shape (the default policy on held-out windows: test_policy_heldout)."""

from __future__ import annotations

import numpy as np

from vllm_ascend.eplb import FlashLB
from vllm_ascend.eplb.placement import generate_global_placement
from vllm_ascend.eplb.policy import flashlb as flashlb_module
from vllm_ascend.eplb.policy.packing import imbalance, logical_load, moved_slots, slot_weights
from vllm_ascend.eplb.validation import valid_layers

LAYERS, RANKS, SLOTS, EXPERTS = 58, 32, 9, 256  # upstream vllm-ascend's policy-test shape


def _upstream_case(steps: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A shuffled valid ``[58, 32, 9]`` table (256 experts + 32 replicas) and per-slot loads
    ``U(0,1)^10`` for ``steps`` steps, as upstream's policy test draws them."""
    rng = np.random.default_rng(seed)
    table = generate_global_placement(EXPERTS, RANKS, RANKS * SLOTS - EXPERTS, LAYERS)
    for layer in table:
        while True:
            shuffled = rng.permutation(layer.ravel()).reshape(RANKS, SLOTS)
            if all(len(set(r.tolist())) == SLOTS for r in shuffled):
                layer[:] = shuffled
                break
    return table, rng.random((steps, LAYERS, RANKS, SLOTS)) ** 10


def _judge(table: np.ndarray, steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per layer: max/mean of the summed load, and the mean over steps of the per-step max/mean."""
    return imbalance(table, steps.sum(axis=0)), np.stack([imbalance(table, s) for s in steps]).mean(axis=0)


def test_flashlb_on_upstream_shape_uses_the_whole_history_and_never_loses():
    table, work = _upstream_case(steps=40, seed=3)
    steps = logical_load(table, work, EXPERTS)
    changed, priority, new = FlashLB().rebalance_experts(table, work)
    assert changed and valid_layers(table, new, EXPERTS).all()
    assert np.all(moved_slots(table, new) <= 0.3 * RANKS * SLOTS)
    summed_in, step_in = _judge(table, steps)
    summed_out, step_out = _judge(new, steps)
    assert summed_in.mean() > 1.15  # the input is unbalanced on the history
    assert summed_out.mean() <= 1.10  # upstream's bar, on the whole history
    # no layer is worse than its input on the data the policy saw, by either measure
    assert np.all(summed_out <= summed_in + 1e-12) and np.all(step_out <= step_in + 1e-12)
    assert step_out.mean() < step_in.mean()
    differs = (new != table).any(axis=(1, 2))
    assert set(priority.tolist()) == set(np.flatnonzero(differs).tolist())
    # fitted on the last 16 steps only, the plan is far worse on the whole history
    last = FlashLB({"window": 16}).rebalance_experts(table, work[-16:])[2]
    assert _judge(last, steps)[0].mean() > summed_out.mean() + 0.02


def test_flashlb_window_keeps_every_sample_of_the_latest_call():
    table, work = _upstream_case(steps=20, seed=0)
    policy = FlashLB({"window": 4})
    policy.rebalance_experts(table[:2], work[:, :2])
    assert len(policy.window) == 20  # a longer history than the window is used entirely
    policy.rebalance_experts(table[:2], work[:3, :2])
    assert len(policy.window) == 4  # later calls slide the window


def test_flashlb_returns_the_input_when_nothing_improves(monkeypatch):
    # already balanced: nothing to search, changed is false and the input comes back
    table = np.array([[[0, 1], [2, 3]]])
    work = np.stack([slot_weights(table, np.full((1, 4), 10.0 + k)) for k in range(8)])
    changed, priority, new = FlashLB().rebalance_experts(table, work)
    assert not changed and priority.size == 0 and np.array_equal(new, table)

    # a search that only proposes worse plans: every layer keeps its input
    table, work = _upstream_case(steps=10, seed=1)
    table, work = table[:4], work[:, :4]
    worse = table.copy()
    worse[:, [0, 1]] = worse[:, [1, 0]]  # same rank contents: kept by keep_slots below
    swapped = table.copy()
    swapped[:, 0, 0], swapped[:, 1, 0] = table[:, 1, 0], table[:, 0, 0]

    def only_worse(self, tbl, mu, var, horizon, n):
        load = mu
        before = imbalance(tbl, load)
        plans = np.where((imbalance(swapped, load) > before)[:, None, None], swapped, tbl)
        return [plans], [(plans != tbl).any(axis=(1, 2))], load

    monkeypatch.setattr(flashlb_module.FlashLB, "candidates", only_worse)
    assert not flashlb_module.not_worse(table, swapped, logical_load(table, work, EXPERTS)).all()
    changed, priority, new = FlashLB().rebalance_experts(table, work)
    assert not changed and priority.size == 0 and np.array_equal(new, table)
