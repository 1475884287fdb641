"""``swap_blocks`` (the KV offload's block copies) on the reference adaptor: rows land where the ids say in
every tensor pair, strided rows copy exactly, and arguments outside the contract are refused by name."""

from __future__ import annotations

import pytest
import torch

from vllm_ascend.core.device.adaptor.base import SWAP_BLOCKS_MAX_RUNS, DeviceOpError
from vllm_ascend.kernels.device.reference import ReferenceDeviceAdaptor


def _pages(rows: int, page: int, seed: int) -> torch.Tensor:
    return torch.randint(
        -128, 128, (rows, page), dtype=torch.int8, generator=torch.Generator().manual_seed(seed)
    )


@pytest.mark.parametrize("count", [1, 5, SWAP_BLOCKS_MAX_RUNS + 10], ids=["one", "few-runs", "many-runs"])
def test_rows_land_where_the_ids_say(count: int):
    adaptor = ReferenceDeviceAdaptor()
    src, dst = _pages(200, 48, 0), torch.zeros(150, 48, dtype=torch.int8)
    perm = torch.randperm(150, generator=torch.Generator().manual_seed(1))
    src_ids = torch.arange(count, dtype=torch.int64) * 2  # never consecutive: one run per row
    dst_ids = perm[:count].to(torch.int64)
    before = dst.clone()
    src2, dst2 = (
        _pages(200, 16, 5),
        torch.zeros(150, 16, dtype=torch.int8),
    )  # a second pair, another page size
    copied = adaptor.swap_blocks([src, src2], [dst, dst2], src_ids, dst_ids)
    assert copied == count * (48 + 16)
    expected = before.clone()
    expected[dst_ids] = src[src_ids]
    assert torch.equal(dst, expected)
    assert torch.equal(dst2[dst_ids], src2[src_ids]) and int(dst2.count_nonzero(dim=1).gt(0).sum()) <= count
    assert adaptor.call_counts["swap_blocks"] == 1


def test_consecutive_runs_and_strided_rows():
    """Rows of a block-major cache view whose block stride exceeds its page (packed layers) copy exactly."""
    adaptor = ReferenceDeviceAdaptor()
    storage = _pages(64, 96, 2)
    device = storage[:, 16:80]  # 64-byte pages, 96-byte row stride
    host = torch.zeros(40, 64, dtype=torch.int8)
    src_ids = torch.tensor([3, 4, 5, 6, 20, 21, 9], dtype=torch.int64)
    dst_ids = torch.tensor([10, 11, 12, 13, 0, 1, 39], dtype=torch.int64)
    adaptor.swap_blocks([device], [host], src_ids, dst_ids)
    for s, d in zip(src_ids.tolist(), dst_ids.tolist(), strict=True):
        assert torch.equal(host[d], storage[s, 16:80])
    untouched = sorted(set(range(40)) - set(dst_ids.tolist()))
    assert not host[untouched].any()
    # and back into other device rows
    back = torch.zeros_like(storage)
    adaptor.swap_blocks([host], [back[:, 16:80]], dst_ids, src_ids)
    assert torch.equal(back[src_ids, 16:80], storage[src_ids, 16:80])
    assert not back[:, :16].any() and not back[:, 80:].any()


def test_empty_copy_is_a_no_op():
    adaptor = ReferenceDeviceAdaptor()
    dst = torch.zeros(4, 8, dtype=torch.int8)
    empty = torch.empty(0, dtype=torch.int64)
    assert adaptor.swap_blocks([_pages(4, 8, 3)], [dst], empty, empty) == 0
    assert not dst.any()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"srcs": [torch.zeros(4, 8, dtype=torch.float32)]}, r"srcs\[0\] must be 2-D int8"),
        (
            {"dsts": [torch.zeros(4, 16, dtype=torch.int8)]},
            r"srcs\[0\] pages are 8 bytes, dsts\[0\] pages 16",
        ),
        ({"dsts": []}, "1 source tensors but 0 destination tensors"),
        ({"src_ids": torch.tensor([0, 4])}, r"src_ids must lie in \[0, 4\)"),
        ({"dst_ids": torch.tensor([0, -1])}, r"dst_ids must lie in \[0, 4\)"),
        ({"src_ids": torch.tensor([0, 1], dtype=torch.int32)}, "src_ids must be a 1-D int64 host tensor"),
        ({"dst_ids": torch.tensor([0])}, "2 src_ids but 1 dst_ids"),
        ({"srcs": [torch.zeros(8, 4, dtype=torch.int8).t()]}, r"srcs\[0\]'s pages must be contiguous"),
    ],
)
def test_out_of_contract_arguments_are_refused(change, message):
    args = {
        "srcs": [torch.zeros(4, 8, dtype=torch.int8)],
        "dsts": [torch.zeros(4, 8, dtype=torch.int8)],
        "src_ids": torch.tensor([0, 1]),
        "dst_ids": torch.tensor([2, 3]),
    }
    args.update(change)
    with pytest.raises(DeviceOpError, match=message):
        ReferenceDeviceAdaptor().swap_blocks(**args)
