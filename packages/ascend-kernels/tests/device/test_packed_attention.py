"""The reference ``packed_attention``: packed sequences without a KV cache (encoders, vision towers)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from vllm_ascend.core.device.adaptor.base import DeviceOpError
from vllm_ascend.kernels.device.reference import ReferenceDeviceAdaptor


def _oracle(q, k, v, bounds, scale, causal):
    """Each sequence alone, from the softmax formula in float64 (KV head ``h // group``)."""
    group = q.shape[1] // k.shape[1]
    out = torch.zeros(q.shape[0], q.shape[1], v.shape[2], dtype=torch.float64)
    for start, stop in itertools.pairwise(bounds):
        qs, ks, vs = (t[start:stop].double() for t in (q, k, v))
        ks, vs = ks.repeat_interleave(group, 1), vs.repeat_interleave(group, 1)
        scores = torch.einsum("qhd,khd->hqk", qs, ks) * scale
        if causal:
            n = stop - start
            scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -math.inf)
        out[start:stop] = torch.einsum("hqk,khd->qhd", scores.softmax(-1), vs)
    return out


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads", [(4, 4), (4, 1), (6, 2)])
def test_each_sequence_attends_to_itself_only(causal, heads):
    torch.manual_seed(0)
    hq, hkv = heads
    bounds = [0, 3, 3, 9, 15, 16, 30]  # empty, equal-length neighbours, a single row
    q, k = torch.randn(32, hq, 16), torch.randn(32, hkv, 16)
    v = torch.randn(32, hkv, 8)  # value head size may differ
    out = torch.full((32, hq, 8), 5.0)
    got = ReferenceDeviceAdaptor().packed_attention(
        q, k, v, torch.tensor(bounds), 0.3, causal=causal, output=out
    )
    assert got.data_ptr() == out.data_ptr()
    torch.testing.assert_close(
        got[:30].double(), _oracle(q, k, v, bounds, 0.3, causal)[:30], atol=1e-5, rtol=1e-5
    )
    assert torch.all(got[30:] == 5.0)


def test_half_inputs_are_computed_in_float32():
    torch.manual_seed(1)
    q, k, v = (torch.randn(10, 2, 16).half() for _ in range(3))
    got = ReferenceDeviceAdaptor().packed_attention(q, k, v, torch.tensor([0, 4, 10]), 0.25)
    assert got.dtype == torch.float16 and got.shape == (10, 2, 16)
    torch.testing.assert_close(got.double(), _oracle(q, k, v, [0, 4, 10], 0.25, False), atol=1e-3, rtol=1e-3)


def test_counted_once_per_call():
    adaptor = ReferenceDeviceAdaptor()
    q = torch.randn(4, 2, 16)
    adaptor.packed_attention(q, q, q, torch.tensor([0, 4]), 1.0)
    assert adaptor.call_counts["packed_attention"] == 1


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(cu=torch.tensor([1, 4])), "must start at 0"),
        (dict(cu=torch.tensor([0, 5, 3])), "not decrease"),
        (dict(cu=torch.tensor([0, 9])), "end at most at 6"),
        (dict(cu=torch.tensor([0.0, 6.0])), "1-D int vector"),
        (dict(k=torch.randn(6, 3, 16)), "multiple of KV heads"),
        (dict(k=torch.randn(5, 2, 16)), "key/value have 5/6 rows"),
        (dict(k=torch.randn(6, 2, 8)), "key head size 8"),
        (dict(output=torch.zeros(6, 4, 8)), "output must be"),
    ],
)
def test_out_of_contract_arguments_are_refused(change, message):
    args = dict(
        q=torch.randn(6, 4, 16), k=torch.randn(6, 2, 16), v=torch.randn(6, 2, 16), cu=torch.tensor([0, 6])
    )
    output = change.pop("output", None)
    args.update(change)
    with pytest.raises(DeviceOpError, match=message):
        ReferenceDeviceAdaptor().packed_attention(
            args["q"], args["k"], args["v"], args["cu"], 1.0, output=output
        )
