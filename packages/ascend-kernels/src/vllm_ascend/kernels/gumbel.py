"""Gumbel-max sampling with per-request seeds and positions (reproducible on every backend).

The noise of token ``v`` in a row is ``-log(-log(u))`` with ``u = ((h >> 9) + 0.5) / 2**23`` and
``h = hash32(row_key ^ (v * 0x9E3779B9 mod 2**32))``,
``row_key = hash32(hash32(hash32(seed_lo) ^ seed_hi) ^ pos_lo)`` where ``hash32`` is a 32-bit integer
mixer (xor-shift / multiply). Only wrapping 32-bit multiply,
xor and shifts are used, so the torch reference and the Triton kernel draw bit-identical ``u``.
``u`` has 23 random bits so that ``k + 0.5`` is exact in float32 and ``u < 1``: the noise is finite
and at most ``-log(-log(1 - 2**-24)) ~ 16.64`` (24 bits rounded the largest ``u`` up to 1, giving
one token in 2**24 an infinite score).
"""

from __future__ import annotations

import torch

from vllm_ascend.kernels._backend import dispatch

MASK32 = 0xFFFFFFFF
HASH_M1 = 0x7FEB352D
HASH_M2 = 0x846CA68B
TOKEN_MIX = 0x9E3779B9


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


def gumbel_noise_torch(seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``[B, vocab_size]`` float32 Gumbel noise, identical to what the Triton kernel draws."""
    keys = row_keys_torch(seeds, positions).unsqueeze(1)
    token_mix = (torch.arange(vocab_size, dtype=torch.int64, device=seeds.device) * TOKEN_MIX) & MASK32
    h = hash32_torch(keys ^ token_mix.unsqueeze(0))
    u = ((h >> 9).to(torch.float32) + 0.5) * (1.0 / 8388608.0)
    return -torch.log(-torch.log(u))


def gumbel_sample_torch(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    apply_temperature: bool = True,
) -> torch.Tensor:
    """Reference of :func:`gumbel_sample`."""
    x = logits.to(torch.float32)
    t = temperature.to(torch.float32).unsqueeze(1)
    random_rows = t > 0
    if apply_temperature:
        x = x / torch.where(random_rows, t, torch.ones_like(t))
    noise = gumbel_noise_torch(seeds, positions, logits.shape[1])
    x = torch.where(random_rows, x + noise, x)
    return x.argmax(dim=1)


def gumbel_sample(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    apply_temperature: bool = True,
) -> torch.Tensor:
    """Sample one token per row: ``argmax(logits / T + Gumbel noise)``; not in place.

    ``logits``: ``[B, V]`` float32/bfloat16/float16 (read only). ``temperature``: ``[B]`` float32;
    rows with ``T <= 0`` are greedy (plain argmax, no noise). ``seeds``: ``[B]`` int64, the
    request's seed; ``positions``: ``[B]`` int64, e.g. the request's number of generated tokens —
    the same (seed, position, logits) always draws the same token. ``apply_temperature=False``
    when ``logits`` were already scaled. Ties go to the lowest token id.
    Returns ``[B]`` int64 token ids.
    """
    impl = dispatch("gumbel", "gumbel_sample", gumbel_sample_torch, logits.device)
    return impl(logits, temperature, seeds, positions, apply_temperature)
