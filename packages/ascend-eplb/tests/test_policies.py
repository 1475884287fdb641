"""Policies: exact small cases, invariants on many random and skewed traces, rejection of bad plans."""

from __future__ import annotations

import numpy as np
import pytest

from vllm_ascend.eplb import DefaultEplb, EplbInputError, FlashLB, PolicyFactory, RandomLoadBalance
from vllm_ascend.eplb.placement import generate_global_placement
from vllm_ascend.eplb.policy.base import EplbPolicy
from vllm_ascend.eplb.policy.packing import imbalance, moved_slots, rank_loads, slot_weights
from vllm_ascend.eplb.validation import valid_layers


def _check_plan(old: np.ndarray, new: np.ndarray, n: int) -> None:
    assert new.shape == old.shape and new.dtype == np.int64
    assert valid_layers(old, new, n).all()
    for layer in new:
        assert set(layer.ravel().tolist()) == set(range(n))
        for rank in layer:
            assert len(set(rank.tolist())) == len(rank)


def _trace(rng: np.random.Generator, skewed: bool):
    ranks = int(rng.choice([2, 3, 4, 8]))
    slots = int(rng.integers(2, 7))
    total = ranks * slots
    n = int(rng.integers(max(2, total - ranks * 2), total + 1))
    n = max(n, slots)  # a rank must be fillable with distinct experts
    layers = int(rng.integers(1, 4))
    if skewed:
        alpha = rng.uniform(0.5, 1.5)
        load = np.stack([rng.permutation(1.0 / np.arange(1, n + 1) ** alpha) for _ in range(layers)]) * 1000
    else:
        load = rng.random((layers, n)) * 100
    load[rng.random(load.shape) < 0.05] = 0.0
    table = generate_global_placement(n, ranks, total - n, layers)
    shuffled = np.stack([rng.permutation(t.ravel()).reshape(t.shape) for t in table])
    if all(len(set(r.tolist())) == len(r) for t in shuffled for r in t):
        table = shuffled
    return table, load, n


@pytest.mark.parametrize("name", ["random", "default", "swift", "flashlb"])
def test_invariants_on_random_and_skewed_traces(name):
    rng = np.random.default_rng(1234)
    for i in range(200):
        table, load, n = _trace(rng, skewed=i % 2 == 1)
        policy = PolicyFactory.generate_policy(name, {"seed": 7} if name == "random" else {})
        before = imbalance(table, load)
        changed, priority, new = policy.rebalance_experts(table, slot_weights(table, load))
        _check_plan(table, new, n)
        assert set(priority.tolist()) <= set(range(table.shape[0]))
        after = imbalance(new, load)
        if name in ("swift", "flashlb"):
            # incremental policies never make a layer worse and stay within the move budget
            assert np.all(after <= before + 1e-9)
            assert np.all(moved_slots(table, new) <= 0.3 * table[0].size)
        if name == "default":
            peak_new, peak_old = (rank_loads(t, load).max(axis=1) for t in (new, table))
            # a layer changes only when its peak drops; changed only when the summed peak drops
            differs = (new != table).any(axis=(1, 2))
            assert np.all(peak_new[differs] < peak_old[differs])
            assert changed == bool(peak_new.sum() < peak_old.sum())


def test_default_reaches_lower_bound_on_uniform_loads():
    rng = np.random.default_rng(0)
    load = rng.uniform(50, 100, size=(4, 64))
    table = generate_global_placement(64, 8, 0, 4)
    _, _, new = DefaultEplb().rebalance_experts(table, slot_weights(table, load))
    ratio = rank_loads(new, load).max(axis=1) / (load.sum(axis=1) / 8)
    assert np.all(ratio < 1.01)


def test_default_exact_small_cases():
    table = np.array([[[0, 1], [2, 3]]])
    changed, priority, new = DefaultEplb().rebalance_experts(table, np.array([[[10.0, 10.0], [1.0, 1.0]]]))
    assert changed and priority.tolist() == [0]
    assert new.tolist() == [[[0, 2], [1, 3]]]
    # one redundant slot goes to the hot expert; its replicas land on different ranks
    table = np.array([[[0, 1], [2, 0]]])  # expert 0 already has two copies
    load = np.array([[[15.0, 1.0], [1.0, 15.0]]])
    changed, _, new = DefaultEplb().rebalance_experts(table, load)
    assert not changed and new.tolist() == [[[0, 1], [2, 0]]]
    table = np.array([[[0, 1], [2, 1]]])  # expert 1 (cold) has the spare copy, expert 0 is hot
    changed, _, new = DefaultEplb().rebalance_experts(table, np.array([[[30.0, 0.5], [1.0, 0.5]]]))
    assert changed
    assert sorted(map(sorted, new[0].tolist())) == [[0, 1], [0, 2]]
    assert rank_loads(new, np.array([[30.0, 1.0, 1.0]])).tolist() == [[16.0, 16.0]]


def test_default_improvement_threshold():
    # no redundant slots, one hot expert: a re-pack lowers the peak from 10.6 to 10.4 (< 5 %)
    table = np.array([[[0, 1, 2], [3, 4, 5]]])
    load = np.array([[10.0, 0.3, 0.3, 0.25, 0.2, 0.2]])
    work = slot_weights(table, load)
    changed, _, new = DefaultEplb().rebalance_experts(table, work)
    assert changed and new.tolist() == [[[3, 1, 2], [0, 4, 5]]]  # two slots move: 0 and 3 swap ranks
    assert np.allclose(rank_loads(new, load), [[0.85, 10.4]])
    changed, _, _ = DefaultEplb({"improvement_threshold": 0.95}).rebalance_experts(table, work)
    assert not changed  # upstream's rule: 10.4 is not below 0.95 x 10.6
    for bad in (1.5, -0.1, "high"):
        with pytest.raises(EplbInputError, match=r"improvement_threshold.*(\[0\.0, 1\.0\]|must be a float)"):
            DefaultEplb({"improvement_threshold": bad}).rebalance_experts(table, work)


def test_risk_load_and_aggregate_score_values():
    from vllm_ascend.eplb.policy.packing import aggregate_score, risk_load

    # v-bar = (4 + 0) / 2 ranks = 2, beta = z / (2 sqrt(h v-bar)) = 1 / (2 sqrt 2)
    out = risk_load(np.array([[4.0, 4.0]]), np.array([[4.0, 0.0]]), np.array([[1, 1]]), 2, 1.0, 1)
    assert np.allclose(out, [[4 + 4 / (2 * np.sqrt(2)), 4.0]])
    # two ranks, one expert each; per-sample loads (1, 3) and (3, 1): totals 4 and 4, per-sample std 1
    table = np.array([[[0], [1]]])
    samples = np.array([[[1.0, 3.0]], [[3.0, 1.0]]])
    assert np.allclose(aggregate_score(table, samples, 1.0), [(4 + np.sqrt(2)) / 4])
    assert np.allclose(aggregate_score(table, samples, 0.0), [1.0])


def test_flashlb_downsample_keeps_totals():
    from vllm_ascend.eplb.policy.flashlb import downsample

    samples = np.arange(6.0).reshape(6, 1, 1)
    assert downsample(samples, 3).ravel().tolist() == [1.0, 5.0, 9.0]
    assert downsample(samples, 8) is samples


def test_flashlb_puts_more_mean_load_on_steadier_ranks():
    # experts 0, 1 are steady, 2, 3 noisy, all with the same mean: the risk-aware plan pairs a
    # steady with a noisy expert on each rank instead of the two noisy ones together
    rng = np.random.default_rng(0)
    table = np.array([[[0, 1], [2, 3]]])
    mu = np.full(4, 100.0)
    samples = np.stack([mu + np.array([0.0, 0.0, 30.0, 30.0]) * rng.uniform(-1, 1, 4) for _ in range(64)])
    work = np.stack([slot_weights(table, s[None]) for s in samples])
    changed, _, new = FlashLB({"max_move_fraction": 1.0, "window": 64}).rebalance_experts(table, work)
    assert changed and sorted(sorted(r) for r in new[0].tolist()) in ([[0, 2], [1, 3]], [[0, 3], [1, 2]])
    for bad in (-1.0, "x"):
        with pytest.raises(EplbInputError, match="risk_z"):
            FlashLB({"risk_z": bad}).rebalance_experts(table, work)


def test_swift_skips_balanced_layers_and_fixes_skewed_ones():
    table = np.array([[[0, 1], [2, 3]], [[0, 1], [2, 3]]])
    load = np.array([[[5.0, 5.0], [5.0, 5.0]], [[9.0, 8.0], [1.0, 2.0]]])
    changed, priority, new = PolicyFactory.generate_policy(
        "swift", {"max_move_fraction": 0.5}
    ).rebalance_experts(table, load)
    assert changed and priority.tolist() == [1]
    assert new[0].tolist() == [[0, 1], [2, 3]]
    assert rank_loads(new[1:], np.array([[9.0, 8.0, 1.0, 2.0]])).max() == 10.0


def test_flashlb_uses_history_and_risk():
    rng = np.random.default_rng(3)
    table = generate_global_placement(16, 4, 0, 2)
    # experts 0-3 (all on rank 0) are hot on average; history [samples, layers, ranks, slots]
    hist = rng.uniform(0, 2, size=(40, 2, 4, 4))
    hist[:, :, 0, :] += 10
    policy = FlashLB({"window": 64, "max_move_fraction": 0.5})
    changed, _, new = policy.rebalance_experts(table, hist)
    assert changed and len(policy.window) == 40
    load = hist.sum(axis=0)
    assert np.all(imbalance(new, np.stack([load[i].ravel() for i in range(2)])) < 1.1)
    # a single window is appended to the sliding window
    policy.rebalance_experts(new, slot_weights(new, load.reshape(2, 16)) / 40)
    assert len(policy.window) == 41
    with pytest.raises(EplbInputError, match="expert_workload has shape"):
        policy.rebalance_experts(table, hist[:, :, :3])


def test_random_is_seeded_and_valid():
    table = generate_global_placement(12, 3, 3, 2)
    load = np.ones(table.shape)
    a = RandomLoadBalance({"seed": 5}).rebalance_experts(table, load)[2]
    b = RandomLoadBalance({"seed": 5}).rebalance_experts(table, load)[2]
    assert np.array_equal(a, b) and not np.array_equal(a, table)
    _check_plan(table, a, 12)


class _BadPlan(EplbPolicy):
    def __init__(self, plans):
        super().__init__({})
        self.plans = plans

    def plan(self, table, workload, n):
        return self.plans


@pytest.mark.parametrize(
    "bad",
    [
        [[0, 0], [2, 3]],  # expert twice on a rank, expert 1 dropped
        [[0, 2], [2, 3]],  # expert 1 dropped
        [[1, 0], [2, 3]],  # experts move within their rank
        [[0, 1], [2, 9]],  # id out of range
    ],
)
def test_bad_plan_keeps_old_layer(bad):
    table = np.array([[[0, 1], [2, 3]], [[0, 1], [2, 3]]])
    good = [[0, 2], [1, 3]]
    changed, _, new = _BadPlan(np.array([bad, good])).rebalance_experts(table, np.ones((2, 2, 2)))
    assert new[0].tolist() == [[0, 1], [2, 3]]
    assert new[1].tolist() == good and changed


@pytest.mark.parametrize(
    "table, workload, match",
    [
        (np.array([[[0, 1], [2, 3]]]), np.full((1, 2, 2), np.nan), "NaN"),
        (np.array([[[0, 1], [2, 3]]]), -np.ones((1, 2, 2)), "negative load"),
        (np.array([[[0, 1], [2, 3]]]), np.ones((1, 2, 3)), r"expert_workload has shape \(1, 2, 3\)"),
        (
            np.array([[0, 1], [2, 3]]),
            np.ones((2, 2)),
            r"current_expert_table must be .*\[layers, ranks, slots\]",
        ),
        (np.array([[[0, 1], [3, 3]]]), np.ones((1, 2, 2)), "no replica of logical expert 2"),
        (np.array([[[0, 1], [2, -1]]]), np.ones((1, 2, 2)), "negative expert id"),
        (np.array([[[0.5, 1], [2, 3]]]), np.ones((1, 2, 2)), "integer logical expert ids"),
    ],
)
def test_bad_inputs_are_clear_errors(table, workload, match):
    with pytest.raises(EplbInputError, match=match):
        DefaultEplb().rebalance_experts(table, workload)


def test_factory_names_codes_and_errors():
    for code, cls_name in enumerate(["RandomLoadBalance", "DefaultEplb", "SwiftBalanceEplb", "FlashLB"]):
        assert type(PolicyFactory.generate_policy(code)).__name__ == cls_name
    assert isinstance(PolicyFactory.generate_policy("flashlb", {"risk_z": 1.0}), FlashLB)
    allowed = r"allowed: names 'default', 'flashlb', 'random', 'swift' or codes 0 \(random\), 1 \(default\)"
    with pytest.raises(EplbInputError, match=r"unknown EPLB policy 'greedy'; " + allowed):
        PolicyFactory.generate_policy("greedy")
    with pytest.raises(EplbInputError, match=r"unknown EPLB policy 9; " + allowed):
        PolicyFactory.generate_policy(9)
    with pytest.raises(EplbInputError, match="unknown EPLB policy True"):
        PolicyFactory.generate_policy(True)
    with pytest.raises(EplbInputError, match="max_move_fraction"):
        PolicyFactory.generate_policy("swift", {"max_move_fraction": 2.0}).rebalance_experts(
            np.array([[[0, 1], [2, 3]]]), np.array([[[9.0, 9.0], [1.0, 1.0]]])
        )


def test_shift_replicas_moves_copies_to_the_hottest_expert():
    from vllm_ascend.eplb.policy.packing import shift_replicas

    load = np.array([[10.0, 1.0, 1.0, 4.0]])
    counts = np.array([[1, 2, 2, 1]])
    assert shift_replicas(load, counts, np.array([1]), 4).tolist() == [[2, 1, 2, 1]]
    assert shift_replicas(load, counts, np.array([5]), 4).tolist() == [[3, 1, 1, 1]]
    # no move once the largest per-replica load cannot drop
    assert shift_replicas(np.array([[4.0, 4.0]]), np.array([[2, 2]]), np.array([3]), 4).tolist() == [[2, 2]]


def test_flashlb_with_a_full_budget_matches_a_fresh_packing():
    rng = np.random.default_rng(5)
    load = np.stack([rng.permutation(1.0 / np.arange(1, 33)) for _ in range(4)]) * 1e4
    table = generate_global_placement(32, 8, 8, 4)
    samples = np.stack([slot_weights(table, load * rng.uniform(0.9, 1.1, load.shape)) for _ in range(8)])
    _, _, flash = FlashLB({"max_move_fraction": 1.0}).rebalance_experts(table, samples)
    _, _, default = DefaultEplb().rebalance_experts(table, samples.sum(axis=0))
    assert np.all(imbalance(flash, load) < 1.05)
    assert imbalance(flash, load).mean() <= imbalance(default, load).mean() + 0.02


def test_repack_extremes_keeps_valid_plans_within_budget():
    from vllm_ascend.eplb.policy.packing import rank_loads, repack_extremes

    rng = np.random.default_rng(11)
    improved = 0
    for _ in range(100):
        table, load, n = _trace(rng, skewed=True)
        budget = np.full(table.shape[0], int(rng.integers(0, table[0].size + 1)))
        new, new_w = repack_extremes(table, slot_weights(table, load), n, budget)
        _check_plan(table, new, n)
        assert np.all(moved_slots(table, new) <= budget)
        assert np.allclose(new_w, slot_weights(new, load))
        before, after = rank_loads(table, load).max(axis=1), rank_loads(new, load).max(axis=1)
        assert np.all(after <= before + 1e-9)
        improved += int((after < before - 1e-9).any())
    assert improved > 10


@pytest.mark.parametrize("name", ["swift", "flashlb"])
def test_swap_depth_is_validated(name):
    table = np.array([[[0, 1], [2, 3]]])
    work = np.array([[[9.0, 9.0], [1.0, 1.0]]])
    for bad in (0, 1.5):
        with pytest.raises(EplbInputError, match="swap_depth"):
            PolicyFactory.generate_policy(name, {"swap_depth": bad}).rebalance_experts(table, work)


def test_swap_refine_depth_lowers_the_ranks_below_the_peak():
    from vllm_ascend.eplb.policy.packing import swap_refine

    # rank 0 holds one expert heavier than the mean: no swap lowers it; rank 1 can still swap with rank 2
    table = np.array([[[0, 1], [2, 3], [4, 5]]])
    w = np.array([[[10.0, 0.0], [4.0, 4.0], [0.5, 0.5]]])
    flat, _ = swap_refine(table, w, 6, 10, np.zeros(1), depth=1)
    deep, deep_w = swap_refine(table, w, 6, 10, np.zeros(1), depth=2)
    assert flat.tolist() == table.tolist()
    assert deep_w.sum(axis=2).tolist() == [[10.0, 4.5, 4.5]]
    assert sorted(map(sorted, deep[0, 1:].tolist())) == [[2, 4], [3, 5]] or sorted(
        map(sorted, deep[0, 1:].tolist())
    ) == [[2, 5], [3, 4]]


def test_retarget_replicas_lands_new_copies_on_the_lightest_rank():
    from vllm_ascend.eplb.policy.packing import replica_counts_of, retarget_replicas

    # expert 0 is hot; expert 1 has a surplus copy on ranks 0 and 2. The new copy of 0 must replace
    # the surplus copy on rank 2 (light partners), not the one on rank 0 next to the other hot copy.
    table = np.array([[[0, 1, 2], [3, 4, 5], [6, 1, 7]]])
    load = np.array([[60.0, 2.0, 9.0, 1.0, 1.0, 1.0, 1.0, 1.0]])
    target = np.array([[2, 1, 1, 1, 1, 1, 1, 1]])
    new, w = retarget_replicas(table, load, target, np.array([5]))
    _check_plan(table, new, 8)
    assert new.tolist() == [[[0, 1, 2], [3, 4, 5], [6, 0, 7]]]
    assert replica_counts_of(new, 8).tolist() == target.tolist()
    assert np.allclose(w, slot_weights(new, load))
    # no budget: nothing changes
    assert retarget_replicas(table, load, target, np.array([0]))[0].tolist() == table.tolist()


def test_retarget_replicas_stays_within_budget_on_random_traces():
    from vllm_ascend.eplb.policy.packing import replica_counts, replica_counts_of, retarget_replicas

    rng = np.random.default_rng(3)
    for _ in range(100):
        table, load, n = _trace(rng, skewed=True)
        _, ranks, slots = table.shape
        target = replica_counts(load, ranks * slots, ranks)
        budget = np.full(table.shape[0], int(rng.integers(0, table[0].size + 1)))
        new, _ = retarget_replicas(table, load, target, budget)
        _check_plan(table, new, n)
        assert np.all(moved_slots(table, new) <= budget)
        # every changed slot moves a count towards the target
        gap_before = np.abs(replica_counts_of(table, n) - target).sum(axis=1)
        gap_after = np.abs(replica_counts_of(new, n) - target).sum(axis=1)
        assert np.all(gap_before - gap_after == 2 * moved_slots(table, new))


def test_swap_threshold_is_fine_only_where_one_replica_outweighs_the_mean():
    from vllm_ascend.eplb.policy.packing import swap_threshold

    load = np.array([[90.0, 10.0, 10.0, 10.0], [30.0, 30.0, 30.0, 30.0]])
    counts = np.ones((2, 4), dtype=np.int64)
    # 2 ranks: both means are 60; layer 0's expert 0 (90) alone exceeds its mean
    assert np.allclose(swap_threshold(load, counts, 2, 0.01, 0.001), [0.06, 0.6])
    # with three replicas expert 0 no longer dominates
    counts[0, 0] = 3
    assert np.allclose(swap_threshold(load, counts, 2, 0.01, 0.001), [0.6, 0.6])


@pytest.mark.parametrize("name", ["swift", "flashlb"])
@pytest.mark.parametrize("field", ["min_swap_gain", "dominant_swap_gain"])
def test_swap_gains_are_validated(name, field):
    table = np.array([[[0, 1], [2, 3]]])
    work = np.array([[[9.0, 9.0], [1.0, 1.0]]])
    for bad, match in ((-0.1, r"outside the allowed range \[0.0, None\]"), ("x", "must be a float")):
        with pytest.raises(EplbInputError, match=rf"{field}.*{match}"):
            PolicyFactory.generate_policy(name, {field: bad}).rebalance_experts(table, work)


def test_dominant_swap_gain_picks_the_lightest_partners_for_a_dominant_expert():
    # no redundancy, expert 0 outweighs the mean: its rank should end with the lightest experts.
    # Partners differ by 0.06-0.9 % of the mean (632): below min_swap_gain, above dominant_swap_gain.
    rng = np.random.default_rng(0)
    n, ranks = 16, 4
    load = np.concatenate([[1000.0], 100.0 + rng.permutation(15) * 0.4])[None]
    table = generate_global_placement(n, ranks, 0, 1)
    policy = PolicyFactory.generate_policy("swift", {"min_swap_gain": 0.01})
    _, _, new = policy.rebalance_experts(table, slot_weights(table, load))
    hot_rank = int(np.flatnonzero((new[0] == 0).any(axis=1))[0])
    partners = sorted(load[0, new[0, hot_rank]].tolist())[:3]
    assert partners == sorted(load[0, 1:].tolist())[:3]
    coarse = PolicyFactory.generate_policy("swift", {"min_swap_gain": 0.01, "dominant_swap_gain": 0.01})
    _, _, stuck = coarse.rebalance_experts(table, slot_weights(table, load))
    assert rank_loads(stuck, load).max() > rank_loads(new, load).max()


def test_chain_refine_lowers_a_peak_that_single_swaps_cannot():
    from vllm_ascend.eplb.policy.packing import chain_refine, swap_refine

    table = np.array([[[2, 3, 8], [6, 1, 0], [4, 5, 0], [1, 2, 7]]])
    load = np.array([[18.0, 8.0, 7.0, 1.0, 7.0, 7.0, 7.0, 13.0, 15.0]])
    w = slot_weights(table, load)
    assert w.sum(axis=2).tolist() == [[19.5, 20.0, 23.0, 20.5]]
    # no single swap with any partner, at any depth, lowers the peak
    stalled, _ = swap_refine(table, w, 9, 50, np.zeros(1), candidates=3, depth=4)
    assert stalled.tolist() == table.tolist()
    new, new_w = chain_refine(table, w, 9, 5, np.zeros(1), np.array([12]))
    _check_plan(table, new, 9)
    assert np.allclose(new_w, slot_weights(new, load))
    assert new_w.sum(axis=2).max() == 22.5
    assert moved_slots(table, new).tolist() == [4]
    # a chain changes four slots: with a budget of three nothing moves
    assert chain_refine(table, w, 9, 5, np.zeros(1), np.array([3]))[0].tolist() == table.tolist()


@pytest.mark.parametrize(
    ("field", "bad", "match"),
    [("chain_steps", -1, "outside"), ("chain_steps", 2.5, "int"), ("chain_gain", -0.1, "outside")],
)
def test_chain_options_are_validated(field, bad, match):
    table = np.array([[[0, 1], [2, 3]]])
    work = np.array([[[9.0, 9.0], [1.0, 1.0]]])
    with pytest.raises(EplbInputError, match=f"{field}.*{match}"):
        PolicyFactory.generate_policy("swift", {field: bad}).rebalance_experts(table, work)


@pytest.mark.parametrize(
    ("name", "cls_name", "allowed"),
    [
        (
            "swift",
            "SwiftBalanceEplb",
            "chain_gain, chain_steps, dominant_swap_gain, max_move_fraction, max_swaps",
        ),
        ("default", "DefaultEplb", "forecast, improvement_threshold, max_swaps"),
    ],
)
def test_unknown_policy_option_is_refused_with_a_suggestion(name, cls_name, allowed):
    with pytest.raises(EplbInputError) as info:
        PolicyFactory.generate_policy(name, {"max_swapz": 3})
    assert str(info.value).startswith(
        f"unknown option {cls_name}.max_swapz; did you mean 'max_swaps'? Allowed keys: {allowed}"
    )


@pytest.mark.parametrize("policy", ["random", "default", "swift", "flashlb"])
def test_every_declared_option_is_accepted_and_every_read_option_declared(policy):
    """A policy built with all its declared options runs; an option read but not declared would raise."""
    cls = type(PolicyFactory.generate_policy(policy))
    ints = {"max_swaps", "swap_depth", "chain_steps", "window", "max_samples", "seed"}
    special = {"skip_threshold": 1.01, "forecast": False}
    options = {k: (2 if k in ints else special.get(k, 0.5)) for k in cls.OPTIONS}
    table = np.array([[[0, 1], [2, 3]]])
    changed, _, new = PolicyFactory.generate_policy(policy, options).rebalance_experts(
        table, np.array([[[9.0, 9.0], [1.0, 1.0]]])
    )
    assert new.shape == table.shape and isinstance(changed, bool)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("field", ["max_swaps", "min_swap_gain"])
def test_non_finite_policy_options_are_refused(field, bad):
    with pytest.raises(EplbInputError, match=f"policy option '{field}' must be a (int|float), got {bad}"):
        PolicyFactory.generate_policy("swift", {field: bad}).rebalance_experts(
            np.array([[[0, 1], [2, 3]]]), np.array([[[9.0, 9.0], [1.0, 1.0]]])
        )
