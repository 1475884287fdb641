"""Multi-process gloo jobs for the lifecycle tests (run as a script: spawn needs an importable main).

``python dist_job.py d2d WORLD DIR``: move expert weights from one placement to another.
``python dist_job.py updator WORLD DIR``: the EPLB schedule with the D2D mover (loads → policy → plan →
layer-by-layer moves).
Each rank writes ``DIR/rank{r}.json`` with what it checked; any mismatch raises.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as tmp

from vllm_ascend.eplb.config import EplbConfig
from vllm_ascend.eplb.movers import D2DWeightMover
from vllm_ascend.eplb.placement import (
    generate_expert_map,
    generate_global_placement,
    generate_log2phy_map,
    rank_maps,
)
from vllm_ascend.eplb.policy.packing import imbalance, keep_slots, slot_weights
from vllm_ascend.eplb.updator import EplbUpdator
from vllm_ascend.eplb.worker import EplbProcess, EplbWorker, LayerUpdate, compose_layer_transfers

LAYERS, EXPERTS, HIDDEN, INTER = 3, 8, 6, 4


def expert_weights(layer: int, expert: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The canonical (random-bit) weights of one logical expert."""
    g = torch.Generator().manual_seed(layer * 1000 + expert)
    return torch.randn(2 * INTER, HIDDEN, generator=g), torch.randn(HIDDEN, INTER, generator=g)


class FakeMoE(torch.nn.Module):
    """One rank's share of a MoE layer (an ``EplbLayer``): weights of its slots, its row of the maps."""

    def __init__(self, layer: int, rank: int, table_rank: np.ndarray) -> None:
        super().__init__()
        self.rank = rank
        w13, w2 = zip(*(expert_weights(layer, int(e)) for e in table_rank), strict=True)
        self.w13_weight = torch.nn.Parameter(torch.stack(w13), requires_grad=False)
        self.w2_weight = torch.nn.Parameter(torch.stack(w2), requires_grad=False)
        self.register_buffer("expert_map", torch.full((EXPERTS,), -1, dtype=torch.int32))
        self.register_buffer("log2phy", torch.zeros(EXPERTS, dtype=torch.int64))
        self.register_buffer("moe_load", torch.zeros(len(table_rank), dtype=torch.int64))

    def expert_weights(self) -> list[torch.Tensor]:
        return [self.w13_weight.data, self.w2_weight.data]

    def set_placement(self, rank_table: np.ndarray) -> None:
        expert_map, log2phy = rank_maps(rank_table)
        self.expert_map.copy_(torch.as_tensor(expert_map[self.rank]))
        self.log2phy.copy_(torch.as_tensor(log2phy[self.rank]))


def build(rank: int, table: np.ndarray) -> list[FakeMoE]:
    layers = [FakeMoE(li, rank, table[li, rank]) for li in range(LAYERS)]
    for layer, rank_table in zip(layers, table, strict=True):
        layer.set_placement(rank_table)
    return layers


def check(rank: int, layers: list[FakeMoE], table: np.ndarray) -> int:
    """Weights bitwise equal to the canonical expert weights of the table; maps match the table."""
    checked = 0
    emap, l2p = generate_expert_map(table), generate_log2phy_map(table)
    for li, layer in enumerate(layers):
        w13, w2 = layer.expert_weights()
        for slot, e in enumerate(table[li, rank]):
            ref13, ref2 = expert_weights(li, int(e))
            if not (torch.equal(w13[slot], ref13) and torch.equal(w2[slot], ref2)):
                raise AssertionError(f"rank {rank} layer {li} slot {slot}: weights are not expert {e}'s")
            checked += 1
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
        new[li] = keep_slots(old[li][None], cand[None])[0]
    layers = build(rank, old)
    mover = D2DWeightMover()
    moved = 0
    for li in range(LAYERS):
        transfers = compose_layer_transfers(old[li], new[li])
        moved += sum(t.dst_rank == rank for t in transfers)
        mover.start(layers[li], LayerUpdate(li, old[li], new[li], transfers))
        if mover.finish() != li or mover.busy:
            raise AssertionError(f"rank {rank}: layer {li} did not finish moving")
    checked = check(rank, layers, new)
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump({"checked": checked, "received": moved, "changed": int((old != new).sum())}, f)
    dist.destroy_process_group()


def updator_job(rank: int, world: int, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{out}/rdzv", rank=rank, world_size=world)
    table = generate_global_placement(EXPERTS, world, world, LAYERS)
    hot = np.array([40.0, 30.0, 20.0, 10.0, 1.0, 1.0, 1.0, 1.0])  # logical loads per forward
    config = EplbConfig(
        dynamic_eplb=True,
        eplb_policy_type="default",
        expert_heat_collection_interval=3,
        algorithm_execution_interval=2,
        num_warmup_iterations=1,
    )
    schedule = EplbUpdator(config, D2DWeightMover(), EplbProcess(config.policy_name, mode="thread"))
    for layer in build(rank, table):
        schedule.register(layer)
    schedule.start(table)
    start = imbalance(table, np.tile(hot, (LAYERS, 1))).max()
    for _ in range(20):
        # what global routing delivers to this rank's slots: expert load / replica count
        load = slot_weights(updator_view(schedule.layers, world), np.tile(hot, (LAYERS, 1)))[:, rank]
        for li, layer in enumerate(schedule.layers):
            layer.moe_load.copy_(torch.as_tensor(np.rint(load[li] * 100)))
        schedule.forward_end("decode")
    while schedule.pending or schedule.mover.busy:
        schedule.forward_end("decode")
    final = schedule.table
    checked = check(rank, schedule.layers, final)
    end = imbalance(final, np.tile(hot, (LAYERS, 1))).max()
    schedule.shutdown()
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
    first_step, first_table = schedule.rebalances[0]
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump(
            {
                "checked": checked,
                "rebalances": len(schedule.rebalances),
                "first_step": first_step,
                "last_plan_changed": schedule.last_plan is not None and schedule.last_plan.changed,
                "start": float(start),
                "end": float(end),
                "steps": schedule.step,
                "matches_offline_plan": bool(np.array_equal(first_table, expected.new_table)),
            },
            f,
        )
    dist.destroy_process_group()


def updator_view(layers: list[FakeMoE], world: int) -> np.ndarray:
    """The global table as the ranks' expert maps currently say (gathered), ``[layers, ranks, slots]``."""
    maps = torch.stack([layer.expert_map.to(torch.int64) for layer in layers])  # [layers, n]
    parts = [torch.empty_like(maps) for _ in range(world)]
    dist.all_gather(parts, maps)
    table = np.full((LAYERS, world, layers[0].moe_load.numel()), -1, dtype=np.int64)
    for r, part in enumerate(parts):
        for li in range(LAYERS):
            for e, s in enumerate(part[li].tolist()):
                if s >= 0:
                    table[li, r, s] = e
    return table


if __name__ == "__main__":
    mode, world, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    tmp.spawn({"d2d": d2d_job, "updator": updator_job}[mode], args=(world, out), nprocs=world, join=True)
