"""Causal conv1d (prefill and decode update) and GDN gating against their references."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import vllm_ascend.kernels as K
from vllm_ascend.kernels import conv1d, gdn_gating

DTYPES = [torch.float32, torch.bfloat16]


def _check(got, want, dtype, close_ulp):
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    else:
        close_ulp(got, want)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", [None, "silu"])
@pytest.mark.parametrize("with_bias", [True, False])
def test_causal_conv1d_fn(gen, dtype, activation, with_bias, close_ulp):
    dim, width = 20, 4
    lens = [5, 1, 19, 2]  # sequences shorter than width - 1 keep part of the old state
    qsl = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    x = torch.randn(dim, int(qsl[-1]), generator=gen).to(dtype)
    weight = torch.randn(dim, width, generator=gen).to(dtype)
    bias = torch.randn(dim, generator=gen).to(dtype) if with_bias else None
    states = torch.randn(6, dim, width - 1, generator=gen).to(dtype)
    lines = torch.tensor([4, 0, -1, 2], dtype=torch.int32)  # -1: padded entry, no state
    initial = torch.tensor([True, True, False, False])
    got_states, want_states = states.clone(), states.clone()
    got = K.causal_conv1d_fn(x, weight, bias, got_states, qsl, lines, initial, activation)
    want = conv1d.causal_conv1d_fn_torch(x, weight, bias, want_states, qsl, lines, initial, activation)
    _check(got, want, dtype, close_ulp)
    _check(got_states, want_states, dtype, close_ulp)
    assert torch.equal(got_states[[1, 3, 5]], states[[1, 3, 5]])  # lines nobody owns stay


def test_causal_conv1d_reference_agrees_with_torch_conv1d(gen):
    dim, width, length = 6, 4, 9
    x = torch.randn(dim, length, generator=gen)
    weight = torch.randn(dim, width, generator=gen)
    states = torch.zeros(1, dim, width - 1)
    out = conv1d.causal_conv1d_fn_torch(
        x, weight, None, states, torch.tensor([0, length]), torch.tensor([0]), torch.tensor([False]), None
    )
    want = F.conv1d(F.pad(x.unsqueeze(0), (width - 1, 0)), weight.unsqueeze(1), groups=dim)[0]
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(states[0], x[:, -(width - 1) :])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens", [None, 3])
def test_causal_conv1d_update(gen, dtype, tokens, close_ulp):
    batch, dim, width = 4, 12, 4
    shape = (batch, dim) if tokens is None else (batch, dim, tokens)
    x = torch.randn(*shape, generator=gen).to(dtype)
    weight = torch.randn(dim, width, generator=gen).to(dtype)
    bias = torch.randn(dim, generator=gen).to(dtype)
    states = torch.randn(5, dim, width - 1, generator=gen).to(dtype)
    for lines in (torch.tensor([3, -1, 0, 4], dtype=torch.int32), None):
        got_states, want_states = states.clone(), states.clone()
        got = K.causal_conv1d_update(x, got_states, weight, bias, "silu", lines)
        want = conv1d.causal_conv1d_update_torch(x, want_states, weight, bias, "silu", lines)
        assert got.shape == x.shape
        _check(got, want, dtype, close_ulp)
        _check(got_states, want_states, dtype, close_ulp)
        if lines is not None:
            assert not got[1].any() and torch.equal(got_states[[1, 2]], states[[1, 2]])


def test_unknown_activation_is_rejected():
    with pytest.raises(ValueError, match="unsupported conv1d activation 'gelu'"):
        K.causal_conv1d_update(torch.zeros(1, 2), torch.zeros(1, 2, 3), torch.zeros(2, 4), None, "gelu")


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_gdn_gating(gen, dtype, close_ulp):
    tokens, heads = 7, 6
    a_log = torch.randn(heads, generator=gen)
    dt_bias = torch.randn(heads, generator=gen)
    a = (torch.randn(tokens, heads, generator=gen) * 15).to(dtype)  # crosses the softplus threshold
    b = torch.randn(tokens, heads, generator=gen).to(dtype)
    g, beta = K.fused_gdn_gating(a_log, a, b, dt_bias, 1.0, 20.0)
    g_ref, beta_ref = gdn_gating.fused_gdn_gating_torch(a_log, a, b, dt_bias, 1.0, 20.0)
    assert g.shape == (1, tokens, heads) and g.dtype == torch.float32 and beta.dtype == dtype
    torch.testing.assert_close(g, g_ref, rtol=1e-5, atol=1e-5)
    close_ulp(beta, beta_ref)
    assert (g <= 0).all()
