"""The default policy on held-out windows: no worse than vLLM's EPLB policy per load shape, and valid plans.

Each policy rebalances once per window of a synthetic trace (``vllm_ascend.eplb.traces``) from its own previous
placement; the plan fitted on window t is scored on window t+1 (max/mean rank load, averaged over layers). The
traces here (shapes, sizes, seeds) are not the benchmark's development or held-out sets. Hot experts that trade
places abruptly (``rotate``) are left to the benchmark: there the next window's peak is the surprise itself, the
same for every placement, and a small set's mean difference is noise of either sign.
"""

from __future__ import annotations

import numpy as np
import pytest

from vllm_ascend.eplb import DefaultEplb, EplbInputError
from vllm_ascend.eplb.placement import generate_global_placement
from vllm_ascend.eplb.policy.packing import (
    capped_replica_counts,
    imbalance,
    rank_loads,
    replica_counts,
    replica_counts_of,
    slot_weights,
)
from vllm_ascend.eplb.traces import load_trace, shape_of
from vllm_ascend.eplb.validation import duplicated_on_rank

LAYERS, WINDOWS, STEPS = 12, 8, 4
#: (experts, ranks, redundant, tokens per step)
CONFIGS = ((48, 8, 8, 256), (60, 12, 12, 512), (40, 20, 20, 512))
FAMILIES = {
    "zipf": ("zipf0.7", "zipf1.1", "zipf1.5"),
    "drift": ("drift0.9-0.25", "drift1.3-0.15"),
    "burst": ("burst1.0-0.3-3x5",),
}
#: How much worse than vLLM's policy a family mean may be (relative): float noise only.
EPSILON = 1e-3


def vllm_policy(load: np.ndarray, ranks: int, slots: int) -> np.ndarray:
    """vLLM 0.32's ``DefaultEplbPolicy`` on one node, restated: every extra slot goes to the expert with the
    highest load per replica (no cap on the count), then the replicas, heaviest first, go to the lightest rank
    that still has a free slot (one expert may land on a rank twice)."""
    layers, n = load.shape
    out = np.empty((layers, ranks, slots), dtype=np.int64)
    for layer in range(layers):
        counts = np.ones(n)
        for _ in range(ranks * slots - n):
            counts[np.argmax(load[layer] / counts)] += 1
        items = np.repeat(np.arange(n), counts.astype(np.int64))
        weights = (load[layer] / counts)[items]
        rank_load, filled = np.zeros(ranks), np.zeros(ranks, dtype=np.int64)
        for i in np.argsort(-weights, kind="stable"):
            r = int(np.argmin(np.where(filled < slots, rank_load, np.inf)))
            out[layer, r, filled[r]] = items[i]
            rank_load[r] += weights[i]
            filled[r] += 1
    return out


def _check_valid(old: np.ndarray, new: np.ndarray, n: int, redundant: int) -> None:
    """Every logical expert placed, the same slots per rank, no expert twice on a rank, ``redundant`` extra
    replicas in every layer, experts that stay on a rank keep their slot."""
    assert new.shape == old.shape and new.dtype == np.int64
    assert ((new >= 0) & (new < n)).all()
    counts = replica_counts_of(new, n)
    assert (counts >= 1).all() and (counts.sum(axis=1) == n + redundant).all()
    assert not duplicated_on_rank(new, n).any()
    stays = (old[..., :, None] == new[..., None, :]).any(
        axis=-1
    )  # [layers, ranks, old slot]: still on the rank
    assert (new[stays] == old[stays]).all()


def _next_window(family: str, config: tuple[int, int, int, int], seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-layer next-window max/mean of the default policy and of vLLM's over rebalances 2.. of one trace."""
    experts, ranks, redundant, tokens = config
    slots = (experts + redundant) // ranks
    windows = load_trace(family, experts, LAYERS, WINDOWS, STEPS, tokens, seed).sum(axis=1)
    policy, ours = DefaultEplb(), generate_global_placement(experts, ranks, redundant, LAYERS)
    scores: tuple[list[np.ndarray], list[np.ndarray]] = ([], [])
    for w in range(WINDOWS - 1):
        changed, _, new = policy.rebalance_experts(ours, slot_weights(ours, windows[w]))
        _check_valid(ours, new, experts, redundant)
        ours = new if changed else ours
        theirs = vllm_policy(windows[w], ranks, slots)
        if w:  # the first rebalance starts from the default placement
            scores[0].append(imbalance(ours, windows[w + 1]))
            scores[1].append(imbalance(theirs, windows[w + 1]))
    return np.concatenate(scores[0]), np.concatenate(scores[1])


@pytest.mark.parametrize("shape", sorted(FAMILIES))
def test_default_is_no_worse_than_vllm_on_held_out_windows(shape):
    ours, theirs = [], []
    for family in FAMILIES[shape]:
        assert shape_of(family) == shape
        for i, config in enumerate(CONFIGS):
            a, b = _next_window(family, config, seed=1000 + i)
            ours.append(a)
            theirs.append(b)
    mean_ours, mean_theirs = np.concatenate(ours).mean(), np.concatenate(theirs).mean()
    assert mean_ours <= mean_theirs * (1 + EPSILON), (shape, mean_ours, mean_theirs)


def test_capped_counts_give_fewer_larger_hot_replicas_where_greedy_pairs_them():
    # 4 ranks x 3 slots, mean rank load 62.5. Greedy counts (one replica per rank at most) are (1, 1, 2, 3, 4,
    # 1): four 34.25s take a rank each and two of the five 20-24s must then share one (>= 74.25). Capped at the
    # mean, expert 3 gets two replicas of 30 and each rank holds one 34.25, one 24-30 and a light expert.
    load = np.array([[2.0, 2.0, 48.0, 60.0, 137.0, 1.0]])
    assert replica_counts(load, 12, 4).tolist() == [[1, 1, 2, 3, 4, 1]]
    table = generate_global_placement(6, 4, 6, 1)
    changed, _, new = DefaultEplb().rebalance_experts(table, slot_weights(table, load))
    assert changed
    _check_valid(table, new, 6, 6)
    assert replica_counts_of(new, 6).tolist() == [[2, 1, 2, 2, 4, 1]]
    assert rank_loads(new, load).max() == pytest.approx(65.25)  # the optimum for four replicas of 137
    # vLLM's policy (no cap: five replicas of 137, two on one rank) peaks at 1.25x the mean
    assert rank_loads(vllm_policy(load, 4, 3), load).max() == pytest.approx(78.0)


def test_capped_replica_counts_exact():
    load = np.array([[10.0, 6.0, 1.0, 1.0]])
    counts, fits = capped_replica_counts(load, 6, 3, np.array([5.0]))
    assert counts.tolist() == [[2, 2, 1, 1]] and fits.tolist() == [True]
    # under cap 8 only expert 0 is hot (2 replicas); the spare slot goes to the heaviest other expert
    counts, fits = capped_replica_counts(load, 6, 3, np.array([8.0]))
    assert counts.tolist() == [[2, 2, 1, 1]] and fits.tolist() == [True]
    # cap 4 needs 3 + 2 + 1 + 1 = 7 replicas: more than the 6 slots
    assert capped_replica_counts(load, 6, 3, np.array([4.0]))[1].tolist() == [False]
    # at most one replica per rank: with every expert at the limit but the capped one, it takes the rest
    counts, fits = capped_replica_counts(np.array([[100.0, 1.0]]), 4, 2, np.array([60.0]))
    assert counts.tolist() == [[2, 2]] and fits.tolist() == [True]


def test_one_call_plans_on_the_window_itself():
    """Without earlier windows the forecast is the window: with or without it the plan is the same."""
    load = load_trace("zipf1.2", 48, 4, 1, 2, 256, seed=3).sum(axis=(0, 1))
    table = generate_global_placement(48, 8, 8, 4)
    work = slot_weights(table, load)
    with_forecast, without = DefaultEplb().rebalance_experts(table, work), DefaultEplb({"forecast": False})
    assert np.array_equal(with_forecast[2], without.rebalance_experts(table, work)[2])
    assert with_forecast[0]


def test_forecast_option_is_a_bool():
    with pytest.raises(EplbInputError, match="policy option 'forecast' must be true or false, got 1"):
        DefaultEplb({"forecast": 1}).rebalance_experts(np.array([[[0, 1], [2, 3]]]), np.ones((1, 2, 2)))
