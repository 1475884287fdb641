"""The gated delta rule: the torch references (recurrent and chunked) and the public chunked function (the Triton
kernel in this suite) against a naive per-token, per-head recurrence; the Triton kernel against the chunked
reference on chunk boundaries, several sequences, GQA, strides and 16-bit inputs; its tiles within the UB."""

from __future__ import annotations

import math

import pytest
import torch

from vllm_ascend.kernels._geometry import GeometryError, LaunchGeometry
from vllm_ascend.kernels._triton import gated_delta_rule as triton_gdr
from vllm_ascend.kernels.gated_delta_rule import (
    chunk_gated_delta_rule,
    chunk_gated_delta_rule_torch,
    recurrent_gated_delta_rule,
)


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
    "chunk": chunk_gated_delta_rule,  # the Triton kernel here (TRITON_INTERPRET=1)
    "chunk_torch64": chunk_gated_delta_rule_torch,
    "chunk_torch5": lambda *a, **kw: chunk_gated_delta_rule_torch(*a, chunk_size=5, **kw),
    "chunk_torch1": lambda *a, **kw: chunk_gated_delta_rule_torch(*a, chunk_size=1, **kw),
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


@pytest.mark.parametrize(
    "rule", [recurrent_gated_delta_rule, chunk_gated_delta_rule_torch, chunk_gated_delta_rule]
)
def test_bad_shapes_name_the_problem(rule):
    q, k, v, g, beta = _inputs(6, 2, 4, 8, 8, seed=1)
    cu = torch.tensor([0, 6])
    with pytest.raises(ValueError, match=r"g \(6, 3\).*\[T, Hv\]"):
        rule(q, k, v, g[:, :3], beta, cu)
    with pytest.raises(ValueError, match=r"value heads \(3\) must be a multiple of key heads \(2\)"):
        rule(q, k, v[:, :3], g[:, :3], beta[:, :3], cu)
    with pytest.raises(
        ValueError, match=r"initial_state \(1, 4, 8, 4\) must be \[N, Hv, K, V\] = \(1, 4, 8, 8\)"
    ):
        rule(q, k, v, g, beta, cu, torch.zeros(1, 4, 8, 4))
    with pytest.raises(ValueError, match=r"cu_seqlens must be \[N \+ 1\] offsets; got shape \(1, 2\)"):
        rule(q, k, v, g, beta, cu[None])


@pytest.mark.parametrize("rule", [recurrent_gated_delta_rule, chunk_gated_delta_rule_torch])
def test_references_check_the_offsets(rule):
    """The references read ``cu_seqlens`` on the host and check its values (the Triton path does not sync)."""
    q, k, v, g, beta = _inputs(6, 2, 4, 8, 8, seed=1)
    with pytest.raises(ValueError, match=r"cu_seqlens must rise from 0 to the token count 6; got \[0, 4\]"):
        rule(q, k, v, g, beta, torch.tensor([0, 4]))
    with pytest.raises(ValueError, match=r"got \[0, 4, 2, 6\]"):
        rule(q, k, v, g, beta, torch.tensor([0, 4, 2, 6]))


def test_chunk_size_must_be_positive():
    q, k, v, g, beta = _inputs(4, 1, 1, 4, 4, seed=2)
    with pytest.raises(ValueError, match="chunk_size must be >= 1; got 0"):
        chunk_gated_delta_rule_torch(q, k, v, g, beta, torch.tensor([0, 4]), chunk_size=0)


def _triton_inputs(gen, lengths, k_heads, v_heads, k_dim, v_dim, dtype, l2norm):
    tokens = sum(lengths)
    q = torch.randn(tokens, k_heads, k_dim, generator=gen)
    k = torch.randn(tokens, k_heads, k_dim, generator=gen)
    if not l2norm:  # keys of norm < 1 keep the unnormalised rule stable
        q, k = q * k_dim**-0.5, k * 0.9 * k_dim**-0.5
    v = torch.randn(tokens, v_heads, v_dim, generator=gen)
    g = -torch.rand(tokens, v_heads, generator=gen) * 1.5
    beta = torch.rand(tokens, v_heads, generator=gen)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    return q.to(dtype), k.to(dtype), v.to(dtype), g, beta.to(dtype), cu


def _assert_matches_reference(out, state, ref_out, ref_state, dtype):
    """Float32 states agree to float32 rounding; outputs up to one unit in the last place of their dtype (the
    float32 results differ by rounding, which can flip the final 16-bit rounding)."""
    assert out.dtype == dtype and out.shape == ref_out.shape and state.dtype == torch.float32
    assert not torch.isnan(out).any() and not torch.isnan(state).any()
    torch.testing.assert_close(state, ref_state, rtol=1e-4, atol=1e-5)
    rtol = 1e-4 if dtype == torch.float32 else torch.finfo(dtype).eps
    torch.testing.assert_close(out.float(), ref_out.float(), rtol=rtol, atol=1e-5)


@pytest.mark.parametrize(
    ("lengths", "k_heads", "v_heads", "k_dim", "v_dim", "with_state", "l2norm", "dtype"),
    [
        ((1,), 1, 1, 16, 16, False, True, torch.float32),  # one token from zeros
        ((63,), 1, 2, 32, 16, True, True, torch.float32),  # a chunk less one, GQA
        ((64,), 2, 2, 16, 32, True, True, torch.bfloat16),  # exactly one chunk
        ((65,), 1, 2, 80, 24, True, True, torch.float32),  # one token into a second chunk; two key tiles
        ((130,), 2, 4, 32, 48, False, True, torch.float16),  # three chunks, two value tiles
        ((63, 1, 65, 0, 64), 2, 4, 16, 16, True, True, torch.float32),  # several sequences, one empty
        ((70, 3), 1, 1, 24, 20, True, False, torch.float32),  # no l2 norm, dims off the tile sizes
    ],
)
def test_triton_chunk_matches_the_reference(
    gen, lengths, k_heads, v_heads, k_dim, v_dim, with_state, l2norm, dtype
):
    q, k, v, g, beta, cu = _triton_inputs(gen, lengths, k_heads, v_heads, k_dim, v_dim, dtype, l2norm)
    init = torch.randn(len(lengths), v_heads, k_dim, v_dim, generator=gen) * 0.5 if with_state else None
    scale = None if l2norm else 0.7
    init_before = None if init is None else init.clone()
    out, state = chunk_gated_delta_rule(q, k, v, g, beta, cu, init, scale=scale, use_qk_l2norm=l2norm)
    ref_out, ref_state = chunk_gated_delta_rule_torch(
        q, k, v, g, beta, cu, init, scale=scale, use_qk_l2norm=l2norm
    )
    _assert_matches_reference(out, state, ref_out, ref_state, dtype)
    if init is not None:
        assert torch.equal(init, init_before)
        empty = [i for i, n in enumerate(lengths) if n == 0]
        assert all(torch.equal(state[i], init[i]) for i in empty)  # an empty sequence keeps its state


@pytest.mark.parametrize(("bk", "bv"), [(16, 16), (32, 16)])
def test_triton_chunk_with_several_key_tiles_keeps_the_state_in_memory(gen, monkeypatch, bk, bv):
    """Ascend's unified buffer splits a head into key tiles (the state passes through the state buffer
    between chunks); the result is the one-tile walk's."""
    q, k, v, g, beta, cu = _triton_inputs(gen, (70, 1, 130), 2, 4, 40, 24, torch.float32, True)
    init = torch.randn(3, 4, 40, 24, generator=gen)
    whole, whole_state = chunk_gated_delta_rule(q, k, v, g, beta, cu, init)
    monkeypatch.setattr(triton_gdr, "tiles", lambda geo, k_dim, v_dim: (bk, bv))
    out, state = chunk_gated_delta_rule(q, k, v, g, beta, cu, init)
    ref_out, ref_state = chunk_gated_delta_rule_torch(q, k, v, g, beta, cu, init)
    _assert_matches_reference(out, state, ref_out, ref_state, torch.float32)
    torch.testing.assert_close(out, whole, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state, whole_state, rtol=1e-5, atol=1e-5)


def test_triton_chunk_takes_any_strides(gen):
    """The runner's q/k/v are views of one projection; here a head-interleaved and a head-major layout."""
    tokens, heads, k_dim, v_dim = 70, 2, 16, 32
    packed = torch.randn(tokens, heads, 3 * k_dim, generator=gen)
    q, k = packed[..., :k_dim], packed[..., k_dim : 2 * k_dim]  # token stride 96, head stride 48
    v = torch.randn(2 * heads, tokens, v_dim, generator=gen).transpose(0, 1)  # head-major
    g = -torch.rand(2 * heads, tokens, generator=gen).t()
    beta = torch.rand(2 * heads, tokens, generator=gen).t()
    cu = torch.tensor([0, 30, tokens], dtype=torch.int32)
    init = torch.randn(2, 2 * heads, k_dim, v_dim, generator=gen)
    out, state = chunk_gated_delta_rule(q, k, v, g, beta, cu, init)
    ref = chunk_gated_delta_rule_torch(q.contiguous(), k.contiguous(), v.contiguous(), g, beta, cu, init)
    _assert_matches_reference(out, state, *ref, torch.float32)


def test_public_chunk_launches_the_triton_kernels(gen, monkeypatch):
    from triton.runtime import interpreter

    launches = []
    real_call = interpreter.GridExecutor.__call__

    def counting_call(self, *args, **kwargs):
        launches.append(self.fn.__name__)
        return real_call(self, *args, **kwargs)

    monkeypatch.setattr(interpreter.GridExecutor, "__call__", counting_call)
    q, k, v, g, beta, cu = _triton_inputs(gen, (5, 3), 1, 1, 16, 16, torch.float32, True)
    chunk_gated_delta_rule(q, k, v, g, beta, cu)
    assert launches == ["_wy_kernel", "_walk_kernel"]


@pytest.mark.parametrize(("ub_kib", "expected"), [(192, (32, 32)), (256, (64, 32))])
def test_tiles_fit_half_the_unified_buffer(ub_kib, expected):
    """The A2/A3 (192 KiB) and A5 (256 KiB) profiles: Qwen3-Next's 128 x 128 heads tile within the UB."""
    geo = LaunchGeometry("npu", 48, ub_kib * 1024)
    bk, bv = triton_gdr.tiles(geo, 128, 128)
    assert (bk, bv) == expected
    assert max(triton_gdr._wy_bytes(bk, bv), triton_gdr._walk_bytes(bk, bv)) <= geo.ub_bytes // 2
    assert max(triton_gdr._wy_bytes(2 * bk, bv), triton_gdr._walk_bytes(2 * bk, bv)) > geo.ub_bytes // 2


def test_tiles_shrink_to_a_smaller_unified_buffer_and_refuse_one_too_small():
    geo = LaunchGeometry("npu", 8, 160 * 1024)
    bk, bv = triton_gdr.tiles(geo, 128, 128)
    assert (bk, bv) < (64, 32) and min(bk, bv) >= 16
    assert max(triton_gdr._wy_bytes(bk, bv), triton_gdr._walk_bytes(bk, bv)) <= geo.ub_bytes // 2
    with pytest.raises(
        GeometryError, match=r"64-token chunk's smallest tiles .* exceed half of ub_bytes=65536"
    ):
        triton_gdr.tiles(LaunchGeometry("npu", 8, 64 * 1024), 128, 128)
    assert triton_gdr.tiles(LaunchGeometry("cuda", 132), 128, 128) == (128, 64)  # no UB: the caps
    assert triton_gdr.tiles(LaunchGeometry("cuda", 132), 8, 8) == (16, 16)  # tl.dot's smallest tile


def test_triton_chunk_with_16_bit_chain_products_stays_within_16_bit_rounding(gen, monkeypatch):
    """CUDA's walk takes 16-bit operands for its products (``CHAIN_16BIT``, float32 accumulation) and keeps the WY
    scratch in 16 bits (``W_16BIT``, ``U_16BIT``). Run here through the interpreter (in float16: its bfloat16
    products are not numpy's), it is not the float32 walk and stays within float16 rounding of the reference."""
    q, k, v, g, beta, cu = _triton_inputs(gen, (70, 1, 130), 2, 4, 32, 32, torch.float16, True)
    init = torch.randn(3, 4, 32, 32, generator=gen) * 0.5
    monkeypatch.setattr(triton_gdr, "_dot_dtype", lambda x: triton_gdr.tl.float16)  # the device's choice
    _, full_state = chunk_gated_delta_rule(q, k, v, g, beta, cu, init)
    monkeypatch.setattr(triton_gdr, "CHAIN_16BIT", {"interpreter": True})
    out, state = chunk_gated_delta_rule(q, k, v, g, beta, cu, init)
    ref_out, ref_state = chunk_gated_delta_rule_torch(q, k, v, g, beta, cu, init)
    assert out.dtype == torch.float16 and state.dtype == torch.float32
    assert not torch.equal(state, full_state)
    assert (state - ref_state).abs().max() > (full_state - ref_state).abs().max()
    eps = torch.finfo(torch.float16).eps
    torch.testing.assert_close(state, ref_state, rtol=4 * eps, atol=4 * eps)
    torch.testing.assert_close(out.float(), ref_out.float(), rtol=4 * eps, atol=4 * eps)
    # 16-bit W scratch: W S took W in 16 bits already, so nothing changes; 16-bit U: within the same bound.
    monkeypatch.setattr(triton_gdr, "W_16BIT", {"interpreter": True})
    w_out, w_state = chunk_gated_delta_rule(q, k, v, g, beta, cu, init)
    assert torch.equal(w_out, out) and torch.equal(w_state, state)
    monkeypatch.setattr(triton_gdr, "U_16BIT", {"interpreter": True})
    u_out, u_state = chunk_gated_delta_rule(q, k, v, g, beta, cu, init)
    assert not torch.equal(u_state, state)
    torch.testing.assert_close(u_state, ref_state, rtol=4 * eps, atol=4 * eps)
    torch.testing.assert_close(u_out.float(), ref_out.float(), rtol=4 * eps, atol=4 * eps)
