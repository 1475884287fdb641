"""Multi-process gloo jobs for the lifecycle tests (run as a script: spawn needs an importable main).

``python dist_job.py d2d WORLD DIR``: move expert weights from one placement to another.
``python dist_job.py updator WORLD DIR``: the full lifecycle (loads → process → plan → moves).
Each rank writes ``DIR/rank{r}.json`` with what it checked; any mismatch raises.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as tmp

from vllm_ascend.eplb.adaptor import VllmEplbAdaptor
from vllm_ascend.eplb.config import EplbSettings
from vllm_ascend.eplb.d2d import D2DExpertWeightLoader
from vllm_ascend.eplb.placement import generate_expert_map, generate_global_placement, generate_log2phy_map
from vllm_ascend.eplb.policy.packing import imbalance, slot_weights
from vllm_ascend.eplb.updator import EplbUpdator
from vllm_ascend.eplb.worker import EplbWorker, LayerUpdate, compose_layer_transfers

LAYERS, EXPERTS, HIDDEN, INTER = 3, 8, 6, 4


def expert_weights(layer: int, expert: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The canonical (random-bit) weights of one logical expert."""
    g = torch.Generator().manual_seed(layer * 1000 + expert)
    return torch.randn(2 * INTER, HIDDEN, generator=g), torch.randn(HIDDEN, INTER, generator=g)


class FakeMoE(torch.nn.Module):
    def __init__(self, layer: int, table_rank: np.ndarray) -> None:
        super().__init__()
        w13, w2 = zip(*(expert_weights(layer, int(e)) for e in table_rank), strict=True)
        self.w13_weight = torch.nn.Parameter(torch.stack(w13), requires_grad=False)
        self.w2_weight = torch.nn.Parameter(torch.stack(w2), requires_grad=False)
        self.register_buffer("expert_map", torch.full((EXPERTS,), -1, dtype=torch.int32))
        self.register_buffer("log2phy", torch.zeros(EXPERTS, dtype=torch.int64))
        self.register_buffer("moe_load", torch.zeros(len(table_rank), dtype=torch.int64))


def build(rank: int, world: int, table: np.ndarray) -> tuple[torch.nn.Module, VllmEplbAdaptor]:
    model = torch.nn.ModuleList(FakeMoE(li, table[li, rank]) for li in range(LAYERS))
    adaptor = VllmEplbAdaptor.from_model(model, rank=rank, world_size=world)
    adaptor.apply_placement(table)
    return model, adaptor


def check(adaptor: VllmEplbAdaptor, table: np.ndarray) -> int:
    """Weights bitwise equal to the canonical expert weights of the table; maps match the table."""
    rank, checked = adaptor.rank, 0
    emap, l2p = generate_expert_map(table), generate_log2phy_map(table)
    for li in range(LAYERS):
        w13, w2 = adaptor.expert_params(li)
        for slot, e in enumerate(table[li, rank]):
            ref13, ref2 = expert_weights(li, int(e))
            if not (torch.equal(w13[slot], ref13) and torch.equal(w2[slot], ref2)):
                raise AssertionError(f"rank {rank} layer {li} slot {slot}: weights are not expert {e}'s")
            checked += 1
        layer = adaptor.layers[li]
        if (
            layer.expert_map.tolist() != emap[li, rank].tolist()
            or layer.log2phy.tolist() != l2p[li, rank].tolist()
        ):
            raise AssertionError(f"rank {rank} layer {li}: expert map / log2phy do not match the table")
    return checked


def d2d_job(rank: int, world: int, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{out}/rdzv", rank=rank, world_size=world)
    redundant = world  # one spare slot per rank
    old = generate_global_placement(EXPERTS, world, redundant, LAYERS)
    rng = np.random.default_rng(42)  # same on every rank
    new = old.copy()
    for li in range(LAYERS):  # a random valid placement: shuffle until no rank holds an expert twice
        while True:
            cand = rng.permutation(old[li].ravel()).reshape(old[li].shape)
            if all(len(set(r.tolist())) == len(r) for r in cand):
                break
        # keep experts that stay on a rank in their old slot
        from vllm_ascend.eplb.policy.packing import keep_slots

        new[li] = keep_slots(old[li][None], cand[None])[0]
    _, adaptor = build(rank, world, old)
    loader = D2DExpertWeightLoader(adaptor)
    moved = 0
    for li in range(LAYERS):
        transfers = compose_layer_transfers(old[li], new[li])
        moved += sum(t.dst_rank == rank for t in transfers)
        loader.generate_expert_d2d_transfer_task(LayerUpdate(li, old[li], new[li], transfers))
        loader.asyn_expert_weight_transfer()
        loader.update_expert_map_and_weight()
    checked = check(adaptor, new)
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump({"checked": checked, "received": moved, "changed": int((old != new).sum())}, f)
    dist.destroy_process_group()


def updator_job(rank: int, world: int, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{out}/rdzv", rank=rank, world_size=world)
    table = generate_global_placement(EXPERTS, world, world, LAYERS)
    _, adaptor = build(rank, world, table)
    hot = np.array([40.0, 30.0, 20.0, 10.0, 1.0, 1.0, 1.0, 1.0])  # logical loads per forward
    settings = EplbSettings(
        dynamic_eplb=True,
        eplb_policy_type="default",
        expert_heat_collection_interval=3,
        algorithm_execution_interval=2,
        num_warmup_iterations=1,
    )
    plans = []
    updator = EplbUpdator(settings, adaptor, table, on_plan=plans.append)
    updator.warm_up_eplb()
    start = imbalance(updator.table, np.tile(hot, (LAYERS, 1))).max()
    for step in range(20):
        updator.forward_before()
        # what global routing delivers to this rank's slots: expert load / replica count
        load = slot_weights(updator_view(adaptor, world), np.tile(hot, (LAYERS, 1)))[:, rank]
        for li, layer in enumerate(adaptor.layers):
            layer.moe_load.copy_(torch.as_tensor(np.rint(load[li] * 100)))
        updator.forward_end(dummy_run=step == 4)
    while updator.pending or updator.loader.state.name != "WAITING":
        updator.forward_before()
        updator.forward_end()
    final = updator.table
    checked = check(adaptor, final)
    end = imbalance(final, np.tile(hot, (LAYERS, 1))).max()
    updator.shutdown()
    same = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(
        same,
        torch.tensor([int(final.sum() * 7 + (final * np.arange(final.size).reshape(final.shape)).sum())]),
    )
    if len({int(t) for t in same}) != 1:
        raise AssertionError("ranks ended with different placements")
    expected = EplbWorker("default").do_update(
        table, slot_weights(table, np.tile(hot, (LAYERS, 1)) * 100 * 3)
    )
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump(
            {
                "checked": checked,
                "plans": len(plans),
                "start": float(start),
                "end": float(end),
                "applied": updator.plans_applied,
                "steps": updator.step,
                "matches_offline_plan": bool(np.array_equal(plans[0].new_table, expected.new_table)),
            },
            f,
        )
    dist.destroy_process_group()


def updator_view(adaptor: VllmEplbAdaptor, world: int) -> np.ndarray:
    """The global table as the ranks' expert maps currently say (gathered), ``[layers, ranks, slots]``."""
    maps = torch.stack([layer.expert_map.to(torch.int64) for layer in adaptor.layers])  # [layers, n]
    parts = [torch.empty_like(maps) for _ in range(world)]
    dist.all_gather(parts, maps)
    table = np.full((LAYERS, world, adaptor.slots_per_rank), -1, dtype=np.int64)
    for r, part in enumerate(parts):
        for li in range(LAYERS):
            for e, s in enumerate(part[li].tolist()):
                if s >= 0:
                    table[li, r, s] = e
    return table


if __name__ == "__main__":
    mode, world, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    tmp.spawn({"d2d": d2d_job, "updator": updator_job}[mode], args=(world, out), nprocs=world, join=True)
