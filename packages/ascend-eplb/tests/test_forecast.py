"""LoadForecast: the average that has lately predicted the next window best, and how far off it has been."""

from __future__ import annotations

import numpy as np
import pytest

from vllm_ascend.eplb.policy.forecast import GAINS, LoadForecast

ONES = np.ones((2, 32), dtype=np.int64)


def _zipf(rng: np.random.Generator, layers: int = 2, n: int = 32) -> np.ndarray:
    return np.stack([rng.permutation(1.0 / np.arange(1, n + 1)) for _ in range(layers)])


def test_first_window_is_its_own_forecast():
    load = _zipf(np.random.default_rng(0)) * 1000
    forecast = LoadForecast()
    assert np.allclose(forecast.update(load, ONES), load)
    assert forecast.gain == 1.0 and forecast.spread == 0.0


def test_drifting_loads_are_forecast_by_the_latest_window():
    rng = np.random.default_rng(1)
    forecast, logp = LoadForecast(), np.log(_zipf(rng))
    for _ in range(6):  # popularity takes a large random-walk step every window, no sampling noise
        logp = logp + 0.5 * rng.standard_normal(logp.shape)
        load = np.exp(logp) * 1e4
        out = forecast.update(load, ONES)
    assert forecast.gain == 1.0
    assert np.allclose(out, load)
    assert forecast.spread > 0.2  # it has been off by about the step


def test_stationary_noisy_loads_are_forecast_by_a_long_average():
    rng = np.random.default_rng(2)
    p = _zipf(rng)
    p /= p.sum(axis=1, keepdims=True)
    forecast = LoadForecast()
    for _ in range(8):
        load = np.stack([rng.multinomial(2000, row) for row in p]).astype(np.float64)
        out = forecast.update(load, ONES)
    assert forecast.gain < 0.5
    truth = p * load.sum(axis=1, keepdims=True)
    assert np.abs(out - truth).sum() < 0.7 * np.abs(load - truth).sum()  # closer than the window itself
    assert 0 < forecast.spread < 0.2


def test_recurring_one_window_bursts_are_averaged_down():
    """Bursts that last one window make the latest window a poor forecast of the next (it carries the burst):
    a long average is chosen and the latest burst is diluted."""
    rng = np.random.default_rng(3)
    base = _zipf(rng, layers=8) * 1000
    counts = np.ones(base.shape, dtype=np.int64)
    forecast = LoadForecast()
    for _ in range(10):
        window = base * rng.uniform(0.97, 1.03, base.shape)
        hit, hot = rng.choice(8, 2, replace=False), rng.integers(0, 32, 2)
        window[hit, hot] *= 20
        out = forecast.update(window, counts)
    assert forecast.gain <= 0.25
    share = out[hit, hot] / out[hit].sum(axis=1)
    assert (share < 0.5 * window[hit, hot] / window[hit].sum(axis=1)).all()


def test_idle_layers_keep_their_averages_and_a_new_shape_starts_over():
    load = _zipf(np.random.default_rng(4)) * 1000
    forecast = LoadForecast()
    forecast.update(load, ONES)
    idle = load.copy()
    idle[1] = 0.0
    out = forecast.update(idle, ONES)
    assert np.allclose(out[0], load[0]) and (out[1] == 0).all()  # an idle layer forecasts no load ...
    assert forecast.shares is not None and np.allclose(
        forecast.shares[:, 1], load[1] / load[1].sum()
    )  # ... keeps its shares
    other = np.ones((3, 8))
    assert np.allclose(forecast.update(other, np.ones((3, 8), dtype=np.int64)), other)
    assert forecast.gain == 1.0 and forecast.spread == 0.0 and forecast.shares.shape == (len(GAINS), 3, 8)


def test_replicas_divide_an_experts_error():
    """A forecast that misses an expert held by many replicas scores better than one missing a single-replica
    expert by the same amount: each replica carries only its share of the miss."""
    load = np.array([[50.0, 30.0, 20.0]])
    a, b = LoadForecast(gains=(1.0, 0.5)), LoadForecast(gains=(1.0, 0.5))
    a.update(load, np.array([[4, 1, 1]]))
    b.update(load, np.array([[4, 1, 1]]))
    moved = np.array([[60.0, 30.0, 10.0]])  # expert 0 gains what expert 2 loses
    a.update(moved, np.array([[4, 1, 1]]))
    b.update(moved, np.array([[1, 4, 1]]))
    assert a.score[0] == pytest.approx(0.01 / 4 + 0.01) and b.score[0] == pytest.approx(0.01 + 0.01)
