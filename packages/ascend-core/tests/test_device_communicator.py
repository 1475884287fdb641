"""The device communicator (ascend-kernels', named by the adaptor) between two real gloo processes: vLLM is installed
in core's lane."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from vllm_ascend.testing.process import free_loopback_port


def _rank_main(rank: int, port: int, results: dict) -> None:
    from vllm_ascend.kernels.device.communicator import AscendDeviceCommunicator

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        comm = object.__new__(AscendDeviceCommunicator)  # the collectives need only the group and rank
        comm.world_size, comm.rank_in_group, comm.device_group = 2, rank, dist.group.WORLD
        sizes = [2, 3]
        mine = torch.full((sizes[rank], 4), float(rank + 1))
        gathered = comm.all_gatherv(mine, dim=0, sizes=sizes)
        pair = comm.all_gatherv([mine, mine * 10], dim=0, sizes=sizes)
        total = torch.arange(20, dtype=torch.float32).reshape(5, 4) * (rank + 1)
        scattered = comm.reduce_scatterv(total, dim=0, sizes=sizes)
        with pytest.raises(ValueError, match=r"sizes \[2, 2\] must add up to the 5 rows"):
            comm.reduce_scatterv(total, dim=0, sizes=[2, 2])
        results[rank] = (gathered, pair[1], scattered)
    finally:
        dist.destroy_process_group()


def test_variable_size_all_gather_and_reduce_scatter():
    results = mp.Manager().dict()
    mp.spawn(_rank_main, args=(free_loopback_port(), results), nprocs=2, join=True)
    expected_gather = torch.cat([torch.full((2, 4), 1.0), torch.full((3, 4), 2.0)])
    summed = torch.arange(20, dtype=torch.float32).reshape(5, 4) * 3
    for rank, rows in ((0, slice(0, 2)), (1, slice(2, 5))):
        gathered, tens, scattered = results[rank]
        assert torch.equal(gathered, expected_gather)
        assert torch.equal(tens, expected_gather * 10)
        assert torch.equal(scattered, summed[rows])
