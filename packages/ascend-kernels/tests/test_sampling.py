"""Sampling kernels (Triton, interpreted) against their torch references on fresh random inputs."""

from __future__ import annotations

import pytest
import torch

import vllm_ascend.kernels as K
from vllm_ascend.kernels import gumbel, logprobs, min_p, temperature, top_k_top_p
from vllm_ascend.kernels._triton import top_k_top_p as tkp_triton

DTYPES = [torch.float32, torch.bfloat16]


def _logits(gen, rows, vocab, dtype, scale=3.0):
    return (torch.randn(rows, vocab, generator=gen) * scale).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_temperature(gen, dtype, close_ulp):
    logits = _logits(gen, 5, 300, dtype)
    temp = torch.rand(5, generator=gen) * 1.5 + 0.1
    temp[1] = 0.0  # greedy row: untouched
    temp[3] = 1.0
    got, want = logits.clone(), logits.clone()
    assert K.apply_temperature(got, temp) is got
    temperature.apply_temperature_torch(want, temp)
    close_ulp(got, want)
    assert torch.equal(got[1], logits[1]) and not torch.equal(got[0], logits[0])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale_first", [True, False])
def test_gumbel_matches_reference_with_the_same_noise(gen, dtype, scale_first):
    rows, vocab = 6, 700
    logits = _logits(gen, rows, vocab, dtype, scale=1.0)
    temp = torch.rand(rows, generator=gen) + 0.3
    temp[2] = 0.0
    seeds = torch.randint(-(2**63), 2**63 - 1, (rows,), generator=gen)
    pos = torch.randint(0, 1 << 40, (rows,), generator=gen)
    got = K.gumbel_sample(logits, temp, seeds, pos, scale_first)
    want = gumbel.gumbel_sample_torch(logits, temp, seeds, pos, scale_first)
    assert got.dtype == torch.int64 and torch.equal(got, want)
    assert got[2] == logits[2].float().argmax()  # greedy row
    assert torch.equal(K.gumbel_sample(logits, temp, seeds, pos, scale_first), got)  # reproducible


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 24])
def test_gumbel_long_rows_match_reference(gen, dtype, rows):
    """Rows of many tiles (1 row: split in chunks and combined; 24: one chunk each), masked tokens,
    sharp (small T) and flat (large T) distributions, a greedy row: the same draws as the reference."""
    vocab = 3000
    logits = _logits(gen, rows, vocab, dtype, scale=4.0)
    logits[0, ::5] = float("-inf")
    logits[0, 64:96] = float("-inf")  # a whole group masked
    temp = torch.rand(rows, generator=gen) * 3 + 0.02
    temp[rows // 2] = 0.0
    seeds = torch.randint(0, 2**62, (rows,), generator=gen)
    for pos in range(3):
        positions = torch.full((rows,), pos, dtype=torch.int64)
        got = K.gumbel_sample(logits, temp, seeds, positions)
        want = gumbel.gumbel_sample_torch(logits, temp, seeds, positions)
        assert torch.equal(got, want)
        assert logits[0, got[0]] > float("-inf")


@pytest.mark.parametrize("prefetch", [1, 2])
@pytest.mark.parametrize(("offset", "vocab"), [(0, 700), (1, 700), (0, 701)])
def test_gumbel_bf16_read_as_words_or_not_draws_the_same(gen, monkeypatch, offset, vocab, prefetch):
    """bfloat16 rows that start on a 4-byte word are read two tokens per word; rows that do not (an
    odd offset or an odd row length) are read token by token; one or two tiles in flight: the same
    draws as the reference."""
    from vllm_ascend.kernels._triton import gumbel as gumbel_triton

    monkeypatch.setitem(gumbel_triton.PREFETCH, torch.bfloat16, prefetch)
    monkeypatch.setattr(gumbel_triton, "DEEP_PREFETCH_TILES", 1)  # every chunk as deep as PREFETCH says
    rows = 5
    base = _logits(gen, rows, vocab + 2, torch.bfloat16, scale=2.0)
    logits = base[:, offset : offset + vocab]
    assert (gumbel_triton._as_words(logits) is not None) == (offset == 0 and vocab % 2 == 0)
    temp = torch.rand(rows, generator=gen) + 0.3
    temp[1] = 0.0
    seeds, pos = torch.randint(0, 2**62, (rows,), generator=gen), torch.arange(rows)
    got = K.gumbel_sample(logits, temp, seeds, pos)
    assert torch.equal(got, gumbel.gumbel_sample_torch(logits, temp, seeds, pos))
    assert got[1] == logits[1].float().argmax()


def test_gumbel_greedy_ties_go_to_the_lowest_token(gen):
    """Equal maxima in one group, in two groups, in two row chunks: the lowest token id wins."""
    logits = torch.randn(3, 5000, generator=gen)
    logits[0, [512, 4]] = 9.0
    logits[1, [4700, 600]] = 9.0  # different blocks
    logits[2, [1, 3]] = 9.0
    temp = torch.zeros(3)
    seeds, pos = torch.zeros(3, dtype=torch.int64), torch.zeros(3, dtype=torch.int64)
    assert K.gumbel_sample(logits, temp, seeds, pos).tolist() == [4, 600, 1]


def test_split_rows_combine_in_their_last_program_and_leave_counters_zeroed(gen):
    from vllm_ascend.kernels._triton import common

    rows, vocab = 3, 2000  # fewer rows than programs: every row is split into chunks
    logits = _logits(gen, rows, vocab, torch.float32)
    temp, seeds, pos = torch.ones(rows), torch.arange(rows), torch.zeros(rows, dtype=torch.int64)
    ids = torch.randint(0, vocab, (rows,), generator=gen)
    for _ in range(2):  # the second call finds the counters the first one left
        got = K.gumbel_sample(logits, temp, seeds, pos)
        assert torch.equal(got, gumbel.gumbel_sample_torch(logits, temp, seeds, pos))
        lp = K.compute_token_logprobs(logits, ids)
        torch.testing.assert_close(lp, logprobs.compute_token_logprobs_torch(logits, ids))
    for name in ("gumbel_counter", "lse_counter"):
        assert not common.counters(name, rows, torch.device("cpu"))[:rows].any()


def test_gumbel_fully_masked_row_takes_token_zero(gen):
    logits = torch.full((3, 100), float("-inf"))
    logits[1, 77] = 0.0
    temp = torch.tensor([0.7, 0.7, 0.0])
    seeds, pos = torch.randint(0, 2**62, (3,), generator=gen), torch.zeros(3, dtype=torch.int64)
    assert K.gumbel_sample(logits, temp, seeds, pos).tolist() == [0, 77, 0]
    assert gumbel.gumbel_sample_torch(logits, temp, seeds, pos).tolist() == [0, 77, 0]


def test_gumbel_position_and_seed_change_the_draw(gen):
    rows, vocab = 64, 16
    logits = torch.zeros(rows, vocab)
    temp = torch.ones(rows)
    seeds = torch.full((rows,), 1234)
    pos = torch.arange(rows)
    by_position = K.gumbel_sample(logits, temp, seeds, pos)
    assert len(set(by_position.tolist())) > 8  # uniform logits: positions give different draws
    by_seed = K.gumbel_sample(logits, temp, torch.arange(rows), torch.zeros(rows, dtype=torch.long))
    assert len(set(by_seed.tolist())) > 8


@pytest.mark.parametrize(
    ("sample", "vocab", "draws"),
    [(K.gumbel_sample, 96, 2000), (gumbel.gumbel_sample_torch, 100, 20000)],
    ids=["kernel-3-groups", "reference-4-groups"],
)
def test_gumbel_is_distributed_as_softmax_of_scaled_logits(gen, chi2_limit, sample, vocab, draws):
    """Both races decide (several groups): the token frequencies follow softmax(logits / T)."""
    t = 0.7
    row = torch.randn(vocab, generator=gen) * 0.5
    logits = row.expand(draws, vocab).contiguous()
    temp = torch.full((draws,), t)
    seeds = torch.full((draws,), int(torch.randint(0, 2**62, (1,), generator=gen)))
    tokens = sample(logits, temp, seeds, torch.arange(draws))
    observed = torch.bincount(tokens, minlength=vocab).double()
    expected = torch.softmax(row.double() / t, 0) * draws
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    limit = chi2_limit(vocab - 1)
    assert chi2 < limit, (
        f"chi-square {chi2:.1f} >= {limit:.1f} ({vocab - 1} dof, p < 1e-4): {observed.tolist()}"
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [5, 12])  # several chunks per row / one chunk per row
def test_min_p(gen, dtype, rows):
    logits = _logits(gen, rows, 333, dtype)
    logits[2, ::7] = float("-inf")
    mp = torch.rand(rows, generator=gen) * 0.3
    mp[0] = 0.0
    mp[3] = 1e-6  # almost every slot holds a kept token: read, not only written
    got, want = logits.clone(), logits.clone()
    K.apply_min_p(got, mp)
    min_p.apply_min_p_torch(want, mp)
    assert torch.equal(got, want)
    assert torch.isinf(got[1:]).any() and not torch.isinf(got[0]).any()


@pytest.mark.parametrize("rows", [5, 12])
def test_min_p_with_temperature_keeps_what_the_scaled_probabilities_keep(gen, rows):
    """The fused form (``T * log(min_p)`` on unscaled logits) keeps the tokens min-p keeps on
    ``logits / T``; greedy rows (``T = 0``) are filtered as at ``T = 1``."""
    logits = _logits(gen, rows, 333, torch.float32)
    mp = torch.rand(rows, generator=gen) * 0.3
    mp[0] = 0.0
    temp = torch.rand(rows, generator=gen) * 2 + 0.2
    temp[1] = 0.0
    got, want = logits.clone(), logits.clone()
    K.apply_min_p(got, mp, temp)
    min_p.apply_min_p_torch(want, mp, temp)
    assert torch.equal(got, want)
    scaled = logits / torch.where(temp > 0, temp, 1.0).unsqueeze(1)
    min_p.apply_min_p_torch(scaled, mp)
    assert torch.equal(torch.isinf(got), torch.isinf(scaled))
    assert not torch.isinf(got[0]).any() and torch.isinf(got[2:]).any()


def _top_k_top_p_case(gen, rows, vocab, dtype, ties):
    logits = _logits(gen, rows, vocab, dtype)
    if ties:
        logits = logits.round()  # many equal values, also at the thresholds
    logits[0, ::3] = float("-inf")  # earlier filters may have masked tokens
    k = torch.randint(1, vocab // 2, (rows,), generator=gen, dtype=torch.int32)
    k[1] = 0  # top-k off
    k[2] = tkp_triton.CAP + 10  # more candidates than the scratch holds
    p = torch.rand(rows, generator=gen) * 0.7 + 0.25
    p[3] = 1.0  # top-p off
    return logits, k, p


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("which", ["k", "p", "kp"])
def test_top_k_top_p_matches_the_sort_reference(gen, dtype, ties, which):
    logits, k, p = _top_k_top_p_case(gen, 5, 256, dtype, ties)
    k = k if "k" in which else None
    p = p if "p" in which else None
    got, want = logits.clone(), logits.clone()
    assert K.apply_top_k_top_p(got, k, p) is got
    top_k_top_p.apply_top_k_top_p_torch(want, k, p)
    assert torch.equal(torch.isinf(got), torch.isinf(want)), (
        torch.isfinite(got).sum(1),
        torch.isfinite(want).sum(1),
    )
    assert torch.equal(got, want)
    if which == "k":
        kept = torch.isfinite(got).sum(1)
        assert kept[4] >= k[4] and kept[1] == torch.isfinite(logits[1]).sum()


def _spy(monkeypatch, name, record):
    """Wrap the interpreted ``tkp_triton.<name>``: after each call, ``record(args, result)``."""
    real = getattr(tkp_triton, name)

    def spy(*args):
        out = real(*args)
        record(args, out)
        return out

    monkeypatch.setattr(tkp_triton, name, spy)


def test_top_k_top_p_takes_the_bounded_path_and_the_whole_row_fallback(gen, monkeypatch):
    """Small k / p are bounded by the sub-tile maxima and searched on a gathered scratch; a k above
    the number of sub-tiles, and a p the maxima's mass cannot reach, search the whole row."""
    gathered, searched = [], []
    _spy(monkeypatch, "_gather", lambda args, n: gathered.append(int(n)))
    _spy(monkeypatch, "_select", lambda args, _: searched.append(int(args[3])))  # n_ready -1: whole row
    vocab = 256
    logits = _logits(gen, 4, vocab, torch.float32) * 3
    logits[3] *= 0.01  # nearly flat: the maxima hold about 1/SUB of the mass
    k = torch.tensor([2, vocab // tkp_triton.SUB + 1, 0, 0], dtype=torch.int32)
    p = torch.tensor([1.0, 1.0, 0.2, 0.999])
    got, want = logits.clone(), logits.clone()
    K.apply_top_k_top_p(got, k, p)
    top_k_top_p.apply_top_k_top_p_torch(want, k, p)
    assert torch.equal(got, want)
    assert len(gathered) == 2 and all(0 < n <= tkp_triton.CAP for n in gathered)
    assert searched == [gathered[0], -1, gathered[1], -1]


def test_exact_search_tiers_agree_with_the_sort_reference(gen, monkeypatch):
    """Candidates that fit one per lane, several per lane (registers, fewer pivots) and a whole row
    (streamed) each take their own exact-search tier; every tier keeps what the sort keeps."""
    tiles = set()
    _spy(monkeypatch, "_narrow", lambda args, _: tiles.add(int(args[13])))  # BLOCK: the tier's tile
    for vocab, k in ((256, 3), (256, 40), (256, 90), (4096, 600)):
        logits = _logits(gen, 3, vocab, torch.float32)
        logits[2] = 1.5  # all tied: the row itself is searched
        kk = torch.full((3,), k, dtype=torch.int32)
        for p in (None, torch.tensor([0.9, 0.5, 1.0])):
            got, want = logits.clone(), logits.clone()
            K.apply_top_k_top_p(got, kk, p)
            top_k_top_p.apply_top_k_top_p_torch(want, kk, p)
            assert torch.equal(got, want), (vocab, k, p)
    per_lane = 32  # the interpreter's one-candidate-per-lane tile
    assert {per_lane, per_lane * int(tkp_triton.REG_PER_LANE)} <= tiles and max(tiles) > 64, tiles


def test_small_k_is_bounded_by_the_group_maxima(gen, monkeypatch):
    """A k far below the number of sub-tile groups takes its bound from the group maxima (GROUP
    times fewer values to pass over); a larger k from the sub-tile maxima. Same kept sets."""
    sizes = []
    _spy(monkeypatch, "_bound", lambda args, _: sizes.append(int(args[1])))  # how many maxima it read
    vocab = 2048
    n_sub = vocab // tkp_triton.SUB
    n_grp = n_sub // tkp_triton.GROUP
    logits = _logits(gen, 2, vocab, torch.float32)
    k = torch.tensor([2, n_grp // 2], dtype=torch.int32)
    got, want = logits.clone(), logits.clone()
    K.apply_top_k_top_p(got, k, None)
    top_k_top_p.apply_top_k_top_p_torch(want, k, None)
    assert torch.equal(got, want) and sizes == [n_grp, n_sub]
    sizes.clear()
    _check_topk_logprobs(logits, 3, torch.tensor([0, 1]))
    assert sizes == [n_grp, n_grp]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_top_p_alone_splits_its_search_and_falls_back_when_the_bracket_overflows(gen, monkeypatch, dtype):
    """Top-p without top-k narrows a bracket in split rounds and searches it in the scratch; a row of
    ties keeps the whole row in its bracket, more than the scratch holds, and searches the row. Both
    forms: the bucket copy and the mask fused (float32) and apart (16-bit)."""
    assert tkp_triton.TOP_P_FUSED_MASK[torch.float32] and not tkp_triton.TOP_P_FUSED_MASK[torch.bfloat16]
    whole_row = []
    _spy(monkeypatch, "_select", lambda args, _: whole_row.append(int(args[3])))
    vocab = 4 * tkp_triton.CAP
    logits = _logits(gen, 4, vocab, dtype) * 3
    logits[2] = 1.5  # ties everywhere
    logits[0, 7] = logits[0].max() + 4  # one clear maximum (random 16-bit logits may tie at the top)
    p = torch.tensor([0.01, 0.9, 0.5, 0.999])
    got, want = logits.clone(), logits.clone()
    K.apply_top_k_top_p(got, None, p)
    top_k_top_p.apply_top_k_top_p_torch(want, None, p)
    assert torch.equal(got, want)
    assert whole_row == [-1]
    assert torch.isfinite(got).sum(1).tolist()[2] == vocab and torch.isfinite(got[0]).sum() == 1


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab", [7, 300, 1000])
def test_top_k_top_p_edge_rows(gen, dtype, vocab):
    """k >= V, k = V - 1, p = 1, a row with one finite logit, an all -inf row, a row with top-k off
    and top-p on beside top-k rows, odd vocabularies; top-k logprobs of the same rows up to n = V."""
    rows = 8
    logits = _logits(gen, rows, vocab, dtype)
    logits[2] = float("-inf")
    logits[2, vocab // 2] = 1.0
    logits[3] = float("-inf")
    k = torch.tensor([vocab, vocab + 5, 3, 2, 0, vocab - 1, 1, 4], dtype=torch.int64)
    p = torch.tensor([1.0, 0.5, 0.9, 0.9, 0.6, 0.99, 1.0, 0.01])
    for kk, pp in ((k, None), (None, p), (k, p), (k, torch.ones(rows))):
        got, want = logits.clone(), logits.clone()
        K.apply_top_k_top_p(got, kk, pp)
        top_k_top_p.apply_top_k_top_p_torch(want, kk, pp)
        assert torch.equal(got, want), (kk, pp)
    assert torch.equal(got[:5], logits[:5])  # k >= V, k off, one finite logit, all -inf; p = 1
    chosen = torch.randint(0, vocab, (rows,), generator=gen)
    chosen[2] = vocab // 2
    for n in (0, 1, min(vocab, 5), vocab):
        _check_topk_logprobs(logits, n, chosen)


def test_top_k_keeps_exactly_k_distinct_values(gen):
    logits = torch.randperm(200, generator=gen).float().unsqueeze(0)
    k = torch.tensor([17])
    K.apply_top_k_top_p(logits, k, None)
    assert sorted(logits[torch.isfinite(logits)].tolist()) == [float(v) for v in range(183, 200)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [4, 9])  # several chunks per row / one chunk per row
def test_token_logprobs(gen, dtype, rows):
    logits = _logits(gen, rows, 500, dtype)
    logits[0, :300] = float("-inf")  # a chunk without finite values
    for ids in (
        torch.randint(300, 500, (rows,), generator=gen),
        torch.randint(300, 500, (rows, 3), generator=gen),
    ):
        got = K.compute_token_logprobs(logits, ids)
        want = logprobs.compute_token_logprobs_torch(logits, ids)
        assert got.shape == ids.shape and got.dtype == torch.float32
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def _check_topk_logprobs(logits, n, chosen):
    ids, vals, ranks = K.compute_topk_logprobs(logits, n, chosen)
    ref_ids, ref_vals, ref_ranks = logprobs.compute_topk_logprobs_torch(logits, n, chosen)
    assert ids.shape == vals.shape == (logits.shape[0], n + 1) and ids.dtype == torch.int64
    assert torch.equal(ids, ref_ids) and torch.equal(ranks, ref_ranks)
    torch.testing.assert_close(vals, ref_vals, rtol=1e-5, atol=1e-5, equal_nan=True)
    assert ids[:, 0].tolist() == chosen.tolist()
    return ids, vals, ranks


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("rows", "vocab", "n"), [(4, 400, 5), (9, 400, 20), (3, 333, 64), (2, 100, 0)])
def test_topk_logprobs_with_ranks(gen, dtype, rows, vocab, n):
    """4 rows: several summary chunks per row; 9: one. ``n`` = 64 spans several rank steps."""
    logits = _logits(gen, rows, vocab, dtype)
    chosen = torch.randint(0, vocab, (rows,), generator=gen)
    chosen[0] = logits[0].float().argmax()
    _, vals, ranks = _check_topk_logprobs(logits, n, chosen)
    assert ranks[0] == 1
    if n:
        assert bool((vals[:, 1:-1] >= vals[:, 2:]).all()) and torch.equal(vals[0, 0], vals[0, 1])


@pytest.mark.parametrize("dtype", DTYPES)
def test_topk_logprobs_ties_and_masked_rows(gen, dtype):
    """Equal logits come in token order, also when more sub-tiles reach the n-th value than the
    search lists (a constant row); rows with fewer finite logits than n fill up with ``-inf`` ones;
    ``n`` above the number of sub-tiles searches the whole row."""
    vocab = 700
    logits = _logits(gen, 5, vocab, dtype).round()  # many equal values
    logits[1] = 0.0
    logits[2, ::3] = 1.0
    logits[3] = float("-inf")
    logits[3, [5, 100, 600]] = torch.tensor([1.0, 2.0, 1.0], dtype=dtype)
    chosen = torch.randint(0, vocab, (5,), generator=gen)
    chosen[3] = 100
    ids, _, ranks = _check_topk_logprobs(logits, 20, chosen)
    assert ids[1, 1:].tolist() == list(range(20)) and ranks[1] == 1
    assert ids[3, 1:5].tolist() == [100, 5, 600, 0] and ranks[3] == 1
    _check_topk_logprobs(logits, 200, chosen)


def test_topk_logprobs_above_the_kernel_limit_use_the_stable_sort(gen, monkeypatch):
    from vllm_ascend.kernels._triton import logprobs as lp_triton

    def no_kernel(*args):
        raise AssertionError("the Triton path must not serve n > TRITON_MAX_LOGPROBS")

    monkeypatch.setattr(lp_triton, "compute_topk_logprobs", no_kernel)
    n = logprobs.TRITON_MAX_LOGPROBS + 1
    logits = _logits(gen, 2, n + 5, torch.bfloat16)
    ids, _, _ = _check_topk_logprobs(logits, n, torch.tensor([0, 1]))
    stable = logits[0].float().sort(descending=True, stable=True).indices[:n]
    assert ids[0, 1:].tolist() == stable.tolist()  # bf16 ties: equal logits in token order


def test_topk_logprobs_rejects_bad_counts():
    logits = torch.zeros(2, 10)
    for n in (-1, 11):
        with pytest.raises(ValueError, match=r"num_logprobs must be in \[0, 10\].*got " + str(n)):
            K.compute_topk_logprobs(logits, n, torch.zeros(2, dtype=torch.int64))
