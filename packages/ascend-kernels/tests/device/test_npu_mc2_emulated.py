"""The NPU adaptors' MC2 glue against ``npu_moe_distribute_dispatch``/``combine`` emulated from their schemas.

The emulation (one expert-parallel rank, so no collective) follows the op schemas and shape rules of the
torch-npu 2.13.0 wheel (``npu_native_functions_by_codegen.yaml`` and its meta functions): seven dispatch
outputs ``(expand_x [A, H], dynamic_scales, expand_idx [BS*k], expert_token_nums [L], ep_recv_counts,
tp_recv_counts, expand_scales)`` with ``A = global_bs * min(L, k)``, rows past the received ones left as
garbage; the combine takes the dispatch's ``expand_idx``/``ep_recv_counts`` back. Each NPU adaptor must hand
the experts the rows and counts the reference contract promises and combine to the weighted sum.
"""

from __future__ import annotations

import sys
import types

import pytest
import torch

from vllm_ascend.kernels.device import npu
from vllm_ascend.kernels.device.a5 import A5DeviceAdaptor
from vllm_ascend.kernels.device.npu import A2A3DeviceAdaptor

GARBAGE = 1e4
GROUP_NAME = "hccl-ep-group"


class FakeMc2TorchNpu(types.ModuleType):
    def __init__(self) -> None:
        super().__init__("torch_npu")
        self.calls: list[str] = []

    def npu_moe_distribute_dispatch(
        self, x, expert_ids, group_ep, ep_world_size, ep_rank_id, moe_expert_num, *, scales=None,
        x_active_mask=None, expert_scales=None, group_tp="", tp_world_size=0, tp_rank_id=0,
        expert_shard_type=0, shared_expert_num=1, shared_expert_rank_num=0, quant_mode=0, global_bs=0,
        expert_token_nums_type=1,
    ):  # fmt: skip
        self.calls.append("dispatch")
        assert (group_ep, ep_world_size, ep_rank_id) == (GROUP_NAME, 1, 0)
        assert expert_ids.dtype == torch.int32 and quant_mode == 0 and scales is None
        bs, k = expert_ids.shape
        active = torch.ones(bs, dtype=torch.bool) if x_active_mask is None else x_active_mask
        rows = (global_bs or bs) * min(moe_expert_num, k)
        flat = expert_ids.reshape(-1).long()
        sent = active.repeat_interleave(k)
        order = [i for i in torch.argsort(flat, stable=True).tolist() if sent[i]]
        expand_x = torch.full((rows, x.shape[1]), GARBAGE, dtype=x.dtype)
        expand_idx = torch.full((bs * k,), -1, dtype=torch.int32)
        for pos, copy in enumerate(order):
            expand_x[pos] = x[copy // k]
            expand_idx[copy] = pos
        counts = torch.bincount(flat[sent], minlength=moe_expert_num).to(torch.int64)
        if expert_token_nums_type == 0:
            counts = counts.cumsum(0)
        ep_recv_counts = counts.cumsum(0).to(torch.int32) if expert_token_nums_type == 1 else counts.int()
        return (
            expand_x,
            torch.empty(rows),
            expand_idx,
            counts,
            ep_recv_counts,
            torch.zeros(tp_world_size, dtype=torch.int32),
            torch.empty(0),
        )

    def npu_moe_distribute_combine(
        self, expand_x, expert_ids, expand_idx, ep_send_counts, expert_scales, group_ep, ep_world_size,
        ep_rank_id, moe_expert_num, *, tp_send_counts=None, x_active_mask=None, activation_scale=None,
        weight_scale=None, group_list=None, expand_scales=None, shared_expert_x=None, group_tp="",
        tp_world_size=0, tp_rank_id=0, expert_shard_type=0, shared_expert_num=1, shared_expert_rank_num=0,
        global_bs=0, out_dtype=0, comm_quant_mode=0, group_list_type=0,
    ):  # fmt: skip
        self.calls.append("combine")
        assert (group_ep, ep_world_size, ep_rank_id) == (GROUP_NAME, 1, 0)
        assert expert_scales.dtype == torch.float32 and expand_idx.dtype == torch.int32
        assert int(ep_send_counts[-1]) == int((expand_idx >= 0).sum())
        bs, k = expert_ids.shape
        active = torch.ones(bs, dtype=torch.bool) if x_active_mask is None else x_active_mask
        out = torch.zeros(bs, expand_x.shape[1], dtype=torch.float64)
        for t in range(bs):
            if active[t]:
                for j in range(k):
                    out[t] += expert_scales[t, j].double() * expand_x[int(expand_idx[t * k + j])].double()
        return out.to(expand_x.dtype)


@pytest.fixture
def fake_npu(monkeypatch):
    fake = FakeMc2TorchNpu()
    monkeypatch.setitem(sys.modules, "torch_npu", fake)
    monkeypatch.setattr(npu, "hccl_group", lambda group: (0, 1, GROUP_NAME))
    return fake


@pytest.mark.parametrize("cls", [A2A3DeviceAdaptor, A5DeviceAdaptor], ids=lambda c: c.__name__)
def test_dispatch_experts_combine_equals_the_weighted_sum(fake_npu, cls):
    gen = torch.Generator().manual_seed(0)
    bs, k, experts, hidden = 6, 2, 4, 8
    x = torch.randn(bs, hidden, generator=gen)
    ids = torch.stack([torch.randperm(experts, generator=gen)[:k] for _ in range(bs)]).int()
    weights = torch.rand(bs, k, generator=gen)
    active = torch.tensor([True, True, True, True, False, False])  # two padding tokens
    scale = torch.arange(1, experts + 1, dtype=torch.float32)  # expert e multiplies by e + 1
    ad = cls()
    shape = {"num_experts": experts, "global_bs": bs, "active_mask": active}
    dispatched = ad.moe_distribute_dispatch(x, ids, object(), **shape)
    counts = dispatched.expert_token_nums
    assert (
        counts.dtype == torch.int64
        and counts.tolist() == torch.bincount(ids[:4].reshape(-1).long(), minlength=4).tolist()
    )
    assert dispatched.expand_x.shape == (bs * k, hidden)
    expert_of_row = torch.repeat_interleave(torch.arange(experts), counts)
    rows = dispatched.expand_x[: int(counts.sum())] * scale[expert_of_row, None]
    expert_out = torch.cat([rows, dispatched.expand_x[int(counts.sum()) :]])  # padding rows pass through
    out = ad.moe_distribute_combine(expert_out, dispatched, ids, weights, object(), **shape)
    expected = (weights[:, :, None] * x[:, None, :] * scale[ids.long()][:, :, None]).sum(1)
    expected[~active] = 0
    torch.testing.assert_close(out, expected)
    assert fake_npu.calls == ["dispatch", "combine"]
