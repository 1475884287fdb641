"""The reference MLA ops: their documented semantics, checked against plain equations, and their errors."""

from __future__ import annotations

import pytest
import torch

from vllm_ascend.core.device.adaptor import DeviceOpError
from vllm_ascend.core.device.adaptor.mla import MLA_OPS, MLADeviceOps, latent_cache_parts
from vllm_ascend.kernels.device.npu import A2A3DeviceAdaptor
from vllm_ascend.kernels.device.reference import ReferenceDeviceAdaptor


def test_family_adaptors_provide_the_mla_ops():
    assert issubclass(ReferenceDeviceAdaptor, MLADeviceOps) and issubclass(A2A3DeviceAdaptor, MLADeviceOps)
    for name in MLA_OPS:
        assert getattr(A2A3DeviceAdaptor, name) is not getattr(ReferenceDeviceAdaptor, name)


def test_cache_write_scatters_rows_skips_padding_and_counts():
    adaptor = ReferenceDeviceAdaptor()
    cache = torch.zeros(3, 4, 6)
    kv_c, k_pe = torch.arange(12.0).view(3, 4), -torch.arange(6.0).view(3, 2) - 1
    adaptor.mla_cache_write(kv_c, k_pe, cache, torch.tensor([9, -1, 2]))
    # Two regions: every slot's c_kv (12 slots x 4), then every slot's k_pe (12 slots x 2).
    c_rows, pe_rows = cache.view(-1)[:48].view(12, 4), cache.view(-1)[48:].view(12, 2)
    assert torch.equal(c_rows[9], kv_c[0]) and torch.equal(pe_rows[9], k_pe[0])
    assert torch.equal(c_rows[2], kv_c[2]) and torch.equal(pe_rows[2], k_pe[2])
    assert int((c_rows.abs().sum(-1) > 0).sum()) == 2 and int((pe_rows.abs().sum(-1) > 0).sum()) == 2
    parts = latent_cache_parts(cache, 4)
    assert [p.shape for p in parts] == [(3, 4, 4), (3, 4, 2)] and all(p.is_contiguous() for p in parts)
    assert parts[0].data_ptr() == cache.data_ptr()
    with pytest.raises(DeviceOpError, match="the latent cache must be one contiguous allocation"):
        latent_cache_parts(cache.transpose(0, 1), 4)
    assert adaptor.call_counts["mla_cache_write"] == 1
    with pytest.raises(DeviceOpError, match="slot 12 is out of range for a cache of 3 blocks x 4"):
        adaptor.mla_cache_write(kv_c[:1], k_pe[:1], cache, torch.tensor([12]))
    with pytest.raises(DeviceOpError, match=r"kv_c \(4\) \+ k_pe \(1\) columns != cache row 6"):
        adaptor.mla_cache_write(kv_c, k_pe[:, :1], cache, torch.tensor([0, 1, 2]))


def _latent_equations(q_nope, q_pe, rows, scale, q_len, lora):
    """Queries = the last ``q_len`` positions of the ``rows`` keys; float64."""
    s = rows.shape[0]
    scores = (q_nope.double() @ rows[:, :lora].double().T + q_pe.double() @ rows[:, lora:].double().T) * scale
    allowed = torch.arange(s).unsqueeze(0) <= torch.arange(s - q_len, s).unsqueeze(1)
    probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    return probs @ rows[:, :lora].double()


@pytest.mark.parametrize(("lora", "rope"), [(512, 64), (32, 16), (20, 4)])
def test_latent_attention_equals_the_equations(lora, rope):
    gen = torch.Generator().manual_seed(lora)
    adaptor = ReferenceDeviceAdaptor()
    block, heads, q_lens, seq_lens = 4, 2, [1, 3, 0], [7, 10, 5]
    cache = torch.randn(9, block, lora + rope, generator=gen)
    table = torch.randperm(9, generator=gen)[:9].view(3, 3)
    q_nope = torch.randn(sum(q_lens), heads, lora, generator=gen)
    q_pe = torch.randn(sum(q_lens), heads, rope, generator=gen)
    starts = torch.tensor([0, 1, 4, 4])
    out = adaptor.mla_latent_attention(q_nope, q_pe, cache, table, starts, torch.tensor(seq_lens), 0.3)
    assert out.shape == (4, heads, lora)
    c_kv, k_pe = latent_cache_parts(cache, lora)
    combined = torch.cat([c_kv, k_pe], dim=-1)  # block-major rows of the two regions
    for b in range(2):
        rows = combined[table[b]].flatten(0, 1)[: seq_lens[b]]
        sl = slice(int(starts[b]), int(starts[b + 1]))
        expected = torch.stack(
            [_latent_equations(q_nope[sl, h], q_pe[sl, h], rows, 0.3, q_lens[b], lora) for h in range(heads)],
            1,
        )
        torch.testing.assert_close(out[sl].double(), expected, rtol=0, atol=1e-5)
    with pytest.raises(DeviceOpError, match=r"seq_lens\[0\]=13 needs 4 blocks of 4 but block_table has 3"):
        adaptor.mla_latent_attention(q_nope, q_pe, cache, table, starts, torch.tensor([13, 10, 5]), 0.3)
    with pytest.raises(DeviceOpError, match="request 1: query length 3 must be within"):
        adaptor.mla_latent_attention(q_nope, q_pe, cache, table, starts, torch.tensor([7, 2, 5]), 0.3)


def test_prefill_attention_is_causal_to_the_end_of_each_requests_keys():
    gen = torch.Generator().manual_seed(0)
    adaptor = ReferenceDeviceAdaptor()
    q = torch.randn(5, 2, 8, generator=gen)
    k = torch.randn(9, 2, 8, generator=gen)
    v = torch.randn(9, 2, 3, generator=gen)
    out = adaptor.mla_prefill_attention(q, k, v, torch.tensor([0, 2, 5]), torch.tensor([0, 4, 9]), 0.5)
    for (qs, qe), (ks, ke) in (((0, 2), (0, 4)), ((2, 5), (4, 9))):
        s, ql = ke - ks, qe - qs
        scores = torch.einsum("qhd,khd->hqk", q[qs:qe].double(), k[ks:ke].double()) * 0.5
        allowed = torch.arange(s).unsqueeze(0) <= torch.arange(s - ql, s).unsqueeze(1)
        probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
        expected = torch.einsum("hqk,khd->qhd", probs, v[ks:ke].double())
        torch.testing.assert_close(out[qs:qe].double(), expected, rtol=0, atol=1e-6)
    with pytest.raises(DeviceOpError, match=r"request 0: query length 2 must be within \[0, kv length 1\]"):
        adaptor.mla_prefill_attention(q, k, v, torch.tensor([0, 2, 5]), torch.tensor([0, 1, 9]), 0.5)


def test_npu_latent_attention_refuses_other_latent_sizes_by_name():
    adaptor = A2A3DeviceAdaptor()
    with pytest.raises(
        DeviceOpError, match=r"kv_lora_rank=32, rope_dim=16 is not supported .* allowed: kv_lora_rank=512"
    ):
        adaptor.mla_latent_attention(
            torch.zeros(1, 2, 32), torch.zeros(1, 2, 16), torch.zeros(1, 4, 48), torch.zeros(1, 1), torch.tensor([0, 1]), torch.tensor([1]), 1.0
        )  # fmt: skip
