"""Gated delta rule of Gated DeltaNet layers (Qwen3-Next linear attention).

Per value head with state ``S`` (``[K, V]``), log decay ``g_t`` and write strength ``beta_t``::

    S'_t = exp(g_t) * S_{t-1}
    S_t  = S'_t + k_t (beta_t * (v_t - S'_t^T k_t))^T
    o_t  = S_t^T (scale * q_t)

:func:`recurrent_gated_delta_rule` runs this token by token (decode, plain torch);
:func:`chunk_gated_delta_rule` computes the same result a chunk at a time (prefill): within a chunk
the corrected values ``u`` solve a unit lower-triangular system, so a chunk costs a few matmuls
instead of one state update per token. It runs the Triton kernel (``_triton/gated_delta_rule.py``) where
Triton runs, else :func:`chunk_gated_delta_rule_torch`. Both take packed variable-length sequences
(``cu_seqlens``) and one initial state per sequence.
"""

from __future__ import annotations

import itertools

import torch

from vllm_ascend.kernels._backend import dispatch

#: Tokens per chunk of :func:`chunk_gated_delta_rule` (the chunk size of vLLM's FLA kernels).
CHUNK_SIZE = 64


def _l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def _check_shapes(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    cu_seqlens: torch.Tensor,
    initial_state: torch.Tensor | None,
) -> None:
    """Refuse inconsistent shapes (read from the tensors' metadata: no host sync)."""
    tokens, k_heads, k_dim = q.shape
    v_heads, v_dim = v.shape[1], v.shape[2]
    if k.shape != q.shape or v.shape[0] != tokens or g.shape != (tokens, v_heads) or beta.shape != g.shape:
        raise ValueError(
            f"gated delta rule shapes: q {tuple(q.shape)} and k {tuple(k.shape)} must be [T, Hk, K], v "
            f"{tuple(v.shape)} [T, Hv, V], g {tuple(g.shape)} and beta {tuple(beta.shape)} [T, Hv]"
        )
    if v_heads % k_heads:
        raise ValueError(f"value heads ({v_heads}) must be a multiple of key heads ({k_heads})")
    if cu_seqlens.dim() != 1 or cu_seqlens.shape[0] < 1:
        raise ValueError(f"cu_seqlens must be [N + 1] offsets; got shape {tuple(cu_seqlens.shape)}")
    num_seqs = cu_seqlens.shape[0] - 1
    if initial_state is not None and initial_state.shape != (num_seqs, v_heads, k_dim, v_dim):
        raise ValueError(
            f"initial_state {tuple(initial_state.shape)} must be [N, Hv, K, V] = "
            f"{(num_seqs, v_heads, k_dim, v_dim)}"
        )


def _prepare(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    cu_seqlens: torch.Tensor,
    initial_state: torch.Tensor | None,
    scale: float | None,
    use_qk_l2norm: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, list[int]]:
    """Validate shapes and offsets; float32 copies with q/k expanded to the value heads, normalised and q
    scaled."""
    _check_shapes(q, k, v, g, beta, cu_seqlens, initial_state)
    tokens, k_heads, k_dim = q.shape
    v_heads, v_dim = v.shape[1], v.shape[2]
    starts = [int(s) for s in cu_seqlens.tolist()]
    if starts[0] != 0 or starts[-1] != tokens or any(b < a for a, b in itertools.pairwise(starts)):
        raise ValueError(f"cu_seqlens must rise from 0 to the token count {tokens}; got {starts}")
    groups = v_heads // k_heads
    qf = q.to(torch.float32).repeat_interleave(groups, dim=1)
    kf = k.to(torch.float32).repeat_interleave(groups, dim=1)
    if use_qk_l2norm:
        qf, kf = _l2norm(qf), _l2norm(kf)
    qf = qf * (k_dim**-0.5 if scale is None else scale)
    if initial_state is None:
        state = torch.zeros(len(starts) - 1, v_heads, k_dim, v_dim, dtype=torch.float32, device=q.device)
    else:
        state = initial_state.to(torch.float32).clone()
    return qf, kf, v.to(torch.float32), g.to(torch.float32), beta.to(torch.float32), state, starts


def recurrent_gated_delta_rule(
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
    """The gated delta rule one token at a time; returns ``(out [T, Hv, V] in v's dtype, state)``.

    ``q``, ``k``: ``[T, Hk, K]``; ``v``: ``[T, Hv, V]`` with ``Hv`` a multiple of ``Hk`` (value head
    ``h`` reads key head ``h // (Hv / Hk)``); ``g`` (log decay, ``<= 0``), ``beta``: ``[T, Hv]``;
    ``cu_seqlens``: ``[N + 1]`` offsets of the packed sequences; ``initial_state``: ``[N, Hv, K, V]``
    or ``None`` (zeros). ``scale`` defaults to ``K ** -0.5``; ``use_qk_l2norm`` normalises q and k
    first. The final state is ``[N, Hv, K, V]`` float32. Arithmetic in float32.
    """
    qf, kf, vf, gf, bf, state, starts = _prepare(
        q, k, v, g, beta, cu_seqlens, initial_state, scale, use_qk_l2norm
    )
    out = torch.empty(vf.shape, dtype=torch.float32, device=v.device)
    for n in range(len(starts) - 1):
        s = state[n]
        for t in range(starts[n], starts[n + 1]):
            s = s * torch.exp(gf[t])[:, None, None]
            delta = (vf[t] - torch.einsum("hkv,hk->hv", s, kf[t])) * bf[t][:, None]
            s = s + kf[t][:, :, None] * delta[:, None, :]
            out[t] = torch.einsum("hkv,hk->hv", s, qf[t])
        state[n] = s
    return out.to(v.dtype), state


def _chunk(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk, all heads: ``q``, ``k`` ``[H, C, K]``, ``v`` ``[H, C, V]``, ``g``, ``beta`` ``[H, C]``,
    ``state`` ``[H, K, V]`` at the chunk start → (out ``[H, C, V]``, state at the chunk end)."""
    length = q.shape[1]
    gamma = torch.cumsum(g, dim=1)  # log of the decay from the chunk start through token i
    lower = torch.ones(length, length, dtype=torch.bool, device=q.device).tril()
    # decay[h, i, j] = exp(gamma_i - gamma_j) for j <= i (decay between tokens j and i), else 0.
    diff = (gamma[:, :, None] - gamma[:, None, :]).masked_fill(~lower, float("-inf"))
    decay = torch.exp(diff)
    # u_i = beta_i (v_i - exp(gamma_i) S0^T k_i - sum_{j<i} decay_ij (k_i . k_j) u_j): (I + A) u = rhs.
    rhs = beta[:, :, None] * (v - torch.exp(gamma)[:, :, None] * (k @ state))
    strict = (decay * (k @ k.transpose(1, 2))).tril(-1) * beta[:, :, None]
    system = strict + torch.eye(length, dtype=q.dtype, device=q.device)
    u = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
    # o_i = exp(gamma_i) S0^T q_i + sum_{j<=i} decay_ij (q_i . k_j) u_j
    out = torch.exp(gamma)[:, :, None] * (q @ state) + (decay * (q @ k.transpose(1, 2))) @ u
    to_end = torch.exp(gamma[:, -1:] - gamma)  # decay from token j to the chunk end
    new_state = torch.exp(gamma[:, -1])[:, None, None] * state + k.transpose(1, 2) @ (to_end[:, :, None] * u)
    return out, new_state


def chunk_gated_delta_rule_torch(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    cu_seqlens: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    scale: float | None = None,
    use_qk_l2norm: bool = True,
    chunk_size: int = CHUNK_SIZE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference of :func:`chunk_gated_delta_rule`, ``chunk_size`` tokens at a time (any size gives the same
    result); each sequence's chunks start at its first token. Checks ``cu_seqlens``' values too."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1; got {chunk_size}")
    qf, kf, vf, gf, bf, state, starts = _prepare(
        q, k, v, g, beta, cu_seqlens, initial_state, scale, use_qk_l2norm
    )
    out = torch.empty(vf.shape, dtype=torch.float32, device=v.device)
    for n in range(len(starts) - 1):
        s = state[n]
        for c in range(starts[n], starts[n + 1], chunk_size):
            e = min(c + chunk_size, starts[n + 1])
            o, s = _chunk(
                qf[c:e].transpose(0, 1),
                kf[c:e].transpose(0, 1),
                vf[c:e].transpose(0, 1),
                gf[c:e].transpose(0, 1),
                bf[c:e].transpose(0, 1),
                s,
            )
            out[c:e] = o.transpose(0, 1)
        state[n] = s
    return out.to(v.dtype), state


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
    """:func:`recurrent_gated_delta_rule`'s result computed a chunk of :data:`CHUNK_SIZE` tokens at a time
    (same arguments and returns; any strides). Shapes are checked from the tensors' metadata; the Triton
    path reads ``cu_seqlens`` on the device only (no host sync), so its values are checked by the reference
    alone."""
    _check_shapes(q, k, v, g, beta, cu_seqlens, initial_state)
    impl = dispatch("gated_delta_rule", "chunk_gated_delta_rule", chunk_gated_delta_rule_torch, q.device)
    return impl(q, k, v, g, beta, cu_seqlens, initial_state, scale, use_qk_l2norm)
