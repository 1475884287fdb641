"""Multi-LoRA (punica) shrink and expand: each token's adapter picked from stacked weights.

Adapters sit in stacked tensors, one slot per loaded adapter: ``lora_a`` ``[L, (1,) rank, in]``, ``lora_b``
``[L, (1,) out, rank]`` (vLLM's layout, the singleton layer axis optional). A token's slot comes from the
token->adapter mapping (``-1``: no adapter; such tokens are left untouched). Decode maps every token on its
own (``token_lora_indices``); segmented prefill maps runs of consecutive tokens sharing an adapter
(``seq_starts`` / ``seq_lens`` / ``seq_loras``), so each run is one matrix product. A decode call may also be
given the step's tokens ordered by adapter (:func:`lora_token_order`, built once per step for every layer):
the same result, but each adapter's programs then visit only its own tokens instead of every token tile.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from vllm_ascend.kernels._backend import dispatch, use_triton


def _stacked(weights: torch.Tensor, name: str) -> torch.Tensor:
    """``weights`` as ``[L, rows, cols]`` (vLLM stacks them with a singleton axis 1)."""
    if weights.ndim == 4 and weights.shape[1] == 1:
        return weights[:, 0]
    if weights.ndim != 3:
        raise ValueError(
            f"{name} must be [L, rows, cols] or [L, 1, rows, cols], got shape {tuple(weights.shape)}"
        )
    return weights


def _check_shrink(x: torch.Tensor, a: torch.Tensor, out: torch.Tensor) -> None:
    if x.ndim != 2 or x.shape[1] != a.shape[2]:
        raise ValueError(
            f"x must be [T, {a.shape[2]}] to match lora_a {tuple(a.shape)}, got {tuple(x.shape)}"
        )
    if out.ndim != 2 or out.shape[0] < x.shape[0] or out.shape[1] < a.shape[1]:
        raise ValueError(f"out must be at least [{x.shape[0]}, {a.shape[1]}], got {tuple(out.shape)}")


def _check_expand(z: torch.Tensor, b: torch.Tensor, out: torch.Tensor, offset: int) -> None:
    if z.ndim != 2 or z.shape[1] < b.shape[2]:
        raise ValueError(
            f"z must be [T, >= {b.shape[2]}] to match lora_b {tuple(b.shape)}, got {tuple(z.shape)}"
        )
    if out.ndim != 2 or out.shape[0] < z.shape[0] or not 0 <= offset <= out.shape[1] - b.shape[1]:
        raise ValueError(
            f"out {tuple(out.shape)} has no columns [{offset}, {offset + b.shape[1]}) for {z.shape[0]} tokens"
        )


def lora_token_order(
    token_lora_indices: torch.Tensor,
    num_loras: int,
    token_order: torch.Tensor | None = None,
    lora_starts: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The tokens ordered by adapter: ``token_order`` (int64, every entry of ``token_lora_indices``, stable) and
    ``lora_starts`` (``num_loras + 2`` int64): adapter ``l``'s tokens are ``token_order[lora_starts[l + 1] :
    lora_starts[l + 2]]``, entry 0 begins the tokens without one (``-1``). Device ops only (no host sync,
    capturable); written into the given tensors when passed (persistent buffers a graph reads)."""
    keys, order = torch.sort(token_lora_indices.to(torch.int64), stable=True)
    bounds = torch.arange(-1, num_loras + 1, dtype=torch.int64, device=keys.device)
    starts = torch.searchsorted(keys, bounds)
    if token_order is None or lora_starts is None:
        return order, starts
    if token_order.numel() < order.numel() or lora_starts.numel() < num_loras + 2:
        raise ValueError(
            f"token_order must hold {order.numel()} entries and lora_starts {num_loras + 2}, got "
            f"{token_order.numel()} and {lora_starts.numel()}"
        )
    token_order[: order.numel()].copy_(order)
    lora_starts[: num_loras + 2].copy_(starts)
    return token_order, lora_starts


def lora_reserve(device: torch.device, max_loras: int) -> None:
    """Allocate what the Triton kernels' split reduction keeps across launches (zeroed tile counters) for up to
    ``max_loras`` adapter slots, now: call it eagerly (the punica wrapper does at construction), so a launch first
    made inside a graph capture finds it ready. Nothing to do where the torch references serve."""
    if use_triton(device):
        from vllm_ascend.kernels._triton.lora import reserve_split_counters

        reserve_split_counters(device, max_loras)


def _check_order(loras: int, token_order: torch.Tensor | None, lora_starts: torch.Tensor | None) -> None:
    if (token_order is None) != (lora_starts is None):
        raise ValueError("token_order and lora_starts come together (lora_token_order), got only one of them")
    if lora_starts is not None and lora_starts.numel() < loras + 2:
        raise ValueError(
            f"lora_starts must hold num_loras + 2 = {loras + 2} entries for {loras} adapter slots, "
            f"got {lora_starts.numel()}"
        )


def lora_shrink_segmented_torch(
    x: torch.Tensor,
    lora_a: torch.Tensor,
    out: torch.Tensor,
    seq_starts: torch.Tensor,
    seq_lens: torch.Tensor,
    seq_loras: torch.Tensor,
    max_len: int,
    scale: float,
) -> None:
    """Reference of :func:`lora_shrink_segmented`: one fp32 product per run."""
    a = _stacked(lora_a, "lora_a")
    rank = a.shape[1]
    for start, length, lora in zip(seq_starts.tolist(), seq_lens.tolist(), seq_loras.tolist(), strict=True):
        if lora < 0 or length == 0:
            continue
        rows = slice(start, start + length)
        out[rows, :rank] = (scale * (x[rows].float() @ a[lora].float().T)).to(out.dtype)


def lora_shrink_segmented(
    x: torch.Tensor,
    lora_a: torch.Tensor,
    out: torch.Tensor,
    seq_starts: torch.Tensor,
    seq_lens: torch.Tensor,
    seq_loras: torch.Tensor,
    max_len: int,
    scale: float,
) -> None:
    """``out[s:s+n, :rank] = scale * x[s:s+n] @ lora_a[l]^T`` per run ``(s, n, l)`` with ``l >= 0``; in place.

    ``x``: ``[T, in]``; ``out``: ``[>= T, >= rank]`` (fp32 in vLLM); other rows untouched. ``max_len``: the
    longest run (the Triton grid's row extent).
    """
    a = _stacked(lora_a, "lora_a")
    _check_shrink(x, a, out)
    impl = dispatch("lora", "lora_shrink", lora_shrink_segmented_torch, x.device)
    impl(x, a, out, seq_starts, seq_lens, seq_loras, max_len, scale)


def lora_shrink_torch(
    x: torch.Tensor,
    lora_a: torch.Tensor,
    out: torch.Tensor,
    token_lora_indices: torch.Tensor,
    scale: float,
    token_order: torch.Tensor | None = None,
    lora_starts: torch.Tensor | None = None,
) -> None:
    """Reference of :func:`lora_shrink`: the selected adapters gathered, one batched fp32 product (the order,
    which only saves work, is not needed)."""
    a = _stacked(lora_a, "lora_a")
    idx = token_lora_indices[: x.shape[0]].to(torch.int64)
    rows = (idx >= 0).nonzero().squeeze(1)
    picked = a[idx[rows]].float()
    out[rows, : a.shape[1]] = (scale * torch.einsum("ti,tri->tr", x[rows].float(), picked)).to(out.dtype)


def lora_shrink(
    x: torch.Tensor,
    lora_a: torch.Tensor,
    out: torch.Tensor,
    token_lora_indices: torch.Tensor,
    scale: float,
    token_order: torch.Tensor | None = None,
    lora_starts: torch.Tensor | None = None,
) -> None:
    """``out[t, :rank] = scale * x[t] @ lora_a[i_t]^T`` for each token ``t`` with ``i_t >= 0``; in place.

    Decode: ``token_lora_indices`` ``[>= T]`` maps each token to its adapter slot; ``token_order`` /
    ``lora_starts``: optionally, :func:`lora_token_order` of it.
    """
    a = _stacked(lora_a, "lora_a")
    _check_shrink(x, a, out)
    _check_order(a.shape[0], token_order, lora_starts)
    impl = dispatch("lora", "lora_shrink_tokens", lora_shrink_torch, x.device)
    impl(x, a, out, token_lora_indices[: x.shape[0]], scale, token_order, lora_starts)


def lora_expand_segmented_torch(
    z: torch.Tensor,
    lora_b: torch.Tensor,
    out: torch.Tensor,
    seq_starts: torch.Tensor,
    seq_lens: torch.Tensor,
    seq_loras: torch.Tensor,
    max_len: int,
    offset: int,
    add_inputs: bool,
) -> None:
    """Reference of :func:`lora_expand_segmented`: one fp32 product per run."""
    b = _stacked(lora_b, "lora_b")
    rank, width = b.shape[2], b.shape[1]
    for start, length, lora in zip(seq_starts.tolist(), seq_lens.tolist(), seq_loras.tolist(), strict=True):
        if lora < 0 or length == 0:
            continue
        rows = slice(start, start + length)
        delta = z[rows, :rank].float() @ b[lora].float().T
        target = out[rows, offset : offset + width]
        target.copy_((target.float() + delta) if add_inputs else delta)


def lora_expand_segmented(
    z: torch.Tensor,
    lora_b: torch.Tensor,
    out: torch.Tensor,
    seq_starts: torch.Tensor,
    seq_lens: torch.Tensor,
    seq_loras: torch.Tensor,
    max_len: int,
    offset: int = 0,
    add_inputs: bool = True,
) -> None:
    """``out[s:s+n, offset:offset+N] (+)= z[s:s+n, :rank] @ lora_b[l]^T`` per run with ``l >= 0``; in place.

    ``offset`` places one slice of a merged layer (QKV, gate-up); ``add_inputs`` adds to ``out`` instead of
    overwriting it. Sums in fp32, one cast to ``out``'s dtype.
    """
    b = _stacked(lora_b, "lora_b")
    _check_expand(z, b, out, offset)
    impl = dispatch("lora", "lora_expand", lora_expand_segmented_torch, z.device)
    impl(z, b, out, seq_starts, seq_lens, seq_loras, max_len, offset, add_inputs)


def lora_expand_torch(
    z: torch.Tensor,
    lora_b: torch.Tensor,
    out: torch.Tensor,
    token_lora_indices: torch.Tensor,
    offset: int,
    add_inputs: bool,
    token_order: torch.Tensor | None = None,
    lora_starts: torch.Tensor | None = None,
) -> None:
    """Reference of :func:`lora_expand`: the selected adapters gathered, one batched fp32 product."""
    b = _stacked(lora_b, "lora_b")
    rank, width = b.shape[2], b.shape[1]
    idx = token_lora_indices[: z.shape[0]].to(torch.int64)
    rows = (idx >= 0).nonzero().squeeze(1)
    delta = torch.einsum("tr,tor->to", z[rows, :rank].float(), b[idx[rows]].float())
    columns = slice(offset, offset + width)
    if add_inputs:
        delta = out[rows, columns].float() + delta
    out[rows, columns] = delta.to(out.dtype)


def lora_expand(
    z: torch.Tensor,
    lora_b: torch.Tensor,
    out: torch.Tensor,
    token_lora_indices: torch.Tensor,
    offset: int = 0,
    add_inputs: bool = True,
    token_order: torch.Tensor | None = None,
    lora_starts: torch.Tensor | None = None,
) -> None:
    """``out[t, offset:offset+N] (+)= z[t, :rank] @ lora_b[i_t]^T`` for each token with ``i_t >= 0``; in place.

    Decode counterpart of :func:`lora_expand_segmented` (``token_order`` / ``lora_starts`` as in
    :func:`lora_shrink`).
    """
    b = _stacked(lora_b, "lora_b")
    _check_expand(z, b, out, offset)
    _check_order(b.shape[0], token_order, lora_starts)
    impl = dispatch("lora", "lora_expand_tokens", lora_expand_torch, z.device)
    impl(z, b, out, token_lora_indices[: z.shape[0]], offset, add_inputs, token_order, lora_starts)


#: Shapes of merged-slice calls already checked: the checks cost more than a decode launch's own host work,
#: and each layer repeats its shapes every step.
_CHECKED_SLICES: set[tuple[object, ...]] = set()


def _checked_slices(
    kind: str,
    io: torch.Tensor,
    weights: Sequence[torch.Tensor],
    out: torch.Tensor,
    offsets: Sequence[int] | None,
) -> tuple[int, ...]:
    """Check a merged-slice call (``kind`` shrink: ``io`` is ``x``; expand: ``io`` is ``z``) once per shape;
    returns the offsets (shrink: zeros)."""
    at = (0,) * len(weights) if offsets is None else tuple(int(o) for o in offsets)
    key = (kind, io.shape, out.shape, at, *(w.shape for w in weights))
    if key in _CHECKED_SLICES:
        return at
    if len(weights) == 0:
        raise ValueError(f"lora_{'a' if kind == 'shrink' else 'b'} must hold at least one slice, got none")
    stacked = [_stacked(w, f"lora_{'a' if kind == 'shrink' else 'b'}[{i}]") for i, w in enumerate(weights)]
    name = "out" if kind == "shrink" else "z"
    split = out if kind == "shrink" else io
    if split.ndim != 3 or split.shape[0] < len(weights):
        raise ValueError(f"{name} must be [{len(weights)} slices, T, cols], got shape {tuple(split.shape)}")
    if len(at) != len(weights):
        raise ValueError(f"offsets must give one column offset per slice ({len(weights)}), got {list(at)}")
    for i, (w, offset) in enumerate(zip(stacked, at, strict=True)):
        if kind == "shrink":
            _check_shrink(io, w, out[i])
        else:
            _check_expand(io[i], w, out, offset)
    if len(_CHECKED_SLICES) >= 4096:
        _CHECKED_SLICES.clear()
    _CHECKED_SLICES.add(key)
    return at


def lora_shrink_slices_torch(
    x: torch.Tensor,
    lora_a: Sequence[torch.Tensor],
    out: torch.Tensor,
    token_lora_indices: torch.Tensor,
    scale: float,
    token_order: torch.Tensor | None = None,
    lora_starts: torch.Tensor | None = None,
) -> None:
    """Reference of :func:`lora_shrink_slices`: :func:`lora_shrink_torch` per slice."""
    for i, a in enumerate(lora_a):
        lora_shrink_torch(x, a, out[i], token_lora_indices, scale)


def lora_shrink_slices(
    x: torch.Tensor,
    lora_a: Sequence[torch.Tensor],
    out: torch.Tensor,
    token_lora_indices: torch.Tensor,
    scale: float,
    token_order: torch.Tensor | None = None,
    lora_starts: torch.Tensor | None = None,
) -> None:
    """:func:`lora_shrink` of every slice of a merged layer (QKV, gate-up) in one launch: ``out[i, t, :rank] =
    scale * x[t] @ lora_a[i][i_t]^T``. ``out``: ``[S, >= T, >= rank]`` (vLLM's fp32 slice buffer)."""
    _checked_slices("shrink", x, lora_a, out, None)
    _check_order(lora_a[0].shape[0], token_order, lora_starts)
    impl = dispatch("lora", "lora_shrink_tokens_slices", lora_shrink_slices_torch, x.device)
    impl(x, tuple(lora_a), out, token_lora_indices[: x.shape[0]], scale, token_order, lora_starts)


def lora_shrink_segmented_slices_torch(
    x: torch.Tensor,
    lora_a: Sequence[torch.Tensor],
    out: torch.Tensor,
    seq_starts: torch.Tensor,
    seq_lens: torch.Tensor,
    seq_loras: torch.Tensor,
    max_len: int,
    scale: float,
) -> None:
    """Reference of :func:`lora_shrink_segmented_slices`: :func:`lora_shrink_segmented_torch` per slice."""
    for i, a in enumerate(lora_a):
        lora_shrink_segmented_torch(x, a, out[i], seq_starts, seq_lens, seq_loras, max_len, scale)


def lora_shrink_segmented_slices(
    x: torch.Tensor,
    lora_a: Sequence[torch.Tensor],
    out: torch.Tensor,
    seq_starts: torch.Tensor,
    seq_lens: torch.Tensor,
    seq_loras: torch.Tensor,
    max_len: int,
    scale: float,
) -> None:
    """:func:`lora_shrink_segmented` of every slice in one launch, ``out[i]`` getting slice ``i``."""
    _checked_slices("shrink", x, lora_a, out, None)
    impl = dispatch("lora", "lora_shrink_slices", lora_shrink_segmented_slices_torch, x.device)
    impl(x, tuple(lora_a), out, seq_starts, seq_lens, seq_loras, max_len, scale)


def lora_expand_slices_torch(
    z: torch.Tensor,
    lora_b: Sequence[torch.Tensor],
    out: torch.Tensor,
    token_lora_indices: torch.Tensor,
    offsets: Sequence[int],
    add_inputs: bool,
    token_order: torch.Tensor | None = None,
    lora_starts: torch.Tensor | None = None,
) -> None:
    """Reference of :func:`lora_expand_slices`: :func:`lora_expand_torch` per slice."""
    for i, (b, offset) in enumerate(zip(lora_b, offsets, strict=True)):
        lora_expand_torch(z[i], b, out, token_lora_indices, offset, add_inputs)


def lora_expand_slices(
    z: torch.Tensor,
    lora_b: Sequence[torch.Tensor],
    out: torch.Tensor,
    token_lora_indices: torch.Tensor,
    offsets: Sequence[int],
    add_inputs: bool = True,
    token_order: torch.Tensor | None = None,
    lora_starts: torch.Tensor | None = None,
) -> None:
    """:func:`lora_expand` of every slice of a merged layer in one launch: ``out[t, offsets[i]:offsets[i]+N_i]
    (+)= z[i, t, :rank] @ lora_b[i][i_t]^T``. ``z``: ``[S, >= T, >= rank]``."""
    at = _checked_slices("expand", z, lora_b, out, offsets)
    _check_order(lora_b[0].shape[0], token_order, lora_starts)
    impl = dispatch("lora", "lora_expand_tokens_slices", lora_expand_slices_torch, z.device)
    impl(z, tuple(lora_b), out, token_lora_indices[: z.shape[1]], at, add_inputs, token_order, lora_starts)


def lora_expand_segmented_slices_torch(
    z: torch.Tensor,
    lora_b: Sequence[torch.Tensor],
    out: torch.Tensor,
    seq_starts: torch.Tensor,
    seq_lens: torch.Tensor,
    seq_loras: torch.Tensor,
    max_len: int,
    offsets: Sequence[int],
    add_inputs: bool,
) -> None:
    """Reference of :func:`lora_expand_segmented_slices`: :func:`lora_expand_segmented_torch` per slice."""
    for i, (b, offset) in enumerate(zip(lora_b, offsets, strict=True)):
        lora_expand_segmented_torch(
            z[i], b, out, seq_starts, seq_lens, seq_loras, max_len, offset, add_inputs
        )


def lora_expand_segmented_slices(
    z: torch.Tensor,
    lora_b: Sequence[torch.Tensor],
    out: torch.Tensor,
    seq_starts: torch.Tensor,
    seq_lens: torch.Tensor,
    seq_loras: torch.Tensor,
    max_len: int,
    offsets: Sequence[int],
    add_inputs: bool = True,
) -> None:
    """:func:`lora_expand_segmented` of every slice in one launch, ``z[i]`` into ``out`` at ``offsets[i]``."""
    at = _checked_slices("expand", z, lora_b, out, offsets)
    impl = dispatch("lora", "lora_expand_slices", lora_expand_segmented_slices_torch, z.device)
    impl(z, tuple(lora_b), out, seq_starts, seq_lens, seq_loras, max_len, at, add_inputs)
