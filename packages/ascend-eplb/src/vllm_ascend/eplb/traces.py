"""Synthetic expert-load traces for judging EPLB policies on the window after the one they saw.

A family name gives the shape of the per-layer expert popularity over windows (each layer draws its own random
expert order):

- ``zipf<a>``: stationary Zipf(a).
- ``drift<a>-<s>``: Zipf(a) whose log-popularity takes a N(0, s²) random-walk step every window.
- ``rotate<a>-<k>``: Zipf(a); every window ``k`` experts drawn from the hottest eighth trade popularity with
  random other experts (the hot set changes abruptly).
- ``burst<a>-<q>-<b>x<m>``: stationary Zipf(a); in every window each layer, with probability ``q``, multiplies
  the popularity of ``b`` random experts by ``m`` for that window only.

Counts are top-``top_k`` multinomial draws of ``tokens`` per step.
"""

from __future__ import annotations

import re

import numpy as np

from vllm_ascend.eplb.validation import EplbInputError

_NUM = r"(\d+(?:\.\d+)?)"
_FAMILIES = {
    "zipf": re.compile(rf"zipf{_NUM}"),
    "drift": re.compile(rf"drift{_NUM}-{_NUM}"),
    "rotate": re.compile(rf"rotate{_NUM}-(\d+)"),
    "burst": re.compile(rf"burst{_NUM}-{_NUM}-(\d+)x{_NUM}"),
}
FAMILY_FORMS = "zipf<a>, drift<a>-<s>, rotate<a>-<k>, burst<a>-<q>-<b>x<m>"


def parse_family(family: str) -> tuple[str, tuple[float, ...]]:
    """``(kind, parameters)`` of a family name; other names raise :class:`EplbInputError`."""
    for kind, pattern in _FAMILIES.items():
        m = pattern.fullmatch(family)
        if m:
            return kind, tuple(float(v) for v in m.groups())
    raise EplbInputError(f"unknown load-trace family {family!r}; allowed forms: {FAMILY_FORMS}")


def shape_of(family: str) -> str:
    """The load shape a family stands for: ``zipf``, ``drift``, ``rotate`` or ``burst``."""
    return parse_family(family)[0]


def popularity(family: str, experts: int, layers: int, windows: int, rng: np.random.Generator) -> np.ndarray:
    """Per-window expert popularity ``[windows, layers, experts]`` (rows sum to 1)."""
    kind, params = parse_family(family)
    base = 1.0 / np.arange(1, experts + 1) ** params[0]
    logp = np.log(np.stack([rng.permutation(base) for _ in range(layers)]))
    rows = np.arange(layers)[:, None]
    out = np.empty((windows, layers, experts))
    for w in range(windows):
        if w and kind == "drift":
            logp = logp + params[1] * rng.standard_normal(logp.shape)
        elif w and kind == "rotate":
            k = int(params[1])
            hot = np.argsort(-logp, axis=1)[:, : max(k, experts // 8)]
            src = np.stack([rng.choice(h, k, replace=False) for h in hot])
            dst = np.stack([rng.choice(experts, k, replace=False) for _ in range(layers)])
            logp[rows, src], logp[rows, dst] = logp[rows, dst], logp[rows, src]
        cur = logp.copy()
        if kind == "burst":
            for layer in np.flatnonzero(rng.random(layers) < params[1]):
                cur[layer, rng.choice(experts, int(params[2]), replace=False)] += np.log(params[3])
        p = np.exp(cur - cur.max(axis=1, keepdims=True))
        out[w] = p / p.sum(axis=1, keepdims=True)
    return out


def load_trace(
    family: str, experts: int, layers: int, windows: int, steps: int, tokens: int, seed: int, top_k: int = 8
) -> np.ndarray:
    """Token counts per expert ``[windows, steps, layers, experts]``: ``tokens × top_k`` draws per step."""
    rng = np.random.default_rng(seed)
    pop = popularity(family, experts, layers, windows, rng)
    return np.stack([rng.multinomial(tokens * top_k, p, size=(steps, layers)) for p in pop]).astype(
        np.float64
    )
