"""V2 temperature / Gumbel sampling overrides against vLLM's own kernels (run in Triton's interpreter).

Seeded sampling must draw vLLM's tokens: the murmur3 hash and both uniforms are compared bit for bit
with vLLM's ``@triton.jit`` helpers, and the sampling kernel's per-block argmax exactly."""

from __future__ import annotations

import os

import pytest
import torch
import triton.language as tl

from vllm_ascend.kernels.v2 import sample_gumbel as v2

from ._interpreter_fixes import interpreter_fixes
from .vllm_oracle import _namespace, clone_args, vllm_kernel

_MODULE = "vllm.v1.worker.gpu.sample.gumbel"
_SEEDS = [0, 1, 42, -1, 2**63 - 1, -(2**63), 0x1234_5678_9ABC_DEF0, -987654321987]


@pytest.fixture(autouse=True)
def _fixes(monkeypatch):
    interpreter_fixes(monkeypatch)


def _interpreted(fn):
    """``triton.jit(fn)`` for Triton's interpreter (the oracle's setting, restored afterwards)."""
    import triton

    previous = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        return triton.jit(fn)
    finally:
        if previous is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = previous


# vLLM's helpers, bound by _hash_probe (the interpreter resolves a kernel's callees in its globals).
vllm_hash32 = vllm_uniform32 = vllm_uniform64 = None


@_interpreted
def _probe_kernel(seed_ptr, pos_ptr, h_ptr, u32_ptr, u64_ptr, n, BLOCK: tl.constexpr):
    seed = tl.load(seed_ptr)
    pos = tl.load(pos_ptr)
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(h_ptr + offs, vllm_hash32(seed, pos, offs).to(tl.int64), mask=mask)
    tl.store(u32_ptr + offs, vllm_uniform32(seed, pos, offs), mask=mask)
    tl.store(u64_ptr + offs, vllm_uniform64(seed, pos, offs), mask=mask)


def _hash_probe():
    """A kernel storing vLLM's ``murmur3_hash32`` and uniforms of ``(seed, pos, offsets)``."""
    global vllm_hash32, vllm_uniform32, vllm_uniform64
    ns = _namespace(_MODULE)
    vllm_hash32, vllm_uniform32, vllm_uniform64 = (
        ns["murmur3_hash32"],
        ns["murmur3_uniform32"],
        ns["murmur3_uniform64"],
    )
    return _probe_kernel


@pytest.mark.parametrize("pos", [0, 7, 2**31 + 5, (1 << 30) + 3])
def test_murmur3_stream_is_bit_exact(pos: int) -> None:
    probe = _hash_probe()
    n = 512
    offsets = torch.arange(n)
    for seed in _SEEDS:
        h = torch.empty(n, dtype=torch.int64)
        u32 = torch.empty(n, dtype=torch.float32)
        u64 = torch.empty(n, dtype=torch.float64)
        probe[(1,)](torch.tensor([seed]), torch.tensor([pos]), h, u32, u64, n, BLOCK=n)
        s, p = torch.tensor(seed), torch.tensor(pos)
        assert torch.equal(v2.murmur3_hash32_torch(s, p, offsets), h), seed
        assert torch.equal(v2.murmur3_uniform32_torch(s, p, offsets), u32), seed
        assert torch.equal(v2.murmur3_uniform64_torch(s, p, offsets), u64), seed
        assert (u32 > 0).all() and (u32 < 1).all()


def _assert_within_one_ulp(actual: torch.Tensor, expected: torch.Tensor) -> None:
    a, e = actual.double(), expected.double()
    mant = {torch.bfloat16: 7, torch.float16: 10, torch.float32: 23}[actual.dtype]
    scale = torch.maximum(a.abs(), e.abs()).clamp_min(torch.finfo(actual.dtype).tiny)
    ulp = torch.exp2(torch.floor(torch.log2(scale)) - mant)
    assert ((a - e).abs() <= ulp).all(), (a - e).abs().max()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("num_tokens", "vocab", "block"), [(0, 40, 16), (1, 40, 16), (6, 100, 32)])
def test_temperature_matches_vllm(num_tokens: int, vocab: int, block: int, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(num_tokens * 31 + vocab)
    max_reqs = 8
    temps = torch.tensor([0.0, 1.0, 0.7, 1.5, 0.3, 2.0, 0.0, 0.9])
    args = {
        "logits_ptr": (torch.randn(num_tokens, vocab + 3, generator=g) * 4).to(dtype),  # padded rows
        "logits_stride": vocab + 3,
        "expanded_idx_mapping_ptr": torch.randint(0, max_reqs, (num_tokens,), generator=g, dtype=torch.int32),
        "temperature_ptr": temps,
        "vocab_size": vocab,
        "BLOCK_SIZE": block,
    }
    grid = (num_tokens, (vocab + block - 1) // block)
    expected = clone_args(args)
    vllm_kernel(f"{_MODULE}._temperature_kernel")(grid, **expected)
    v2.temperature_torch(grid, **args)
    if dtype == torch.float32:
        assert torch.equal(args["logits_ptr"], expected["logits_ptr"])
    else:  # the interpreter truncates the float32 -> bfloat16 store, torch rounds: 1 ulp apart
        _assert_within_one_ulp(args["logits_ptr"], expected["logits_ptr"])
    assert torch.equal(args["logits_ptr"][:, vocab:], expected["logits_ptr"][:, vocab:])


def _gumbel_args(g, num_tokens, vocab, block, *, cache, draft, apply_temp, fp64, dtype=torch.float32):
    max_reqs, num_cols = 6, 3
    num_blocks = (vocab + block - 1) // block
    idx = torch.randint(0, max_reqs, (num_tokens,), generator=g, dtype=torch.int32)
    if cache is not None:  # distinct requests: two tokens caching into one row would race
        idx = torch.randperm(max_reqs, generator=g)[:num_tokens].to(torch.int32)
    if num_tokens > 2:
        idx[2] = -1  # a padded row
    logits = (torch.randn(num_tokens, vocab, generator=g) * 3).to(dtype)
    if num_tokens > 1:
        logits[1, 5] = logits[1, 9] = 50.0  # a tie: the leftmost wins
    args = {
        "local_argmax_ptr": torch.full((num_tokens, num_blocks), -5, dtype=torch.int64),
        "local_argmax_stride": num_blocks,
        "local_max_ptr": torch.full(
            (num_tokens, num_blocks), 7.0, dtype=torch.float64 if fp64 else torch.float32
        ),
        "local_max_stride": num_blocks,
        "logits_cache_ptr": None,
        "logits_cache_stride_0": 0,
        "logits_cache_stride_1": 0,
        "logits_cache_col_ptr": None,
        "logits_cache_source_ptr": None,
        "logits_cache_source_stride": 0,
        "logits_ptr": logits,
        "logits_stride": vocab,
        "expanded_idx_mapping_ptr": idx,
        "seeds_ptr": torch.tensor([3, -(2**62) + 11, 2**40 + 1, 0, 12345, -1]),
        "pos_ptr": torch.randint(0, 3000, (num_tokens,), generator=g),
        "temp_ptr": torch.tensor([0.0, 1.0, 0.7, 1.3, 0.0, 0.5]),
        "vocab_size": vocab,
        "BLOCK_SIZE": block,
        "IS_DRAFTING": draft,
        "APPLY_TEMPERATURE": apply_temp,
        "USE_FP64": fp64,
        "PER_TOKEN_COL": cache == "per_token",
    }
    if cache is not None:
        cache_t = torch.full((max_reqs, num_cols, vocab + 4), -3.0, dtype=dtype)
        args["logits_cache_ptr"] = cache_t
        args["logits_cache_stride_0"], args["logits_cache_stride_1"] = cache_t.stride(0), cache_t.stride(1)
        args["logits_cache_source_ptr"] = (torch.randn(num_tokens, vocab, generator=g)).to(dtype)
        args["logits_cache_source_stride"] = vocab
        if cache == "per_token":
            args["logits_cache_col_ptr"] = torch.randint(0, num_cols, (num_tokens,), generator=g)
        else:
            args["logits_cache_col_ptr"] = torch.tensor(2)
    return args, (num_tokens, num_blocks)


@pytest.mark.parametrize(
    ("num_tokens", "vocab", "block", "cache", "draft", "apply_temp", "fp64", "dtype"),
    [
        (0, 50, 32, None, False, True, False, torch.float32),
        (1, 50, 32, None, False, True, False, torch.float32),
        (7, 200, 64, None, False, True, False, torch.float32),
        (7, 200, 64, None, True, False, False, torch.bfloat16),
        (5, 130, 64, "scalar", True, True, False, torch.float32),
        (5, 130, 64, "per_token", False, False, False, torch.bfloat16),
        (6, 100, 64, None, False, True, True, torch.float32),
        (4, 100, 32, "per_token", True, True, True, torch.float32),
    ],
)
def test_gumbel_sample_matches_vllm(num_tokens, vocab, block, cache, draft, apply_temp, fp64, dtype) -> None:
    g = torch.Generator().manual_seed(num_tokens * 1000 + vocab + int(fp64))
    args, grid = _gumbel_args(
        g, num_tokens, vocab, block, cache=cache, draft=draft, apply_temp=apply_temp, fp64=fp64, dtype=dtype
    )
    expected = clone_args(args)
    vllm_kernel(f"{_MODULE}._gumbel_sample_kernel")(grid, **expected)
    v2.gumbel_sample_torch(grid, **args)
    assert torch.equal(args["local_argmax_ptr"], expected["local_argmax_ptr"])
    # float32 / float64 log of numpy and torch may differ in the last bit.
    torch.testing.assert_close(args["local_max_ptr"], expected["local_max_ptr"], rtol=1e-6, atol=1e-6)
    if cache is not None:
        assert torch.equal(args["logits_cache_ptr"], expected["logits_cache_ptr"])


def test_gumbel_sampling_is_seeded_and_matches_vllm_tokens() -> None:
    """Whole rows sampled over several seeds: the final tokens (argmax of the block maxima) agree."""
    g = torch.Generator().manual_seed(5)
    args, grid = _gumbel_args(g, 6, 300, 64, cache=None, draft=False, apply_temp=True, fp64=False)
    args["temp_ptr"] = torch.full((6,), 1.0)
    args["logits_ptr"] = torch.zeros(6, 300)  # the noise alone decides: a pure check of the stream
    expected = clone_args(args)
    vllm_kernel(f"{_MODULE}._gumbel_sample_kernel")(grid, **expected)
    v2.gumbel_sample_torch(grid, **args)

    def tokens(a):
        best = a["local_max_ptr"].argmax(dim=-1, keepdim=True)
        return a["local_argmax_ptr"].gather(-1, best).flatten()

    assert torch.equal(tokens(args), tokens(expected))
    assert torch.equal(args["local_argmax_ptr"], expected["local_argmax_ptr"])
