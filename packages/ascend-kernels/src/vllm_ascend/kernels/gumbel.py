"""Gumbel-max sampling with per-request seeds and positions (reproducible on every backend).

Two-level Gumbel-max. The vocabulary is cut into groups of 32 tokens; a random row first races the
groups: group ``g`` scores ``m_g / T + log(sum_i exp((x_i - m_g) / T)) + n_g`` (``m_g`` its largest
logit, ``n_g`` a Gumbel draw), its log-mass plus noise; then the tokens of the winning group race with
their own draws: ``x_i / T + n_i``. The winner is distributed exactly as ``softmax(x / T)`` (the group
wins with its share of the mass, the token with its share of the group), but only one noise per group
and 32 per row are drawn, so a token costs one exponential instead of a hash and two logarithms.
Greedy rows (``T <= 0``) take the plain argmax (lowest token id on ties).

Groups: the row is cut into blocks of ``BLOCK_TOKENS = 4096``; group ``j < 128`` of block ``b`` (index
``128 b + j``) holds the tokens ``4096 b + 4 (128 a + j) + v`` for ``a < 8, v < 4``: eight 4-token
runs, 512 tokens apart, so that 128 threads reading a block side by side each hold one whole group.

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
# The group layout (part of the format: changing it changes the draws): a block of RUNS * SLOTS * RUN
# tokens holds SLOTS groups, each of RUNS runs of RUN consecutive tokens, SLOTS * RUN tokens apart.
RUN = 4
SLOTS = 128
RUNS = 8
BLOCK_TOKENS = RUNS * SLOTS * RUN
GROUP = RUNS * RUN


def group_tokens(n_groups: int, device: torch.device | None = None) -> torch.Tensor:
    """``[n_groups, GROUP]`` int64: the token ids of each group, in increasing order."""
    blocks = -(-n_groups // SLOTS)
    ids = torch.arange(blocks * BLOCK_TOKENS, dtype=torch.int64, device=device)
    return ids.view(blocks, RUNS, SLOTS, RUN).transpose(1, 2).reshape(blocks * SLOTS, GROUP)[:n_groups]


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
    vocab = logits.shape[1]
    x = logits.to(torch.float32)
    t = temperature.to(torch.float32).unsqueeze(1)
    random_rows = t > 0
    scale = torch.ones_like(t)
    if apply_temperature:
        scale = torch.where(random_rows, 1.0 / torch.where(random_rows, t, scale), scale)
    n_grp = -(-vocab // BLOCK_TOKENS) * SLOTS
    members = group_tokens(n_grp, x.device)
    inside = members < vocab
    xg = torch.where(inside, x[:, members.clamp(max=vocab - 1)], float("-inf"))  # [rows, n_grp, GROUP]
    m = xg.max(dim=2).values
    m_safe = torch.where(m > float("-inf"), m, torch.zeros_like(m))
    mass = torch.exp((xg - m_safe.unsqueeze(2)) * scale.unsqueeze(2)).sum(dim=2)
    keys = row_keys_torch(seeds, positions).unsqueeze(1)
    groups = torch.arange(n_grp, dtype=torch.int64, device=x.device).unsqueeze(0)
    score = m * scale + torch.log(mass) + gumbel_noise_torch(keys, groups)
    won = score.argmax(dim=1)
    tokens = members[won]  # [rows, GROUP]
    xt = torch.where(inside[won], x.gather(1, tokens.clamp(max=vocab - 1)), float("-inf"))
    yt = xt / t if apply_temperature else xt
    noisy = torch.where(
        inside[won], yt + gumbel_noise_torch(hash32_torch(keys ^ TOKEN_KEY), tokens), float("-inf")
    )
    drawn = tokens.gather(1, noisy.argmax(dim=1, keepdim=True)).squeeze(1)
    return torch.where(random_rows.squeeze(1), drawn, x.argmax(dim=1))


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
