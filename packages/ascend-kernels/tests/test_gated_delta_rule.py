"""The torch gated delta rule (recurrent and chunked) against a naive per-token, per-head recurrence."""

from __future__ import annotations

import math

import pytest
import torch

from vllm_ascend.kernels.gated_delta_rule import chunk_gated_delta_rule, recurrent_gated_delta_rule


def _naive(q, k, v, g, beta, cu_seqlens, initial_state, scale, use_qk_l2norm):
    """From the equations, one head and one token at a time, in float64:
    S <- exp(g) S;  S <- S + k (beta (v - S^T k))^T;  o = S^T (scale q); value head h reads key head
    h // (Hv / Hk)."""
    tokens, k_heads, k_dim = q.shape
    v_heads, v_dim = v.shape[1], v.shape[2]
    groups = v_heads // k_heads
    out = torch.zeros(tokens, v_heads, v_dim, dtype=torch.float64)
    starts = cu_seqlens.tolist()
    final = torch.zeros(len(starts) - 1, v_heads, k_dim, v_dim, dtype=torch.float64)
    for n in range(len(starts) - 1):
        for h in range(v_heads):
            if initial_state is None:
                s = torch.zeros(k_dim, v_dim, dtype=torch.float64)
            else:
                s = initial_state[n, h].double().clone()
            for t in range(starts[n], starts[n + 1]):
                qt, kt = q[t, h // groups].double(), k[t, h // groups].double()
                if use_qk_l2norm:
                    qt, kt = qt / qt.norm(), kt / kt.norm()
                s = math.exp(float(g[t, h])) * s
                s = s + torch.outer(kt, float(beta[t, h]) * (v[t, h].double() - s.T @ kt))
                out[t, h] = s.T @ (scale * qt)
            final[n, h] = s
    return out, final


def _inputs(tokens, k_heads, v_heads, k_dim, v_dim, seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(tokens, k_heads, k_dim, generator=gen)
    k = torch.randn(tokens, k_heads, k_dim, generator=gen)
    v = torch.randn(tokens, v_heads, v_dim, generator=gen)
    g = -torch.rand(tokens, v_heads, generator=gen) * 2  # log decay in [-2, 0]
    beta = torch.rand(tokens, v_heads, generator=gen)
    return q, k, v, g, beta


RULES = {
    "recurrent": recurrent_gated_delta_rule,
    "chunk64": chunk_gated_delta_rule,
    "chunk5": lambda *a, **kw: chunk_gated_delta_rule(*a, chunk_size=5, **kw),
    "chunk1": lambda *a, **kw: chunk_gated_delta_rule(*a, chunk_size=1, **kw),
}


@pytest.mark.parametrize("rule", RULES, ids=list(RULES))
@pytest.mark.parametrize(
    ("lengths", "k_heads", "v_heads", "k_dim", "v_dim", "with_state", "l2norm"),
    [
        ((1,), 1, 1, 8, 8, False, True),  # one decode token from zeros
        ((1, 1, 1), 2, 4, 16, 8, True, True),  # a decode batch continuing states, GQA
        ((13, 1, 70), 2, 4, 16, 8, True, True),  # prefills across chunk boundaries and a decode
        ((0, 9), 2, 2, 8, 16, True, False),  # an empty sequence keeps its state; no l2 norm
        ((130,), 1, 3, 4, 4, False, True),  # three chunks of 64 (last partial)
    ],
)
def test_gated_delta_rule_matches_naive_recurrence(
    rule, lengths, k_heads, v_heads, k_dim, v_dim, with_state, l2norm
):
    tokens = sum(lengths)
    q, k, v, g, beta = _inputs(tokens, k_heads, v_heads, k_dim, v_dim, seed=sum(lengths) + v_heads)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    init = torch.randn(len(lengths), v_heads, k_dim, v_dim) * 0.5 if with_state else None
    scale = 0.3 if not l2norm else k_dim**-0.5
    expected_out, expected_state = _naive(q, k, v, g, beta, cu, init, scale, l2norm)
    init_before = None if init is None else init.clone()
    out, state = RULES[rule](
        q, k, v, g, beta, cu, init, scale=scale if not l2norm else None, use_qk_l2norm=l2norm
    )
    assert out.shape == v.shape and out.dtype == v.dtype
    assert state.shape == (len(lengths), v_heads, k_dim, v_dim) and state.dtype == torch.float32
    torch.testing.assert_close(out.double(), expected_out, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(state.double(), expected_state, rtol=1e-4, atol=1e-4)
    if init is not None:
        assert torch.equal(init, init_before)  # the caller's initial state is not modified


def test_chunked_prefill_then_decode_equals_one_pass():
    """Splitting a sequence (prefill chunk, then decode tokens from the returned state) changes nothing."""
    q, k, v, g, beta = _inputs(40, 2, 4, 16, 8, seed=7)
    whole, whole_state = chunk_gated_delta_rule(q, k, v, g, beta, torch.tensor([0, 40]))
    first, state = chunk_gated_delta_rule(q[:30], k[:30], v[:30], g[:30], beta[:30], torch.tensor([0, 30]))
    pieces = [first]
    for t in range(30, 40):
        o, state = recurrent_gated_delta_rule(
            q[t : t + 1],
            k[t : t + 1],
            v[t : t + 1],
            g[t : t + 1],
            beta[t : t + 1],
            torch.tensor([0, 1]),
            state,
        )
        pieces.append(o)
    torch.testing.assert_close(torch.cat(pieces), whole, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state, whole_state, rtol=1e-5, atol=1e-5)


def test_bfloat16_inputs_return_bfloat16_within_rounding():
    q, k, v, g, beta = _inputs(20, 1, 2, 8, 8, seed=3)
    cu = torch.tensor([0, 20])
    ref, _ = chunk_gated_delta_rule(q, k, v, g, beta, cu)
    out, _ = chunk_gated_delta_rule(q.bfloat16(), k.bfloat16(), v.bfloat16(), g, beta.bfloat16(), cu)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref, rtol=5e-2, atol=5e-2)


@pytest.mark.parametrize("rule", [recurrent_gated_delta_rule, chunk_gated_delta_rule])
def test_bad_inputs_name_the_problem(rule):
    q, k, v, g, beta = _inputs(6, 2, 4, 8, 8, seed=1)
    cu = torch.tensor([0, 6])
    with pytest.raises(ValueError, match=r"g \(6, 3\).*\[T, Hv\]"):
        rule(q, k, v, g[:, :3], beta, cu)
    with pytest.raises(ValueError, match=r"value heads \(3\) must be a multiple of key heads \(2\)"):
        rule(q, k, v[:, :3], g[:, :3], beta[:, :3], cu)
    with pytest.raises(ValueError, match=r"cu_seqlens must rise from 0 to the token count 6; got \[0, 4\]"):
        rule(q, k, v, g, beta, torch.tensor([0, 4]))
    with pytest.raises(
        ValueError, match=r"initial_state \(1, 4, 8, 4\) must be \[N, Hv, K, V\] = \(1, 4, 8, 8\)"
    ):
        rule(q, k, v, g, beta, cu, torch.zeros(1, 4, 8, 4))


def test_chunk_size_must_be_positive():
    q, k, v, g, beta = _inputs(4, 1, 1, 4, 4, seed=2)
    with pytest.raises(ValueError, match="chunk_size must be >= 1; got 0"):
        chunk_gated_delta_rule(q, k, v, g, beta, torch.tensor([0, 4]), chunk_size=0)
