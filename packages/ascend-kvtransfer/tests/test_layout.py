"""Cache layouts from real tensors, and the copy plan applied byte for byte between prefill and decode caches."""

from __future__ import annotations

import ctypes
import re

import pytest
import torch

from vllm_ascend.kvtransfer.layout import (
    LayerLayout,
    LayoutError,
    RankView,
    Region,
    check_tp,
    describe_cache,
    notified_ranks,
    plan_copies,
    source_ranks,
)

NB, BS, D = 6, 3, 8  # blocks, tokens per block, head dim
LAYERS = ("model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn")


# -- describe_cache ------------------------------------------------------------------------------
def test_kv_split_cache():
    cache = torch.empty(2, NB, BS, 4, D, dtype=torch.float16)
    layout = describe_cache("l0", cache, NB, block_size=BS, num_heads=4, replicated=False)
    block = BS * 4 * D * 2
    base = cache.data_ptr()
    assert layout == LayerLayout(
        "l0",
        [
            Region(base, block, block, BS, 4 * D * 2, 4, D * 2, D * 2),
            Region(base + NB * block, block, block, BS, 4 * D * 2, 4, D * 2, D * 2),
        ],
        False,
    )


def test_fused_per_layer_cache():
    cache = torch.empty(NB, BS, 2, D, dtype=torch.bfloat16)
    layout = describe_cache("l0", cache, NB, block_size=BS, num_heads=2, replicated=False)
    assert layout.regions == [
        Region(cache.data_ptr(), BS * 2 * D * 2, BS * 2 * D * 2, BS, 2 * D * 2, 2, D * 2, D * 2)
    ]
    assert layout.replicated is False


def test_permuted_view_is_described_by_its_storage():
    # logical [blocks, heads, tokens, dim] over token-major storage [blocks, tokens, heads, dim]
    cache = torch.empty(NB, BS, 4, D, dtype=torch.float16).permute(0, 2, 1, 3)
    assert cache.shape == (NB, 4, BS, D) and not cache.is_contiguous()
    layout = describe_cache("l0", cache, NB, block_size=BS, num_heads=4, replicated=False)
    assert layout.regions == [
        Region(cache.data_ptr(), BS * 4 * D * 2, BS * 4 * D * 2, BS, 4 * D * 2, 4, D * 2, D * 2)
    ]


def test_head_major_storage_is_a_grid_of_cells():
    # physical [blocks, heads, tokens, dim]: the same tokens x heads grid, rows of one cell apart
    cache = torch.empty(NB, 4, BS, D).permute(0, 2, 1, 3)
    region = describe_cache("l0", cache, NB, block_size=BS, num_heads=4, replicated=False).regions[0]
    assert (
        region.block_len,
        region.rows,
        region.row_stride,
        region.heads,
        region.head_stride,
        region.cell_bytes,
    ) == (
        BS * 4 * D * 4,
        BS,
        D * 4,
        4,
        BS * D * 4,
        D * 4,
    )


def test_as_many_heads_as_tokens_follows_vllms_logical_order():
    # logical [blocks, heads, tokens, dim] (vLLM's order) when heads == block_size
    cache = torch.empty(NB, 4, 4, D)
    region = describe_cache("l0", cache, NB, block_size=4, num_heads=4, replicated=False).regions[0]
    assert (region.rows, region.row_stride, region.heads, region.head_stride) == (4, D * 4, 4, 4 * D * 4)


@pytest.mark.parametrize(
    "cache",
    [
        lambda: torch.empty(2, NB, BS, 1, D),
        lambda: torch.empty(NB, BS, 1, D),
        lambda: torch.empty(NB, BS, 1, D).permute(0, 2, 1, 3),
    ],
    ids=["split", "fused", "permuted"],
)
def test_one_head_per_rank_can_still_be_cut(cache):
    # GQA with as many ranks as KV heads: the head dimension has size 1
    region = describe_cache("l0", cache(), NB, block_size=BS, num_heads=1, replicated=False).regions[0]
    assert (region.rows, region.row_stride, region.heads, region.cell_bytes) == (BS, D * 4, 1, D * 4)


def test_mla_latent_cache_is_replicated_and_whole():
    cache = torch.empty(NB, BS, 576, dtype=torch.bfloat16)
    layout = describe_cache("mla", cache, NB, block_size=BS, num_heads=1, replicated=True)
    assert layout == LayerLayout("mla", [Region(cache.data_ptr(), BS * 576 * 2, BS * 576 * 2)], True)


def test_int8_cache_counts_bytes():
    cache = torch.zeros(2, NB, BS, 2, D, dtype=torch.int8)
    regions = describe_cache("q", cache, NB, block_size=BS, num_heads=2, replicated=False).regions
    assert [(r.block_stride, r.block_len, r.row_stride, r.cell_bytes) for r in regions] == [
        (BS * 2 * D, BS * 2 * D, 2 * D, D)
    ] * 2
    assert regions[1].base - regions[0].base == NB * BS * 2 * D


def test_view_into_a_larger_buffer_starts_at_its_own_address():
    buffer = torch.empty(3 * NB * BS * 2 * D, dtype=torch.float16)
    cache = buffer[NB * BS * 2 * D :].view(2, NB, BS, 2, D)
    regions = describe_cache("l0", cache, NB, block_size=BS, num_heads=2, replicated=False).regions
    assert regions[0].base == buffer.data_ptr() + NB * BS * 2 * D * 2


def test_non_contiguous_block_is_refused():
    cache = torch.empty(NB, BS, 2, 2 * D)[..., :D]
    with pytest.raises(LayoutError) as info:
        describe_cache("model.layers.3", cache, NB, block_size=BS, num_heads=2, replicated=False)
    assert str(info.value) == (
        f"KV cache of layer 'model.layers.3' (shape {(NB, BS, 2, D)}, strides {(BS * 4 * D, 4 * D, 2 * D, 1)}): "
        "a block's elements are not contiguous, so blocks cannot be moved as byte ranges"
    )


def test_no_block_dimension_is_refused():
    message = f"KV cache of layer 'l' has shape {(2, 5, BS, 2, D)}: no dimension of {NB} blocks"
    with pytest.raises(LayoutError, match=re.escape(message)):
        describe_cache("l", torch.empty(2, 5, BS, 2, D), NB, block_size=BS, num_heads=2, replicated=False)


# -- the copy plan, applied --------------------------------------------------------------------
class Layout:
    """A cache layout vLLM hands the connector: how to build it and where its heads and blocks are."""

    def __init__(self, name, build, head_dim, block_dim):
        self.name, self.build, self.head_dim, self.block_dim = name, build, head_dim, block_dim

    def heads(self, t, lo, hi):
        index = [slice(None)] * t.dim()
        index[self.head_dim] = slice(lo, hi)
        return t[tuple(index)]

    def block(self, t, i):
        return t.select(self.block_dim, i)

    def __repr__(self):
        return self.name


LAYOUTS = [
    Layout("split", lambda heads, dtype: torch.empty(2, NB, BS, heads, D, dtype=dtype), 3, 1),
    Layout("fused", lambda heads, dtype: torch.empty(NB, BS, heads, D, dtype=dtype), 2, 0),
    Layout(
        "permuted", lambda heads, dtype: torch.empty(NB, BS, heads, D, dtype=dtype).permute(0, 2, 1, 3), 1, 0
    ),
]


def _random(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.int8:
        return torch.randint(-128, 128, shape, generator=g, dtype=torch.int8)
    return torch.randn(shape, generator=g).to(dtype)


class Instance:
    """One instance's caches: the model's full cache ``full`` split over ``tp`` ranks by heads."""

    def __init__(self, layout, tp, heads, dtype, seed):
        self.layout, self.tp, self.per_rank = layout, tp, heads // tp
        self.ranks = []  # per rank: {layer: tensor}
        for rank in range(tp):
            caches = {}
            for n, name in enumerate(LAYERS):
                t = layout.build(self.per_rank, dtype)
                t.copy_(_random(t.shape, dtype, seed * 100 + rank * 10 + n))
                caches[name] = t
            self.ranks.append(caches)

    def view(self, rank):
        layers = [
            describe_cache(name, t, NB, block_size=BS, num_heads=self.per_rank, replicated=False)
            for name, t in self.ranks[rank].items()
        ]
        return RankView(layers, rank, self.tp)

    def snapshot(self):
        return [{k: v.clone() for k, v in caches.items()} for caches in self.ranks]

    def full_block(self, name, i):
        """Block ``i`` of layer ``name`` with every head, in head order."""
        dim = self.layout.head_dim - (1 if self.layout.block_dim < self.layout.head_dim else 0)
        return torch.cat([self.layout.block(caches[name], i) for caches in self.ranks], dim=dim)


def _apply(plan):
    here, there, lengths = plan
    for h, t, n in zip(here, there, lengths, strict=True):
        ctypes.memmove(h, t, n)


def _read(decode, prefill, local, remote):
    """Every decode rank reads from the prefill ranks holding its heads; returns the range counts."""
    counts = []
    for rank in range(decode.tp):
        for source in source_ranks(rank, decode.tp, prefill.tp, replicated=False):
            plan = plan_copies(decode.view(rank), prefill.view(source), local, remote)
            counts.append(len(plan[2]))
            _apply(plan)
    return counts


def _check(decode, prefill, before, local, remote):
    for name in LAYERS:
        for i, j in zip(local, remote, strict=True):
            assert torch.equal(decode.full_block(name, i), prefill.full_block(name, j)), (name, i, j)
        # nothing outside the target blocks changed
        untouched = [b for b in range(NB) if b not in local]
        for rank, caches in enumerate(decode.ranks):
            for b in untouched:
                assert torch.equal(
                    decode.layout.block(caches[name], b), decode.layout.block(before[rank][name], b)
                )


@pytest.mark.parametrize("layout", LAYOUTS, ids=repr)
@pytest.mark.parametrize("dtype", [torch.float16, torch.int8])
def test_same_tp_moves_whole_blocks_and_merges_consecutive_ones(layout, dtype):
    prefill = Instance(layout, 1, 4, dtype, seed=1)
    decode = Instance(layout, 1, 4, dtype, seed=2)
    before = decode.snapshot()
    local, remote = [1, 2, 3], [3, 4, 5]
    counts = _read(decode, prefill, local, remote)
    regions = 2 if layout.name == "split" else 1
    # consecutive blocks on both sides: one range per region and layer
    assert counts == [regions * len(LAYERS)]
    _check(decode, prefill, before, local, remote)


@pytest.mark.parametrize("layout", LAYOUTS, ids=repr)
def test_same_tp_scattered_blocks_are_not_merged(layout):
    prefill = Instance(layout, 2, 4, torch.float16, seed=1)
    decode = Instance(layout, 2, 4, torch.float16, seed=2)
    before = decode.snapshot()
    local, remote = [5, 0, 2], [1, 2, 0]
    counts = _read(decode, prefill, local, remote)
    regions = 2 if layout.name == "split" else 1
    assert counts == [regions * len(LAYERS) * 3] * 2
    _check(decode, prefill, before, local, remote)


@pytest.mark.parametrize("layout", LAYOUTS, ids=repr)
@pytest.mark.parametrize("prefill_tp,decode_tp", [(2, 1), (4, 1), (1, 2), (1, 4), (4, 2), (2, 4)])
def test_different_tp_moves_each_ranks_heads(layout, prefill_tp, decode_tp):
    prefill = Instance(layout, prefill_tp, 4, torch.float16, seed=3)
    decode = Instance(layout, decode_tp, 4, torch.float16, seed=4)
    before = decode.snapshot()
    local, remote = [0, 4, 5], [2, 3, 1]
    counts = _read(decode, prefill, local, remote)
    regions = 2 if layout.name == "split" else 1
    # one range per token row of every block (head slices are never adjacent on both sides)
    per_source = regions * len(LAYERS) * len(local) * BS
    assert counts == [per_source] * (decode_tp * max(1, prefill_tp // decode_tp))
    _check(decode, prefill, before, local, remote)


def test_prefill_tp2_to_decode_tp1_puts_each_half_in_head_order():
    layout = LAYOUTS[0]
    prefill = Instance(layout, 2, 4, torch.float16, seed=5)
    decode = Instance(layout, 1, 4, torch.float16, seed=6)
    _read(decode, prefill, [3], [1])
    got = decode.ranks[0][LAYERS[0]][:, 3]  # [2, BS, 4, D]
    assert torch.equal(got[:, :, :2], prefill.ranks[0][LAYERS[0]][:, 1])
    assert torch.equal(got[:, :, 2:], prefill.ranks[1][LAYERS[0]][:, 1])


def test_prefill_tp1_to_decode_tp2_gives_each_rank_its_slice():
    layout = LAYOUTS[1]
    prefill = Instance(layout, 1, 4, torch.float16, seed=7)
    decode = Instance(layout, 2, 4, torch.float16, seed=8)
    _read(decode, prefill, [0], [2])
    source = prefill.ranks[0][LAYERS[1]][2]  # [BS, 4, D]
    assert torch.equal(decode.ranks[0][LAYERS[1]][0], source[:, :2])
    assert torch.equal(decode.ranks[1][LAYERS[1]][0], source[:, 2:])


def _latent(seed):
    t = _random((NB, BS, 576), torch.bfloat16, seed)
    return t, RankView([describe_cache("mla", t, NB, block_size=BS, num_heads=1, replicated=True)], 0, 1)


@pytest.mark.parametrize("here_tp,there_tp", [(1, 2), (2, 1), (4, 2)])
def test_mla_replicated_moves_whole_blocks_across_tp(here_tp, there_tp):
    assert len(source_ranks(here_tp - 1, here_tp, there_tp, replicated=True)) == 1
    prefill, pv = _latent(1)
    decode, dv = _latent(2)
    before = decode.clone()
    here = RankView(dv.layers, here_tp - 1, here_tp)
    there = RankView(pv.layers, 0, there_tp)
    plan = plan_copies(here, there, [0, 1, 4], [5, 3, 4])
    assert plan[2] == [BS * 576 * 2] * 3
    _apply(plan)
    assert torch.equal(decode[[0, 1, 4]], prefill[[5, 3, 4]])
    assert torch.equal(decode[[2, 3, 5]], before[[2, 3, 5]])


def test_empty_block_lists_plan_nothing():
    _, view = _latent(1)
    assert plan_copies(view, view, [], []) == ([], [], [])


# -- refusals ----------------------------------------------------------------------------------
def _view(heads=2, dtype=torch.float16, names=LAYERS, tp=(0, 1), block_size=BS):
    caches = [torch.empty(2, NB, block_size, heads, D, dtype=dtype) for _ in names]
    layers = [
        describe_cache(n, c, NB, block_size=block_size, num_heads=heads, replicated=False)
        for n, c in zip(names, caches, strict=True)
    ]
    return RankView(layers, *tp)


def test_mismatched_block_counts_are_refused():
    with pytest.raises(LayoutError, match=r"^2 local blocks cannot take 3 remote blocks$"):
        plan_copies(_view(), _view(), [0, 1], [0, 1, 2])


def test_different_layer_names_are_refused():
    with pytest.raises(LayoutError, match=re.escape("prefill and decode hold different attention layers")):
        plan_copies(_view(), _view(names=(LAYERS[0], "model.layers.9.attn")), [0], [0])
    with pytest.raises(LayoutError, match=re.escape("prefill and decode hold different attention layers")):
        plan_copies(_view(), _view(names=LAYERS[:1]), [0], [0])


@pytest.mark.parametrize(
    ("there", "message"),
    [
        (lambda: _view(dtype=torch.float32), f"layer {LAYERS[0]!r}: local blocks of {BS * 2 * D * 2} bytes"),
        (
            lambda: _view(heads=4),
            f"layer {LAYERS[0]!r}: 4 KV heads on each of 1 ranks on one side, 2 KV heads",
        ),
        (lambda: _view(block_size=2 * BS), f"layer {LAYERS[0]!r}: local blocks of {BS * 2 * D * 2} bytes"),
    ],
    ids=["dtype", "heads", "block_size"],
)
def test_different_blocks_are_refused(there, message):
    with pytest.raises(LayoutError, match=re.escape(message)):
        plan_copies(_view(), there(), [0], [0])


def test_different_region_counts_are_refused():
    fused = torch.empty(NB, BS, 2, D, dtype=torch.float16)
    there = RankView(
        [describe_cache(n, fused, NB, block_size=BS, num_heads=2, replicated=False) for n in LAYERS], 0, 1
    )
    with pytest.raises(LayoutError, match=re.escape(f"layer {LAYERS[0]!r}: 2 local regions, 1 remote")):
        plan_copies(_view(), there, [0], [0])


def test_different_tp_needs_equal_cells():
    there_cache = torch.empty(NB, BS, 1, D)
    there = RankView(
        [describe_cache("l", there_cache, NB, block_size=BS, num_heads=1, replicated=False)], 0, 2
    )
    float16 = torch.empty(NB, BS, 2, D, dtype=torch.float16)
    here = RankView([describe_cache("l", float16, NB, block_size=BS, num_heads=2, replicated=False)], 0, 1)
    with pytest.raises(LayoutError, match="grids of tokens x heads with equal cells on both sides"):
        plan_copies(here, there, [0], [0])


def test_head_major_and_token_major_exchange_heads_across_tp():
    """Decode TP=1 holding head-major blocks reads the token-major blocks of two prefill ranks."""
    prefill = [torch.randn(NB, BS, 1, D) for _ in range(2)]
    decode = torch.zeros(NB, 2, BS, D)  # head-major storage, logical [blocks, tokens, heads, dim] below
    view = decode.permute(0, 2, 1, 3)
    here = RankView([describe_cache("l", view, NB, block_size=BS, num_heads=2, replicated=False)], 0, 1)
    for rank, cache in enumerate(prefill):
        there = RankView(
            [describe_cache("l", cache, NB, block_size=BS, num_heads=1, replicated=False)], rank, 2
        )
        h, t, n = plan_copies(here, there, [1, 4], [2, 5])
        for a, b, length in zip(h, t, n, strict=True):
            ctypes.memmove(a, b, length)
    for rank, cache in enumerate(prefill):
        assert torch.equal(view[1, :, rank], cache[2, :, 0]) and torch.equal(view[4, :, rank], cache[5, :, 0])
    assert decode[[0, 2, 3, 5]].abs().sum() == 0


# -- rank tables -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "local_rank,local_tp,remote_tp,replicated,ranks",
    [
        (0, 1, 1, False, [0]),
        (1, 2, 2, False, [1]),
        (0, 1, 2, False, [0, 1]),
        (0, 1, 4, False, [0, 1, 2, 3]),
        (1, 2, 4, False, [2, 3]),
        (1, 2, 4, True, [2]),
        (0, 1, 4, True, [0]),
        (0, 2, 1, False, [0]),
        (1, 2, 1, False, [0]),
        (3, 4, 2, False, [1]),
        (2, 4, 2, False, [1]),
        (1, 4, 2, True, [0]),
    ],
)
def test_source_ranks(local_rank, local_tp, remote_tp, replicated, ranks):
    assert source_ranks(local_rank, local_tp, remote_tp, replicated) == ranks


@pytest.mark.parametrize("local_tp,remote_tp", [(1, 1), (1, 2), (2, 1), (1, 4), (4, 1), (2, 8), (8, 2)])
def test_notified_ranks_cover_every_remote_rank_evenly(local_tp, remote_tp):
    heard: dict[int, int] = {}
    for rank in range(local_tp):
        for remote in notified_ranks(rank, local_tp, remote_tp):
            heard[remote] = heard.get(remote, 0) + 1
    assert heard == {r: max(1, local_tp // remote_tp) for r in range(remote_tp)}


def test_notified_ranks_ignore_replication():
    assert notified_ranks(0, 1, 4) == [0, 1, 2, 3]


@pytest.mark.parametrize("a,b", [(1, 1), (1, 8), (8, 1), (2, 4), (16, 4)])
def test_check_tp_accepts_divisors(a, b):
    """Accepted sizes: every remote rank hears from some local rank, the same number each."""
    check_tp(a, b)
    heard = [r for rank in range(a) for r in notified_ranks(rank, a, b)]
    assert sorted(set(heard)) == list(range(b))
    assert {heard.count(r) for r in range(b)} == {max(1, a // b)}


@pytest.mark.parametrize("a,b", [(2, 3), (3, 2), (4, 6), (6, 4)])
def test_check_tp_refuses_non_divisors(a, b):
    with pytest.raises(LayoutError) as info:
        check_tp(a, b)
    assert str(info.value) == (
        f"prefill and decode tensor parallel sizes must divide one another, got {a} and {b}"
    )


# -- fewer KV heads than ranks: vLLM gives each rank a copy of one head ----------------------------
def _replicated_heads(tp, kv_heads, seed):
    """Per rank a [2, NB, BS, 1, D] cache holding head ``rank * kv_heads // tp`` of the model's caches."""
    model = _random((2, NB, BS, kv_heads, D), torch.float16, seed)
    caches = [model[:, :, :, [rank * kv_heads // tp]].contiguous() for rank in range(tp)]
    views = [
        RankView([describe_cache("l", c, NB, block_size=BS, num_heads=1, replicated=False)], rank, tp)
        for rank, c in enumerate(caches)
    ]
    return model, caches, views


def _own_heads(tp, kv_heads, seed):
    model = _random((2, NB, BS, kv_heads, D), torch.float16, seed)
    per = kv_heads // tp
    caches = [model[:, :, :, rank * per : (rank + 1) * per].contiguous() for rank in range(tp)]
    views = [
        RankView([describe_cache("l", c, NB, block_size=BS, num_heads=per, replicated=False)], rank, tp)
        for rank, c in enumerate(caches)
    ]
    return model, caches, views


@pytest.mark.parametrize(
    "decode_tp,prefill_tp,kv_heads", [(2, 1, 1), (4, 2, 2), (4, 1, 2), (1, 4, 2), (2, 4, 2), (4, 8, 2)]
)
def test_replicated_kv_heads_reach_every_rank(decode_tp, prefill_tp, kv_heads):
    build = {True: _replicated_heads, False: _own_heads}
    p_model, _, p_views = build[prefill_tp > kv_heads](prefill_tp, kv_heads, 1)
    _, d_caches, d_views = build[decode_tp > kv_heads](decode_tp, kv_heads, 2)
    local, remote = [0, 2], [4, 1]
    for rank in range(decode_tp):
        for source in source_ranks(rank, decode_tp, prefill_tp, replicated=False):
            _apply(plan_copies(d_views[rank], p_views[source], local, remote))
    for rank, cache in enumerate(d_caches):
        if decode_tp > kv_heads:
            heads = [rank * kv_heads // decode_tp]
        else:
            per = kv_heads // decode_tp
            heads = list(range(rank * per, (rank + 1) * per))
        assert torch.equal(cache[:, local], p_model[:, remote][:, :, :, heads]), rank


def test_different_head_totals_are_refused():
    _, _, here = _own_heads(1, 4, 1)
    _, _, there = _own_heads(2, 4, 2)
    there = [RankView(v.layers, v.tp_rank, 4) for v in there]  # 2 heads on each of 4 ranks: 8 in all
    with pytest.raises(LayoutError) as info:
        plan_copies(here[0], there[0], [0], [0])
    assert str(info.value) == (
        "layer 'l': 2 KV heads on each of 4 ranks on one side, 4 KV heads in all on the other (not the same model?)"
    )
