"""MoE communication methods: the per-step choice, and all-gather / all-to-all / MC2 between two real gloo
processes, each equal to one process computing every expert on the same tokens."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from vllm_ascend.runner.ops.moe_comm import (
    MoECommConfig,
    MoECommError,
    MoECommType,
    mc2_capacity,
    select_moe_comm_method,
)
from vllm_ascend.testing.process import free_loopback_port

A, T, M = MoECommType.ALLGATHER, MoECommType.ALLTOALL, MoECommType.MC2
HIDDEN, INTER, EXPERTS, TOP_K = 16, 8, 8, 3
TOKENS = (5, 3)  # per rank: data-parallel ranks run different batch sizes


def _config(family: str = "a3", **overrides) -> MoECommConfig:
    """The config a family's profile gives (the reference device's for ``reference``)."""
    from vllm_ascend.core.device.config import get_hardware_profile

    fields = {"ep_size": 2, "tp_size": 1, "capacity": 8, "even": True, **overrides}
    return MoECommConfig.for_profile(get_hardware_profile(family), **fields)


@pytest.mark.parametrize(
    ("family", "overrides", "tokens", "expected"),
    [
        ("a3", {"ep_size": 1}, 1, A),  # tensor-parallel experts: nothing to route
        ("a3", {"ep_size": 1, "forced": M}, 1, A),
        ("a3", {}, 8, M),  # a3: decode-sized steps use MC2 ...
        ("a3", {}, 9, T),  # ... larger ones all-to-all
        ("a5", {}, 4, M),
        ("a5", {}, 40, T),
        ("reference", {}, 8, M),
        ("reference", {}, 9, T),
        ("a2", {}, 4, A),  # a2: MC2 only from 16 ranks, all-gather otherwise
        ("a2", {"ep_size": 16}, 4, M),
        ("a2", {"ep_size": 16}, 9, A),
        ("310p", {}, 4, A),  # all-gather only
        ("a3", {"even": False}, 4, A),  # experts not evenly spread: only all-gather works
        ("a3", {"forced": T}, 4, T),
        ("a3", {"forced": A}, 4, A),
        ("a3", {"forced": M}, 8, M),
    ],
)
def test_selection_per_family_and_step(family, overrides, tokens, expected):
    assert select_moe_comm_method(_config(family, **overrides), tokens) is expected


@pytest.mark.parametrize(
    ("overrides", "tokens", "expected"),
    [({}, 9, A), ({"forced": T}, 4, A), ({}, 8, M), ({"forced": M}, 8, M), ({"ep_size": 1}, 4, A)],
)
def test_a_captured_step_never_takes_the_all_to_all(overrides, tokens, expected):
    """Its split sizes are read on the host per step: a graph replays its capture's."""
    config = _config("a3", **overrides)
    assert select_moe_comm_method(config, tokens, captured=True) is expected
    assert select_moe_comm_method(config, tokens) is (T if expected is A and config.ep_size > 1 else expected)


def test_a_device_without_mc2_takes_its_fallback():
    config = MoECommConfig(device="no-mc2", ep_size=2, tp_size=1, capacity=8, even=True, methods=(A, T))
    assert select_moe_comm_method(config, 4) is T


def test_forcing_a_method_the_device_cannot_run_is_refused():
    with pytest.raises(MoECommError, match="mc2 is not available on no-mc2; allowed: allgather, alltoall"):
        MoECommConfig(device="no-mc2", ep_size=2, tp_size=1, capacity=8, even=True, methods=(A, T), forced=M)
    with pytest.raises(MoECommError, match="alltoall needs the experts to divide evenly"):
        _config(even=False, forced=T)
    with pytest.raises(MoECommError, match="alltoall is not available on Atlas 310P"):
        _config("310p", forced=T)
    with pytest.raises(MoECommError, match="fallback mc2 is not among the methods"):
        MoECommConfig(device="x", ep_size=2, tp_size=1, capacity=8, even=True, methods=(A,), fallback=M)


def test_mc2_capacity_is_a_decode_step_unless_forced():
    assert mc2_capacity(256, 1, 8192, forced=False) == 256
    assert mc2_capacity(256, 4, 8192, forced=False) == 512  # capped
    assert mc2_capacity(256, 1, 8192, forced=True) == 8192
    assert _config(capacity=9, tp_size=2).rank_capacity == 5


# -- two ranks -----------------------------------------------------------------------------------------
def _problem():
    """Every rank's tokens, routing and the experts' weights (the same on every process)."""
    gen = torch.Generator().manual_seed(7)
    xs = [torch.randn(n, HIDDEN, generator=gen) for n in TOKENS]
    logits = [torch.randn(n, EXPERTS, generator=gen) for n in TOKENS]
    w13 = torch.randn(EXPERTS, HIDDEN, 2 * INTER, generator=gen) / HIDDEN**0.5
    w2 = torch.randn(EXPERTS, INTER, HIDDEN, generator=gen) / INTER**0.5
    return xs, logits, w13, w2


def _experts_fn(w13, w2):
    from vllm_ascend.core.device.config import get_device_adaptor

    ad = get_device_adaptor()

    def run(rows, counts):
        return ad.grouped_matmul(ad.swiglu(ad.grouped_matmul(rows, w13, counts)), w2, counts)

    return run


def _one_process(x, logits, w13, w2):
    """Every expert in one process: the oracle."""
    from vllm_ascend.core.device.config import get_device_adaptor

    ad = get_device_adaptor()
    weights, ids = ad.moe_gating_top_k(logits, TOP_K)
    sorted_x, row_idx, counts = ad.moe_init_routing(x, ids, EXPERTS)
    return ad.moe_finalize_routing(_experts_fn(w13, w2)(sorted_x, counts), row_idx, weights)


def _rank_main(rank: int, port: int, results: dict) -> None:
    os.environ["VLLM_ASCEND_DEVICE"] = "reference"
    from vllm_ascend.core.device.adaptor.base import DeviceOpError
    from vllm_ascend.core.device.config import get_device_adaptor
    from vllm_ascend.runner.ops.moe_comm import allgather_experts, alltoall_experts, mc2_experts

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        ad = get_device_adaptor()
        xs, logits, w13, w2 = _problem()
        local = EXPERTS // 2
        mine = slice(rank * local, (rank + 1) * local)
        experts = _experts_fn(w13[mine], w2[mine])
        weights, ids = ad.moe_gating_top_k(logits[rank], TOP_K)
        out = {
            "alltoall": alltoall_experts(xs[rank], ids.long(), weights, local, experts, dist.group.WORLD),
            "mc2": mc2_experts(xs[rank], ids.long(), weights, local, experts, dist.group.WORLD, 6),
        }
        # All-gather: every rank sees both ranks' tokens, computes its experts' share; the sum is the output.
        every_x, every_logits = torch.cat(xs), torch.cat(logits)
        every_w, every_ids = ad.moe_gating_top_k(every_logits, TOP_K)
        local_ids = torch.where(every_ids.long() // local == rank, every_ids.long() % local, -1)
        share = allgather_experts(every_x, local_ids, every_w, local, experts)
        dist.all_reduce(share)
        out["allgather"] = share
        # The MC2 window contract: rows for the capacity, grouped by local expert, padding zero.
        dispatched = ad.moe_distribute_dispatch(
            xs[rank], ids, dist.group.WORLD, num_experts=EXPERTS, global_bs=12
        )
        out["dispatch_rows"] = dispatched.expand_x.shape[0]
        out["dispatch_counts"] = dispatched.expert_token_nums
        out["dispatch_padding_zero"] = bool(
            (dispatched.expand_x[int(dispatched.expert_token_nums.sum()) :] == 0).all()
        )
        with pytest.raises(MoECommError, match="capacity is 2"):
            mc2_experts(xs[rank], ids.long(), weights, local, experts, dist.group.WORLD, 2)
        with pytest.raises(DeviceOpError, match="hold this rank's 5 tokens"):
            ad.moe_distribute_dispatch(
                xs[0], ids[:1].expand(5, -1), dist.group.WORLD, num_experts=8, global_bs=8
            )
        with pytest.raises(DeviceOpError, match=r"expert ids must be within \[0, num_experts=8\)"):
            ad.moe_distribute_dispatch(xs[0][:1], ids[:1] + 8, dist.group.WORLD, num_experts=8, global_bs=12)
        results[rank] = out
    finally:
        dist.destroy_process_group()


def test_each_method_equals_every_expert_in_one_process():
    results = mp.Manager().dict()
    mp.spawn(_rank_main, args=(free_loopback_port(), results), nprocs=2, join=True)
    xs, logits, w13, w2 = _problem()
    expected = [_one_process(x, lg, w13, w2) for x, lg in zip(xs, logits, strict=True)]
    for rank in (0, 1):
        got = results[rank]
        torch.testing.assert_close(got["alltoall"], expected[rank], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got["mc2"], expected[rank], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got["allgather"], torch.cat(expected), atol=1e-5, rtol=1e-5)
        # global_bs 12 over 2 ranks, min(L=4, k=3) copies per token and peer: 12 * 3 rows.
        assert got["dispatch_rows"] == 36
        assert got["dispatch_padding_zero"]
    # Every token copy arrives exactly once: both ranks' received rows add up to all copies sent.
    received = results[0]["dispatch_counts"].sum() + results[1]["dispatch_counts"].sum()
    assert int(received) == sum(TOKENS) * TOP_K
