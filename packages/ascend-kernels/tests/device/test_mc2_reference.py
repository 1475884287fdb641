"""The reference MC2 dispatch/combine (fixed capacity windows over ``torch.distributed``) between two gloo
processes: rows arrive grouped by local expert, every copy once, padding tokens never sent; the combine
returns the weighted sum; calls outside the capacity contract are refused."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from vllm_ascend.testing.process import free_loopback_port

EXPERTS, HIDDEN, K = 4, 3, 2


def _rank_main(rank: int, port: int, results: dict) -> None:
    from vllm_ascend.core.device.adaptor.base import DeviceOpError
    from vllm_ascend.kernels.device.mc2_reference import mc2_combine, mc2_dispatch

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        # Token t of rank r is the row (10r + t) repeated; rank 0 has 3 tokens (the last one padding).
        x = (10 * rank + torch.arange(3, dtype=torch.float32))[:, None].repeat(1, HIDDEN)
        ids = torch.tensor([[0, 3], [2, 1], [3, 2]]) if rank == 0 else torch.tensor([[3, 0], [1, 0], [0, 1]])
        active = torch.tensor([True, True, rank == 1])
        shape = {"num_experts": EXPERTS, "global_bs": 6, "active_mask": active}
        dispatched = mc2_dispatch(x, ids, dist.group.WORLD, **shape)
        scale = 1.0 + rank  # rank r's experts multiply by r + 1
        out = mc2_combine(
            dispatched.expand_x * scale, dispatched, ids, torch.full((3, K), 0.5), dist.group.WORLD, **shape
        )
        with pytest.raises(
            DeviceOpError, match="num_experts=5 must be divisible by the 2 expert-parallel ranks"
        ):
            mc2_dispatch(x, ids, dist.group.WORLD, num_experts=5, global_bs=6)
        with pytest.raises(
            DeviceOpError, match="global_bs=4 must be a multiple of the 2 ranks and hold this rank's 3"
        ):
            mc2_dispatch(x, ids, dist.group.WORLD, num_experts=EXPERTS, global_bs=4)
        with pytest.raises(DeviceOpError, match=r"active_mask must be \[BS\] = \[3\]"):
            mc2_dispatch(x, ids, dist.group.WORLD, num_experts=EXPERTS, global_bs=6, active_mask=active[:2])
        results[rank] = (dispatched.expand_x[:, 0], dispatched.expert_token_nums, out[:, 0])
    finally:
        dist.destroy_process_group()


def test_dispatch_groups_rows_by_local_expert_and_combine_weights_them():
    results = mp.Manager().dict()
    mp.spawn(_rank_main, args=(free_loopback_port(), results), nprocs=2, join=True)
    rows0, counts0, out0 = results[0]
    rows1, counts1, out1 = results[1]
    # A = global_bs * min(L, k) = 6 * 2 rows; by local expert, then source rank, then the sender's order.
    assert rows0.shape == (12,) and rows1.shape == (12,)
    # Rank 0 holds experts 0, 1: expert 0 gets rank 0's token 0, rank 1's tokens 10, 11, 12; expert 1 gets
    # rank 0's token 1 and rank 1's 11, 12 (rank 0's token 2 is padding: not sent).
    assert counts0.tolist() == [4, 3] and rows0[:7].tolist() == [0, 10, 11, 12, 1, 11, 12]
    assert counts1.tolist() == [1, 2] and rows1[:3].tolist() == [1, 0, 10]
    assert (rows0[7:] == 0).all() and (rows1[3:] == 0).all()  # padding rows
    # out[t] = sum_j 0.5 * (row * (owner rank + 1)).
    assert out0.tolist() == [0.5 * 0 + 0.5 * 0 * 2, 0.5 * 1 * 2 + 0.5 * 1, 0.0]
    assert out1.tolist() == [0.5 * 10 * 2 + 0.5 * 10, 0.5 * 11 + 0.5 * 11, 0.5 * 12 + 0.5 * 12]
