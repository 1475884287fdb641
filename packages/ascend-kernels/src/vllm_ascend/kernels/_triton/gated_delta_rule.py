"""Triton :func:`vllm_ascend.kernels.chunk_gated_delta_rule`: two launches.

Per chunk of ``CHUNK`` tokens of a sequence and value head (``γ``: cumulative log decay from the chunk start,
``D[i, j] = exp(γ_i - γ_j)`` for ``j <= i``, ``k̂``/``q̂``: l2-normalised, q scaled, ``T = (I + A)^-1`` with
``A = strictly_lower(β k̂ k̂^T ∘ D)``), the WY form of the chunk: ``W = T (β exp(γ) k̂)``, ``U = T (β v)``, so
that the corrected values from the state ``S`` at the chunk start are ``u = U - W S``.

1. ``_wy_kernel``, one program per (chunk, value head), all chunks at once (they do not depend on the state):
   ``T`` by block doubling (the inverses of the diagonal blocks of size ``2s`` from those of size ``s``:
   ``T ← T - T (M_s ∘ A) T``, ``M_s`` the lower-left ``s``-blocks of each ``2s``-block; ``log2(CHUNK)`` steps
   of two matmuls, exact as the recursive triangular inverse is), then ``W`` and ``U``, written to scratch
   ``[Hv, T, K]`` / ``[Hv, T, V]`` (chunk rows at their tokens; 16-bit on CUDA, :data:`W_16BIT`). Programs
   find their chunk from ``cu_seqlens`` on the device (no host sync).
2. ``_walk_kernel``, one program per (sequence, value head, value tile), walking the sequence's chunks:
   ``u = U - W S``, ``o = exp(γ) q̂ S + (q̂ k̂^T ∘ D) u``, ``S ← exp(γ_L) S + k̂^T (exp(γ_L - γ) u)``. Only
   ``W S`` and the state update sit on the chain from one chunk to the next; every load is of inputs or of
   the WY scratch, so the next chunk's loads need not wait for the state. The columns of ``S`` evolve
   independently, so a program owns ``BV`` of them. Where one key tile spans the head (``BK >= K``: CUDA)
   the state stays in registers for the whole walk; with several key tiles (Ascend's unified buffer) it is
   kept in the output state buffer between passes.

Dots: 16-bit ``q k^T`` / ``k k^T`` dot the inputs as they are (exact products, float32 sums; float32 under
the interpreter, whose 16-bit dot is not the devices'); float32 operands at :data:`DOT_PRECISION`, except the
walk's on CUDA, which take the inputs' 16-bit type (:data:`CHAIN_16BIT`). Tiles:
``BK`` / ``BV`` chosen so each kernel's live tiles fit half the device's unified buffer on Ascend
(:func:`tiles`); no warps there.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_ascend.kernels._geometry import GeometryError, LaunchGeometry, geometry, launch
from vllm_ascend.kernels.gated_delta_rule import CHUNK_SIZE

#: Tokens per chunk (a power of two, >= ``tl.dot``'s 16).
CHUNK = CHUNK_SIZE
#: Widest key tile tried: a whole 128-wide head, so the walk keeps its state in registers.
_BK_CAP = 128
#: Widest value tile per launch backend (default 32).
BV_CAP = {"cuda": 64}
#: Warps of the walk on CUDA.
_WARPS = 8
#: ``tl.dot``'s ``input_precision`` for float32 operands, per launch backend. CUDA: TF32 (H100, 2026-12-07,
#: ``benchmarks/device-runs/2026-12-07``): IEEE float32 dots need FMA loops that spilled registers and ran
#: 7-10x slower; TF32 leaves the outputs within 5e-3 of the largest value of the float32 torch reference
#: (vLLM's FLA: 9e-3).
DOT_PRECISION = {"cuda": "tf32", "npu": "ieee", "interpreter": "ieee"}
_DOT_MIN = 16
#: Sequences whose offsets one step of the WY kernel's chunk search reads.
_SEQ_TILE = 64
_EPS = 1e-6
#: Launch backends whose walk takes 16-bit operands (the inputs' dtype) for its chain products (``W S``, the state
#: update) and its outputs (``q S``, ``P u``), with float32 accumulation: FLA's choice, twice TF32's tensor rate.
#: 1.05-1.13x the float32 walk on an H100, errors within FLA's (``benchmarks/RESULTS.md``, eighth session).
CHAIN_16BIT = {"cuda": True}
#: Launch backends (among :data:`CHAIN_16BIT`'s) whose WY scratch ``W`` / ``U`` is kept in the inputs' 16-bit
#: type, as FLA keeps it: ``W`` is cast to it for ``W S`` anyway; ``U`` loses float32's low bits before
#: ``u = U - W S``. Half the walk's scratch bytes: 1.04-1.05x on an H100, state error still below FLA's
#: (``benchmarks/RESULTS.md``, eighth session).
W_16BIT = {"cuda": True}
U_16BIT = {"cuda": True}
#: Software-pipelining stages of the WY launch per launch backend (Triton's default elsewhere). CUDA: 1, no
#: prefetch of its key / value tiles, 1.06-1.07x the default on an H100 (``benchmarks/RESULTS.md``, eighth session).
WY_STAGES = {"cuda": 1}
#: Warps of the WY launch (CUDA; the walk keeps :data:`_WARPS`): 4 is 1.16-1.22x 8 with one stage on an H100
#: (2: 1.09-1.14x, 16: 0.8x).
_WY_WARPS = 4


def _wy_bytes(bk: int, bv: int) -> int:
    """float32 bytes live at the WY kernel's widest point: five ``[CHUNK, CHUNK]`` matrices while inverting
    (``A``, ``T``, a masked copy, two products); two and a key tile with its square while summing ``k k^T``;
    ``T`` beside a tile's input, scaled input and product while writing ``W`` / ``U``."""
    c2 = CHUNK * CHUNK
    return 4 * max(5 * c2, 2 * c2 + 2 * CHUNK * bk, c2 + 3 * CHUNK * max(bk, bv))


def _walk_bytes(bk: int, bv: int) -> int:
    """float32 bytes live at the walk kernel's widest point: over the key tiles, ``q k^T``, ``W S`` and
    ``q S``, the q / k / W tiles and a state tile; after them, ``q k^T``, ``D`` and their product beside four
    ``[CHUNK, BV]`` tiles."""
    keys = 2 * CHUNK * CHUNK + 2 * CHUNK * bv + 3 * CHUNK * bk + bk * bv
    values = 3 * CHUNK * CHUNK + 4 * CHUNK * bv
    return 4 * max(keys, values)


def tiles(geo: LaunchGeometry, k_dim: int, v_dim: int) -> tuple[int, int]:
    """``(BK, BV)``: powers of two in ``[16, cap]``: the widest value tile, then the widest key tile, whose
    live tiles fit half the unified buffer (Ascend; the caps on CUDA and under the interpreter)."""
    bk_cap = max(_DOT_MIN, min(_BK_CAP, triton.next_power_of_2(k_dim)))
    bv_cap = max(_DOT_MIN, min(BV_CAP.get(geo.backend, 32), triton.next_power_of_2(v_dim)))
    if geo.ub_bytes is None:
        return bk_cap, bv_cap
    budget = geo.ub_bytes // 2
    bv = bv_cap
    while bv >= _DOT_MIN:
        bk = bk_cap
        while bk >= _DOT_MIN:
            if max(_wy_bytes(bk, bv), _walk_bytes(bk, bv)) <= budget:
                return bk, bv
            bk //= 2
        bv //= 2
    raise GeometryError(
        f"chunk_gated_delta_rule: the {CHUNK}-token chunk's smallest tiles "
        f"({max(_wy_bytes(_DOT_MIN, _DOT_MIN), _walk_bytes(_DOT_MIN, _DOT_MIN))} bytes) exceed half of "
        f"ub_bytes={geo.ub_bytes}"
    )


def _dot_dtype(x: torch.Tensor) -> tl.dtype:
    """``x``'s own 16-bit type on devices (its products are exact in float32), float32 otherwise and under
    the interpreter (cpu)."""
    if x.device.type == "cpu":
        return tl.float32
    return {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}.get(x.dtype, tl.float32)


@triton.jit
def _tile(ptr, t, t_stride, c, c_stride, mask, DTYPE: tl.constexpr):
    """``x[t, c]`` of one head in ``DTYPE`` (zeros outside ``mask``)."""
    offs = t[:, None].to(tl.int64) * t_stride + c[None, :].to(tl.int64) * c_stride
    return tl.load(ptr + offs, mask=mask, other=0.0).to(DTYPE)


@triton.jit
def _chunk_gates(g_ptr, beta_ptr, g_st, g_sh, b_st, b_sh, head, t, t_ok):
    """The chunk's ``γ`` (cumulative ``g``, flat past the sequence end) and ``β`` (zero there)."""
    g = tl.load(g_ptr + t * g_st + head * g_sh, mask=t_ok, other=0.0).to(tl.float32)
    beta = tl.load(beta_ptr + t * b_st + head * b_sh, mask=t_ok, other=0.0).to(tl.float32)
    return tl.cumsum(g, axis=0), beta


@triton.jit(do_not_specialize=["num_seqs", "tokens"])
def _wy_kernel(
    k_ptr,
    v_ptr,
    g_ptr,
    beta_ptr,
    cu_ptr,
    w_ptr,
    u_ptr,
    k_st,
    k_sh,
    k_sk,
    v_st,
    v_sh,
    v_sv,
    g_st,
    g_sh,
    b_st,
    b_sh,
    eps,
    num_seqs,
    tokens,
    groups,
    K,
    V,
    L2NORM: tl.constexpr,
    CHUNK: tl.constexpr,
    LOG_CHUNK: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    SEQ_TILE: tl.constexpr,
    PRECISION: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
):
    slot = tl.program_id(0)
    head = tl.program_id(1)
    # The slot-th chunk of the batch, sequences in order: its sequence's end and its first token.
    before = tl.zeros([], dtype=tl.int64)
    end = tl.zeros([], dtype=tl.int64)
    c0 = tl.full([], -1, dtype=tl.int64)
    for n0 in range(0, num_seqs, SEQ_TILE):
        n = n0 + tl.arange(0, SEQ_TILE)
        n_ok = n < num_seqs
        s = tl.load(cu_ptr + n, mask=n_ok, other=0).to(tl.int64)
        e = tl.load(cu_ptr + n + 1, mask=n_ok, other=0).to(tl.int64)
        count = tl.where(n_ok, (e - s + CHUNK - 1) // CHUNK, 0)
        upto = tl.cumsum(count, axis=0) + before
        hit = (upto - count <= slot) & (slot < upto)
        c0 = tl.maximum(c0, tl.max(tl.where(hit, s + (slot - (upto - count)) * CHUNK, -1), axis=0))
        end = tl.maximum(end, tl.max(tl.where(hit, e, 0), axis=0))
        before += tl.sum(count, axis=0)
    if c0 >= 0:
        rows = tl.arange(0, CHUNK)
        ri = rows[:, None]
        rj = rows[None, :]
        t = c0 + rows
        t_ok = t < end
        gamma, beta = _chunk_gates(g_ptr, beta_ptr, g_st, g_sh, b_st, b_sh, head, t, t_ok)
        k_base = k_ptr + (head // groups).to(tl.int64) * k_sh
        kk = tl.zeros([CHUNK, CHUNK], dtype=tl.float32)
        k_norm = tl.zeros([CHUNK], dtype=tl.float32)
        for k0 in range(0, K, BK):
            kc = k0 + tl.arange(0, BK)
            kt = _tile(k_base, t, k_st, kc, k_sk, t_ok[:, None] & (kc < K)[None, :], DOT_DTYPE)
            kk += tl.dot(kt, tl.trans(kt), input_precision=PRECISION)
            if L2NORM:
                kf = kt.to(tl.float32)
                k_norm += tl.sum(kf * kf, axis=1)
        if L2NORM:
            k_scale = tl.rsqrt(k_norm + eps)
        else:
            k_scale = tl.full([CHUNK], 1.0, tl.float32)
        kk = kk * k_scale[:, None] * k_scale[None, :]
        decay = tl.exp(tl.where(rj < ri, gamma[:, None] - gamma[None, :], float("-inf")))
        a = kk * decay * beta[:, None]
        inv = tl.where(ri == rj, 1.0, 0.0)
        for level in range(LOG_CHUNK):
            off = ((ri >> (level + 1)) == (rj >> (level + 1))) & ((ri >> level) > (rj >> level))
            inv -= tl.dot(
                tl.dot(inv, tl.where(off, a, 0.0), input_precision=PRECISION), inv, input_precision=PRECISION
            )
        # W = T (β exp(γ) k̂) and U = T (β v), tile by tile.
        row = head.to(tl.int64) * tokens + t
        k_rows = (beta * tl.exp(gamma) * k_scale)[:, None]
        for k0 in range(0, K, BK):
            kc = k0 + tl.arange(0, BK)
            k_ok = (kc < K)[None, :]
            kf = _tile(k_base, t, k_st, kc, k_sk, t_ok[:, None] & k_ok, tl.float32)
            w = tl.dot(inv, k_rows * kf, input_precision=PRECISION)
            tl.store(
                w_ptr + row[:, None] * K + kc[None, :],
                w.to(w_ptr.dtype.element_ty),
                mask=t_ok[:, None] & k_ok,
            )
        v_base = v_ptr + head.to(tl.int64) * v_sh
        for v0 in range(0, V, BV):
            vc = v0 + tl.arange(0, BV)
            v_ok = (vc < V)[None, :]
            vf = _tile(v_base, t, v_st, vc, v_sv, t_ok[:, None] & v_ok, tl.float32)
            u = tl.dot(inv, beta[:, None] * vf, input_precision=PRECISION)
            tl.store(
                u_ptr + row[:, None] * V + vc[None, :],
                u.to(u_ptr.dtype.element_ty),
                mask=t_ok[:, None] & v_ok,
            )


@triton.jit
def _cdot(a, b, CHAIN16: tl.constexpr, DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr):
    """``a @ b`` in float32: from 16-bit operands where ``CHAIN16``, else at ``PRECISION``."""
    if CHAIN16:
        return tl.dot(a.to(DOT_DTYPE), b.to(DOT_DTYPE))
    else:
        return tl.dot(a, b, input_precision=PRECISION)


@triton.jit(do_not_specialize=["tokens"])
def _walk_kernel(
    q_ptr,
    k_ptr,
    g_ptr,
    cu_ptr,
    w_ptr,
    u_ptr,
    state_ptr,
    out_ptr,
    q_st,
    q_sh,
    q_sk,
    k_st,
    k_sh,
    k_sk,
    g_st,
    g_sh,
    o_st,
    o_sh,
    scale,
    eps,
    tokens,
    v_heads,
    groups,
    K,
    V,
    L2NORM: tl.constexpr,
    CHUNK: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    ONE_KEY_TILE: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    PRECISION: tl.constexpr,
    CHAIN16: tl.constexpr,
):
    pid = tl.program_id(0)
    seq = pid // v_heads
    head = pid % v_heads
    vc = tl.program_id(1) * BV + tl.arange(0, BV)
    v_ok = vc < V
    start = tl.load(cu_ptr + seq).to(tl.int64)
    end = tl.load(cu_ptr + seq + 1).to(tl.int64)
    q_base = q_ptr + (head // groups).to(tl.int64) * q_sh
    k_base = k_ptr + (head // groups).to(tl.int64) * k_sh
    s_base = state_ptr + pid.to(tl.int64) * K * V
    rows = tl.arange(0, CHUNK)
    ri = rows[:, None]
    rj = rows[None, :]
    if ONE_KEY_TILE:
        kc1 = tl.arange(0, BK)
        s1_ptrs = s_base + kc1[:, None] * V + vc[None, :]
        s1_ok = (kc1 < K)[:, None] & v_ok[None, :]
        state = tl.load(s1_ptrs, mask=s1_ok, other=0.0)
    for c0 in range(start, end, CHUNK):
        t = c0 + rows
        t_ok = t < end
        length = tl.minimum(end - c0, CHUNK)
        g = tl.load(g_ptr + t * g_st + head * g_sh, mask=t_ok, other=0.0).to(tl.float32)
        gamma = tl.cumsum(g, axis=0)
        gamma_last = tl.sum(tl.where(rows == length - 1, gamma, 0.0), axis=0)
        row = head.to(tl.int64) * tokens + t

        # W S, q S, q k^T and the squared norms over the key tiles.
        ws = tl.zeros([CHUNK, BV], dtype=tl.float32)
        qs = tl.zeros([CHUNK, BV], dtype=tl.float32)
        qk = tl.zeros([CHUNK, CHUNK], dtype=tl.float32)
        k_norm = tl.zeros([CHUNK], dtype=tl.float32)
        q_norm = tl.zeros([CHUNK], dtype=tl.float32)
        for k0 in range(0, K, BK):
            kc = k0 + tl.arange(0, BK)
            k_ok = kc < K
            tile_ok = t_ok[:, None] & k_ok[None, :]
            qt = _tile(q_base, t, q_st, kc, q_sk, tile_ok, DOT_DTYPE)
            kt = _tile(k_base, t, k_st, kc, k_sk, tile_ok, DOT_DTYPE)
            wt = tl.load(w_ptr + row[:, None] * K + kc[None, :], mask=tile_ok, other=0.0)
            if ONE_KEY_TILE:
                st = state
            else:
                st = tl.load(
                    s_base + kc[:, None] * V + vc[None, :], mask=k_ok[:, None] & v_ok[None, :], other=0.0
                )
            qk += tl.dot(qt, tl.trans(kt), input_precision=PRECISION)
            qf = qt.to(tl.float32)
            ws += _cdot(wt, st, CHAIN16, DOT_DTYPE, PRECISION)
            qs += _cdot(qf, st, CHAIN16, DOT_DTYPE, PRECISION)
            if L2NORM:
                kf = kt.to(tl.float32)
                k_norm += tl.sum(kf * kf, axis=1)
                q_norm += tl.sum(qf * qf, axis=1)
        if L2NORM:
            k_scale = tl.rsqrt(k_norm + eps)
            q_scale = tl.rsqrt(q_norm + eps) * scale
        else:
            k_scale = tl.full([CHUNK], 1.0, tl.float32)
            q_scale = tl.full([CHUNK], 1.0, tl.float32) * scale

        # Corrected values, then outputs.
        u = tl.load(u_ptr + row[:, None] * V + vc[None, :], mask=t_ok[:, None] & v_ok[None, :], other=0.0)
        u = u.to(tl.float32) - ws
        decay = tl.exp(tl.where(rj <= ri, gamma[:, None] - gamma[None, :], float("-inf")))
        p = qk * q_scale[:, None] * k_scale[None, :] * decay
        o = tl.exp(gamma)[:, None] * (qs * q_scale[:, None]) + _cdot(p, u, CHAIN16, DOT_DTYPE, PRECISION)
        tl.store(
            out_ptr + t[:, None] * o_st + head * o_sh + vc[None, :],
            o.to(out_ptr.dtype.element_ty),
            mask=t_ok[:, None] & v_ok[None, :],
        )

        # The state at the chunk end.
        w = (tl.exp(gamma_last - gamma) * k_scale)[:, None] * u
        if ONE_KEY_TILE:
            kf = _tile(k_base, t, k_st, kc1, k_sk, t_ok[:, None] & (kc1 < K)[None, :], tl.float32)
            state = tl.exp(gamma_last) * state + _cdot(tl.trans(kf), w, CHAIN16, DOT_DTYPE, PRECISION)
        else:
            for k0 in range(0, K, BK):
                kc = k0 + tl.arange(0, BK)
                k_ok = kc < K
                kf = _tile(k_base, t, k_st, kc, k_sk, t_ok[:, None] & k_ok[None, :], tl.float32)
                s_ptrs = s_base + kc[:, None] * V + vc[None, :]
                s_ok = k_ok[:, None] & v_ok[None, :]
                st = tl.exp(gamma_last) * tl.load(s_ptrs, mask=s_ok, other=0.0)
                tl.store(s_ptrs, st + tl.dot(tl.trans(kf), w, input_precision=PRECISION), mask=s_ok)
    if ONE_KEY_TILE:
        tl.store(s1_ptrs, state, mask=s1_ok)


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    cu_seqlens: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    scale: float | None = None,
    use_qk_l2norm: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    tokens, _, k_dim = q.shape
    v_heads, v_dim = v.shape[1], v.shape[2]
    groups = v_heads // q.shape[1]
    num_seqs = cu_seqlens.shape[0] - 1
    state = torch.empty(num_seqs, v_heads, k_dim, v_dim, dtype=torch.float32, device=q.device)
    if initial_state is None:
        state.zero_()
    else:
        state.copy_(initial_state)
    out = torch.empty(tokens, v_heads, v_dim, dtype=v.dtype, device=v.device)
    if tokens == 0 or num_seqs == 0:
        return out, state
    device = q.device
    geo = geometry(device)
    bk, bv = tiles(geo, k_dim, v_dim)
    dot_dtype = _dot_dtype(q)
    precision = DOT_PRECISION[geo.backend]
    half = q.dtype if q.dtype in (torch.bfloat16, torch.float16) and CHAIN_16BIT.get(geo.backend) else None
    w_dtype = half if half is not None and W_16BIT.get(geo.backend) else torch.float32
    u_dtype = half if half is not None and U_16BIT.get(geo.backend) else torch.float32
    w = torch.empty(v_heads, tokens, k_dim, dtype=w_dtype, device=device)
    u = torch.empty(v_heads, tokens, v_dim, dtype=u_dtype, device=device)
    _wy_kernel[(triton.cdiv(tokens, CHUNK) + num_seqs, v_heads)](
        k, v, g, beta, cu_seqlens, w, u,
        k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
        g.stride(0), g.stride(1), beta.stride(0), beta.stride(1),
        _EPS, num_seqs, tokens, groups, k_dim, v_dim,
        L2NORM=use_qk_l2norm, CHUNK=CHUNK, LOG_CHUNK=CHUNK.bit_length() - 1, BK=bk, BV=bv, SEQ_TILE=_SEQ_TILE,
        PRECISION=precision, DOT_DTYPE=dot_dtype, **launch(device, _WY_WARPS),
        **({"num_stages": WY_STAGES[geo.backend]} if geo.backend in WY_STAGES else {}),
    )  # fmt: skip
    _walk_kernel[(num_seqs * v_heads, triton.cdiv(v_dim, bv))](
        q, k, g, cu_seqlens, w, u, state, out,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        g.stride(0), g.stride(1),
        out.stride(0), out.stride(1),
        float(k_dim**-0.5 if scale is None else scale), _EPS, tokens, v_heads, groups, k_dim, v_dim,
        L2NORM=use_qk_l2norm, CHUNK=CHUNK, BK=bk, BV=bv, ONE_KEY_TILE=bk >= k_dim, DOT_DTYPE=dot_dtype,
        PRECISION=precision, CHAIN16=CHAIN_16BIT.get(geo.backend, False), **launch(device, _WARPS),
    )  # fmt: skip
    return out, state
