"""Gumbel-max sampling with per-request seeds and positions (reproducible on every backend).

Two-level Gumbel-max. The vocabulary is cut into groups of ``GROUP`` consecutive tokens. A random row
first races the groups: group ``g`` scores ``m_g / T + log(sum_i exp((x_i - m_g) / T)) + n_g`` (``m_g``
its largest logit, ``n_g`` a Gumbel draw), the log-mass of the group plus noise; then the tokens of the
winning group race with their own draws: ``x_i / T + n_i``. The winner is distributed exactly as
``softmax(x / T)`` (the group wins with its share of the mass, the token with its share of the
group), but only one noise per group and ``GROUP`` per row are drawn, so the cost per token is one
exponential instead of a hash and two logarithms. Greedy rows (``T <= 0``) take the plain argmax.

Noise: ``n = -log(-log(u))``, ``u = ((h >> 9) + 0.5) / 2**23``, ``h = hash32(key ^ (i * 0x9E3779B9 mod
2**32))`` where ``i`` is the group index (group race, ``key = row_key``) or the token id (token race,
``key = hash32(row_key ^ TOKEN_KEY)``), ``row_key = hash32(hash32(hash32(seed_lo) ^ seed_hi) ^ pos_lo)``
and ``hash32`` a 32-bit xor-shift/multiply mixer. Only wrapping 32-bit multiply, xor and shifts are
used, so every backend draws bit-identical ``u``; 23 random bits keep ``u < 1`` and the noise finite.
"""

from __future__ import annotations

import torch

from vllm_ascend.kernels._backend import dispatch

MASK32 = 0xFFFFFFFF
HASH_M1 = 0x7FEB352D
HASH_M2 = 0x846CA68B
TOKEN_MIX = 0x9E3779B9
TOKEN_KEY = 0x68E31DA4  # separates the token race's draws from the group race's
GROUP = 32  # tokens per group (part of the format: changing it changes the draws)


def hash32_torch(x: torch.Tensor) -> torch.Tensor:
    """The 32-bit mixer on int64 tensors holding values in ``[0, 2**32)``."""
    x = x ^ (x >> 16)
    x = (x * HASH_M1) & MASK32
    x = x ^ (x >> 15)
    x = (x * HASH_M2) & MASK32
    return x ^ (x >> 16)


def row_keys_torch(seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Per-row 32-bit keys (int64 tensor) from int64 ``seeds`` and ``positions``."""
    seeds = seeds.to(torch.int64)
    lo, hi = seeds & MASK32, (seeds >> 32) & MASK32
    return hash32_torch(hash32_torch(hash32_torch(lo) ^ hi) ^ (positions.to(torch.int64) & MASK32))


def gumbel_noise_torch(keys: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """float32 Gumbel noise of ``index`` (group or token ids, int64) under per-row ``keys`` ``[B, 1]``."""
    h = hash32_torch(keys ^ ((index * TOKEN_MIX) & MASK32))
    u = ((h >> 9).to(torch.float32) + 0.5) * (1.0 / 8388608.0)
    return -torch.log(-torch.log(u))


def gumbel_sample_torch(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    apply_temperature: bool = True,
) -> torch.Tensor:
    """Reference of :func:`gumbel_sample` (the same draws, in plain torch)."""
    rows, vocab = logits.shape
    x = logits.to(torch.float32)
    t = temperature.to(torch.float32).unsqueeze(1)
    random_rows = t > 0
    scale = torch.ones_like(t)
    if apply_temperature:
        scale = torch.where(random_rows, 1.0 / torch.where(random_rows, t, scale), scale)
    n_grp = -(-vocab // GROUP)
    xg = torch.full((rows, n_grp * GROUP), float("-inf"), dtype=torch.float32, device=x.device)
    xg[:, :vocab] = x
    xg = xg.view(rows, n_grp, GROUP)
    m = xg.max(dim=2).values
    m_safe = torch.where(m > float("-inf"), m, torch.zeros_like(m))
    mass = torch.exp((xg - m_safe.unsqueeze(2)) * scale.unsqueeze(2)).sum(dim=2)
    keys = row_keys_torch(seeds, positions).unsqueeze(1)
    groups = torch.arange(n_grp, dtype=torch.int64, device=x.device).unsqueeze(0)
    score = torch.where(random_rows, m * scale + torch.log(mass) + gumbel_noise_torch(keys, groups), m)
    won = score.argmax(dim=1, keepdim=True)
    tokens = won * GROUP + torch.arange(GROUP, device=x.device).unsqueeze(0)
    inside = tokens < vocab
    tokens = torch.where(inside, tokens, tokens.new_zeros(()))
    xt = x.gather(1, tokens)
    yt = xt / t if apply_temperature else xt
    noisy = yt + gumbel_noise_torch(hash32_torch(keys ^ TOKEN_KEY), tokens)
    s = torch.where(inside, torch.where(random_rows, noisy, xt), float("-inf"))
    return tokens.gather(1, s.argmax(dim=1, keepdim=True)).squeeze(1)


def gumbel_sample(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    apply_temperature: bool = True,
) -> torch.Tensor:
    """Sample one token per row from ``softmax(logits / T)`` by two-level Gumbel-max; not in place.

    ``logits``: ``[B, V]`` float32/bfloat16/float16 (read only). ``temperature``: ``[B]`` float32;
    rows with ``T <= 0`` are greedy (plain argmax, no noise). ``seeds``: ``[B]`` int64, the
    request's seed; ``positions``: ``[B]`` int64, e.g. the request's number of generated tokens —
    the same (seed, position, logits) always draws the same token. ``apply_temperature=False``
    when ``logits`` were already scaled (``T`` then only tells greedy rows). Ties go to the lowest
    token id. Returns ``[B]`` int64 token ids.
    """
    impl = dispatch("gumbel", "gumbel_sample", gumbel_sample_torch, logits.device)
    return impl(logits, temperature, seeds, positions, apply_temperature)
