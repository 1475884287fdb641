"""Next-window load forecast: exponential averages of past windows, the one that has lately predicted best."""

from __future__ import annotations

import numpy as np

#: Averaging gains: 1.0 is the latest window alone, smaller gains remember more windows.
GAINS = (1.0, 0.5, 0.25, 0.125)


class LoadForecast:
    """Per-layer expert shares averaged over the windows seen so far, at each of ``gains``.

    A placement is judged on the window after the one it was fitted to. Stationary loads are best
    predicted by a long average (one window's counts are noisy), load that drifts by the latest window
    alone, and a burst that lasts one window by an average it barely moves. Which holds is learnt from
    the data: each :meth:`update` first scores every average's forecast of the new window, the squared
    error of each expert's share divided by its replica count (each replica carries ``1/count`` of the
    error, on ``count`` ranks: the summed squared error of the rank loads), summed over experts and
    layers and discounted by ``decay`` per window; then folds the window in. The forecast is the average
    with the lowest score (ties go to the larger gain), scaled to the window's per-layer totals; its
    :attr:`spread` is how far off (relative) its forecasts of expert loads have lately been.
    Layers without load in a window keep their averages and are not scored; a window of another shape
    starts over.
    """

    def __init__(self, gains: tuple[float, ...] = GAINS, decay: float = 0.7) -> None:
        self.gains = np.sort(np.asarray(gains, dtype=np.float64))[::-1]
        self.decay = decay
        self.shares: np.ndarray | None = None  # [gains, layers, n]
        self.score = np.zeros(len(gains))
        self.relative = np.zeros(len(gains))  # decayed mean squared relative error, per average
        self.weight = 0.0  # the decayed weight of that mean (0 before a forecast was scored)

    def update(self, load: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """Fold a window's logical loads ``[layers, n]`` in (``counts``: the current replicas of each
        expert) and return the forecast of the next window, in the window's units."""
        total = load.sum(axis=1, keepdims=True)
        seen = total[:, 0] > 0
        shares = load / np.where(seen[:, None], total, 1.0)
        if self.shares is None or self.shares.shape[1:] != load.shape:
            self.shares = np.broadcast_to(shares, (self.gains.size, *load.shape)).copy()
            self.score, self.relative, self.weight = np.zeros(self.gains.size), np.zeros(self.gains.size), 0.0
        else:
            sq = (self.shares[:, seen] - shares[seen]) ** 2
            self.score = self.decay * self.score + (sq / np.maximum(counts[seen], 1)).sum(axis=(1, 2))
            rel = sq.sum(axis=(1, 2)) / np.maximum((self.shares[:, seen] ** 2).sum(axis=(1, 2)), 1e-300)
            self.relative = self.decay * self.relative + (1 - self.decay) * rel
            self.weight = self.decay * self.weight + (1 - self.decay)
            g = self.gains[:, None, None]
            self.shares[:, seen] = (1 - g) * self.shares[:, seen] + g * shares[seen]
        return self.shares[self.best] * total

    @property
    def best(self) -> int:
        """Index of the average with the lowest score (the first minimum: gains run from the largest)."""
        return int(np.argmin(self.score))

    @property
    def gain(self) -> float:
        """The gain of the average the last forecast used."""
        return float(self.gains[self.best])

    @property
    def spread(self) -> float:
        """How far off (relative, root mean square, load-weighted) that average's forecasts of expert loads have
        lately been: 0 until a forecast was scored."""
        if not self.weight:
            return 0.0
        return float(np.sqrt(self.relative[self.best] / self.weight))
