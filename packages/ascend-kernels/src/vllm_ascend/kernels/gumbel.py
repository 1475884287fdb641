"""Gumbel-max sampling with per-request seeds and positions (reproducible on every backend).

Two-level Gumbel-max. The vocabulary is cut into groups of ``GROUP`` consecutive tokens. A random row
first races the groups: group ``g`` scores its log-mass plus noise, ``log2(sum_i 2^(x_i * c)) + n_g``
with ``c = log2(e) / T``, computed as ``m_g * c + log2(sum_i 2^((x_i - m_g) * c)) + n_g`` (``m_g`` its
largest logit); then the tokens of the winning group race with their own draws: ``x_i * c + n_i``.
The winner is distributed exactly as ``softmax(x / T)`` (the group wins with its share of the mass,
the token with its share of the group), but only one noise per group and ``GROUP`` per row are
drawn, so the cost per token is one exponential instead of a hash and two logarithms. Greedy rows
(``T <= 0``) take the plain argmax. Everything is in base-2 units (``log2(e)`` times a natural-log
Gumbel race plus a constant, which changes no argmax).

Noise: ``n = -log2(-log2(u))`` (a standard Gumbel draw times ``log2(e)``, plus a constant),
``u = ((h >> 9) + 0.5) / 2**23``, ``h = hash32(key ^ (i * 0x9E3779B9 mod 2**32))`` where ``i`` is the
group index (group race, ``key = row_key``) or the token id (token race,
``key = hash32(row_key ^ TOKEN_KEY)``), ``row_key = hash32(hash32(hash32(seed_lo) ^ seed_hi) ^ pos_lo)``
and ``hash32`` a 32-bit xor-shift/multiply mixer. Only wrapping 32-bit multiply, xor and shifts are
used, so every backend draws bit-identical ``u``; 23 random bits keep ``u < 1`` and the noise finite.
``log2`` is :func:`log2_torch`'s: the mantissa reduced to ``[2/3, 4/3)`` and a degree-7 polynomial
(relative error below ``3e-7``) on every backend, where the library logarithms differ.
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
LOG2E = 1.4426950408889634
#: log2(1 + t) = t * Q(t) for t in [-1/3, 1/3): Q's coefficients, lowest first (a weighted minimax fit).
LOG2_POLY = (
    1.4426947832107544,
    -0.7213466167449951,
    0.4809654951095581,
    -0.3607836663722992,
    0.285582035779953,
    -0.23689256608486176,
    0.24686215817928314,
    -0.22167599201202393,
)
LOG2_SPLIT = 0x3F2AAAAB  # the bits of 2/3: mantissas are reduced to [2/3, 4/3)


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


def log2_torch(x: torch.Tensor) -> torch.Tensor:
    """``log2`` of positive normal float32 ``x`` as the kernels compute it: ``x = 2^e * (1 + t)`` with
    ``1 + t`` in ``[2/3, 4/3)``, then ``e + t * Q(t)`` (:data:`LOG2_POLY`, Horner)."""
    bits = x.view(torch.int32)
    e = (bits - LOG2_SPLIT) >> 23
    t = (bits - (e << 23)).view(torch.float32) - 1.0
    q = torch.full_like(t, LOG2_POLY[-1])
    for coefficient in LOG2_POLY[-2::-1]:
        q = q * t + coefficient
    return e.to(torch.float32) + t * q


def gumbel_noise_torch(keys: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """float32 noise ``-log2(-log2(u))`` of ``index`` (group or token ids, int64) under per-row ``keys``
    ``[B, 1]``."""
    h = hash32_torch(keys ^ ((index * TOKEN_MIX) & MASK32))
    u = ((h >> 9).to(torch.float32) + 0.5) * (1.0 / 8388608.0)
    return -log2_torch(-log2_torch(u))


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
    c = scale * LOG2E
    n_grp = -(-vocab // GROUP)
    xg = torch.full((rows, n_grp * GROUP), float("-inf"), dtype=torch.float32, device=x.device)
    xg[:, :vocab] = x
    xg = xg.view(rows, n_grp, GROUP)
    m = xg.max(dim=2).values
    mc = torch.where(m > float("-inf"), m, torch.zeros_like(m)) * c
    mass = torch.exp2(xg * c.unsqueeze(2) - mc.unsqueeze(2)).sum(dim=2)
    log_mass = log2_torch(torch.where(mass > 0, mass, torch.ones_like(mass)))
    keys = row_keys_torch(seeds, positions).unsqueeze(1)
    groups = torch.arange(n_grp, dtype=torch.int64, device=x.device).unsqueeze(0)
    score = torch.where(random_rows, m * c + log_mass + gumbel_noise_torch(keys, groups), m)
    won = score.argmax(dim=1, keepdim=True)
    tokens = won * GROUP + torch.arange(GROUP, device=x.device).unsqueeze(0)
    inside = tokens < vocab
    tokens = torch.where(inside, tokens, tokens.new_zeros(()))
    xt = x.gather(1, tokens)
    noisy = xt * c + gumbel_noise_torch(hash32_torch(keys ^ TOKEN_KEY), tokens)
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
