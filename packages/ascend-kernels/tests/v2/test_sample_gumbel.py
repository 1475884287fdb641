"""V2 temperature / Gumbel sampling: the Ascend Triton kernels (interpreter) against the torch references."""

from __future__ import annotations

import pytest
import torch

from vllm_ascend.kernels._triton.v2 import sample_gumbel as triton_impl
from vllm_ascend.kernels.v2 import sample_gumbel as v2

pytestmark = pytest.mark.usefixtures("launch_grid")


@pytest.mark.parametrize("seed", [0, 1, -1, 2**63 - 1, -(2**63), 0x1234_5678_9ABC_DEF0])
def test_murmur3_uniform_is_bit_exact(seed: int) -> None:
    n = 300
    for pos in (0, 9, 2**31 + 5):
        out = triton_impl.murmur3_uniforms(torch.tensor([seed]), torch.tensor([pos]), n)
        expected = v2.murmur3_uniform32_torch(torch.tensor(seed), torch.tensor(pos), torch.arange(n))
        assert torch.equal(out, expected), (seed, pos)


def _assert_within_one_ulp(actual: torch.Tensor, expected: torch.Tensor) -> None:
    a, e = actual.double(), expected.double()
    mant = {torch.bfloat16: 7, torch.float16: 10, torch.float32: 23}[actual.dtype]
    scale = torch.maximum(a.abs(), e.abs()).clamp_min(torch.finfo(actual.dtype).tiny)
    ulp = torch.exp2(torch.floor(torch.log2(scale)) - mant)
    assert ((a - e).abs() <= ulp).all(), (a - e).abs().max()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("num_tokens", "vocab", "block"),
    [(0, 40, 16), (1, 40, 16), (7, 150, 128), (9, 100, 32), (2, 310, 128)],  # the last: rows split
)
def test_temperature(num_tokens: int, vocab: int, block: int, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(num_tokens * 31 + vocab)
    args = {
        "logits_ptr": (torch.randn(num_tokens, vocab + 3, generator=g) * 4).to(dtype),
        "logits_stride": vocab + 3,
        "expanded_idx_mapping_ptr": torch.randint(0, 8, (num_tokens,), generator=g, dtype=torch.int32),
        "temperature_ptr": torch.tensor([0.0, 1.0, 0.7, 1.5, 0.3, 2.0, 0.0, 0.9]),
        "vocab_size": vocab,
        "BLOCK_SIZE": block,
    }
    grid = (num_tokens, (vocab + block - 1) // block)
    ref = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    v2.temperature_torch(grid, **ref)
    triton_impl.temperature(grid, **args)
    if dtype == torch.float32:
        assert torch.equal(args["logits_ptr"], ref["logits_ptr"])
    else:  # the interpreter truncates the float32 -> bfloat16 store, torch rounds
        _assert_within_one_ulp(args["logits_ptr"], ref["logits_ptr"])
    assert torch.equal(args["logits_ptr"][:, vocab:], ref["logits_ptr"][:, vocab:])


def _gumbel_args(g, num_tokens, vocab, block, *, cache, draft, apply_temp, dtype, fp64=False):
    max_reqs, num_cols = 6, 3
    num_blocks = (vocab + block - 1) // block
    idx = torch.randint(0, max_reqs, (num_tokens,), generator=g, dtype=torch.int32)
    if cache is not None:  # distinct requests: two tokens caching into one row would race
        idx = torch.randperm(max_reqs, generator=g)[:num_tokens].to(torch.int32)
    if num_tokens > 2:
        idx[2] = -1  # a padded row
    logits = (torch.randn(num_tokens, vocab, generator=g) * 3).to(dtype)
    if num_tokens > 1:
        logits[1, 5] = logits[1, 9] = 50.0  # a tie on a greedy or sampled row
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
        args["logits_cache_source_ptr"] = torch.randn(num_tokens, vocab, generator=g).to(dtype)
        args["logits_cache_source_stride"] = vocab
        if cache == "per_token":
            args["logits_cache_col_ptr"] = torch.randperm(num_cols, generator=g)[:1].repeat(num_tokens)
            args["logits_cache_col_ptr"][1::2] = (args["logits_cache_col_ptr"][1::2] + 1) % num_cols
        else:
            args["logits_cache_col_ptr"] = torch.tensor(2)
    return args, (num_tokens, num_blocks)


@pytest.mark.usefixtures("reference_form")  # the torch form and the host form
@pytest.mark.parametrize(
    ("num_tokens", "vocab", "block", "cache", "draft", "apply_temp", "dtype"),
    [
        (0, 50, 32, None, False, True, torch.float32),
        (1, 50, 32, None, False, True, torch.float32),
        (7, 300, 128, None, False, True, torch.float32),  # two tiles per block
        (7, 200, 64, None, True, False, torch.bfloat16),
        (5, 130, 128, "scalar", True, True, torch.float32),
        (5, 130, 64, "per_token", False, False, torch.bfloat16),
        # 2-D grid-stride: on the interpreter's 4 cores, programs (0, j) take every token and blocks
        # j, j + 4, ... (one-tile blocks of 64 here; vLLM's grid on "work")
        (3, 600, 64, None, False, True, torch.float32),
        (5, 700, 64, "scalar", True, True, torch.bfloat16),
        (6, 1000, 128, "per_token", False, True, torch.float32),  # blocks of two tiles
    ],
)
def test_gumbel_sample(num_tokens, vocab, block, cache, draft, apply_temp, dtype) -> None:
    g = torch.Generator().manual_seed(num_tokens * 1000 + vocab)
    args, grid = _gumbel_args(
        g, num_tokens, vocab, block, cache=cache, draft=draft, apply_temp=apply_temp, dtype=dtype
    )
    ref = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    v2.gumbel_sample_torch(grid, **ref)
    triton_impl.gumbel_sample(grid, **args)
    assert torch.equal(args["local_argmax_ptr"], ref["local_argmax_ptr"])
    # log of numpy (interpreter) and torch may differ in the last bit
    torch.testing.assert_close(args["local_max_ptr"], ref["local_max_ptr"], rtol=1e-6, atol=1e-6)
    if cache is not None:
        assert torch.equal(args["logits_cache_ptr"], ref["logits_cache_ptr"])
    if num_tokens > 1 and ref["temp_ptr"][ref["expanded_idx_mapping_ptr"][1]] == 0:
        assert ref["local_argmax_ptr"][1, 0] == 5  # greedy tie: the leftmost


def test_gumbel_sample_fp64_runs_the_reference() -> None:
    g = torch.Generator().manual_seed(3)
    args, grid = _gumbel_args(
        g, 4, 100, 32, cache=None, draft=False, apply_temp=True, dtype=torch.float32, fp64=True
    )
    ref = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    v2.gumbel_sample_torch(grid, **ref)
    triton_impl.gumbel_sample(grid, **args)
    assert torch.equal(args["local_argmax_ptr"], ref["local_argmax_ptr"])
    assert torch.equal(args["local_max_ptr"], ref["local_max_ptr"])


@pytest.mark.usefixtures("reference_form")  # the torch form and the host form
@pytest.mark.parametrize("fp64", [False, True])
def test_gumbel_sample_reference_greedy_rows_draw_no_noise(
    fp64: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Temperature-0 rows (and negative-index rows) are the plain blockwise argmax/max, leftmost on ties,
    NaN read as -inf, -inf past the vocabulary; an all-greedy batch never computes noise, and the input
    logits are left alone."""
    logits = torch.tensor(
        [[1.0, 3.0, 3.0, -2.0, 0.5, float("nan"), 4.0], [float("nan")] * 4 + [-1.0, 2.0, 2.0]]
    )
    before = logits.clone()
    argmax = torch.full((2, 2), -5, dtype=torch.int64)
    local_max = torch.zeros((2, 2), dtype=torch.float64 if fp64 else torch.float32)

    def no_noise(*args, **kwargs):
        raise AssertionError("noise computed for a greedy-only batch")

    monkeypatch.setattr(v2, "gumbel_noise_torch", no_noise)
    v2.gumbel_sample_torch(
        (2, 2), argmax, 2, local_max, 2, None, 0, 0, None, None, 0, logits, 7,
        torch.tensor([0, -1], dtype=torch.int32), torch.tensor([5]), torch.tensor([0, 0]),
        torch.tensor([0.0]), 7, 4, False, True, fp64, False,
    )  # fmt: skip
    assert torch.equal(argmax, torch.tensor([[1, 6], [0, 5]]))
    assert torch.equal(local_max, torch.tensor([[3.0, 4.0], [float("-inf"), 2.0]], dtype=local_max.dtype))
    assert torch.equal(logits.isnan(), before.isnan())
    assert torch.equal(logits.nan_to_num(), before.nan_to_num())


@pytest.mark.usefixtures("reference_form")  # the torch form and the host form
@pytest.mark.parametrize(("vocab", "blocks"), [(10, 4), (8, 2), (3, 1), (12, 5)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gumbel_sample_reference_greedy_batch_is_the_padded_blockwise_argmax(vocab, blocks, dtype) -> None:
    """An all-greedy batch (no copy of the logits): per block of 4 the leftmost maximum and its value,
    blocks partly or wholly past the vocabulary padded with -inf (a wholly padded block: -inf, its first
    token); logits given as a strided view of a wider buffer."""
    g = torch.Generator().manual_seed(vocab * 10 + blocks)
    buffer = (torch.randn(3, vocab + 5, generator=g) * 2).round().to(dtype)  # rounded: ties within blocks
    logits = buffer[:, 1 : vocab + 1]
    argmax = torch.full((3, blocks), -5, dtype=torch.int64)
    local_max = torch.zeros((3, blocks))
    v2.gumbel_sample_torch(
        (3, blocks), argmax, blocks, local_max, blocks, None, 0, 0, None, None, 0, logits, vocab + 5,
        torch.tensor([0, 1, -1], dtype=torch.int32), torch.tensor([5, 6]), torch.tensor([0, 1, 2]),
        torch.tensor([0.0, 0.0]), vocab, 4, False, True, False, False,
    )  # fmt: skip
    covered = min(vocab, 4 * blocks)
    padded = torch.full((3, 4 * blocks), float("-inf"))
    padded[:, :covered] = logits[:, :covered].float()
    view = padded.view(3, blocks, 4)
    assert torch.equal(local_max, view.amax(-1))
    assert torch.equal(argmax, view.argmax(-1) + torch.arange(blocks) * 4)


@pytest.mark.usefixtures("reference_form")  # the torch form and the host form
def test_gumbel_sample_reference_mixed_batch_noises_only_sampled_rows() -> None:
    """In a batch of greedy and sampled rows, the greedy rows equal the greedy-only result and the sampled
    rows equal their result on their own."""
    g = torch.Generator().manual_seed(3)
    vocab, block = 100, 32
    logits = torch.randn(4, vocab, generator=g) * 3
    temp = torch.tensor([0.0, 0.7, 0.0, 1.3])
    seeds, pos = torch.tensor([1, 2, 3, 4]), torch.tensor([10, 11, 12, 13])

    def run(rows: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        n = len(rows)
        argmax, value = torch.zeros((n, 4), dtype=torch.int64), torch.zeros((n, 4))
        v2.gumbel_sample_torch(
            (n, 4), argmax, 4, value, 4, None, 0, 0, None, None, 0, logits[rows].contiguous(), vocab,
            torch.tensor(rows, dtype=torch.int32), seeds, pos[rows], temp, vocab, block, False, True, False,
            False,
        )  # fmt: skip
        return argmax, value

    both = run([0, 1, 2, 3])
    for rows in ([0, 2], [1], [3]):
        alone = run(rows)
        assert torch.equal(both[0][rows], alone[0]) and torch.equal(both[1][rows], alone[1])
    greedy = logits[[0, 2]].reshape(2, -1)
    padded = torch.cat([greedy, torch.full((2, 4 * block - vocab), float("-inf"))], 1).view(2, 4, block)
    assert torch.equal(both[1][[0, 2]], padded.amax(-1))


def test_temperature_work_grid(launch_grid: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's 2-D grid (tokens x 64-column tiles under the interpreter) with no loop on "work" (CUDA's;
    test_temperature compares that variant with the reference); a 1-D grid of at most the interpreter's
    programs on "cores"."""
    seen = []
    jit = triton_impl._temperature_kernel

    class Launches:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                seen.append((tuple(grid), kwargs["PER_ITEM"]))
                return jit[grid](*args, **kwargs)

            return launch

    monkeypatch.setattr(triton_impl, "_temperature_kernel", Launches())
    test_temperature(7, 150, 128, torch.float32)
    assert seen == ([((7, 3), True)] if launch_grid == "work" else [((4,), False)])


def test_gumbel_sample_host_form_serves_a_greedy_batch_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cpu device's form: an all-greedy float32 batch is the numpy block maximum (the torch form is not
    called) and equals the torch form; a batch with a sampled row, or a NaN, goes to the torch form."""
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(3, 10, generator=g)
    args = lambda argmax, value, temp: (  # noqa: E731
        (3, 3), argmax, 3, value, 3, None, 0, 0, None, None, 0, logits, 10,
        torch.tensor([0, 1, -1], dtype=torch.int32), torch.tensor([5, 6]), torch.tensor([0, 1, 2]),
        temp, 10, 4, False, True, False, False,
    )  # fmt: skip
    expected = (torch.zeros((3, 3), dtype=torch.int64), torch.zeros((3, 3)))
    v2.gumbel_sample_torch(*args(*expected, torch.tensor([0.0, 0.0])))
    calls: list[int] = []
    grid_form = v2._gumbel_sample_grid
    monkeypatch.setattr(v2, "_gumbel_sample_grid", lambda *a: calls.append(1) or grid_form(*a))
    got = (torch.full((3, 3), -5, dtype=torch.int64), torch.zeros((3, 3)))
    v2.gumbel_sample_host(*args(*got, torch.tensor([0.0, 0.0])))
    assert not calls and torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    v2.gumbel_sample_host(*args(*got, torch.tensor([0.0, 0.8])))
    assert calls == [1]
    logits[0, 2] = float("nan")
    v2.gumbel_sample_host(*args(*got, torch.tensor([0.0, 0.0])))
    assert calls == [1, 1]
