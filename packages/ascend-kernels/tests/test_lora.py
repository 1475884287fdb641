"""LoRA shrink / expand: the references against float64 equations, the Triton kernels against the references."""

from __future__ import annotations

import pytest
import torch

import vllm_ascend.kernels as K
from vllm_ascend.kernels import lora

DTYPES = [torch.float32, torch.bfloat16]
#: Slot 1 is empty (zeros, as vLLM leaves unused slots); -1 tokens have no adapter.
TOKEN_LORAS = [0, 2, -1, 2, 3, 0, -1, 3, 3, 2, 0]
#: Segmented prefill: runs of (length, adapter), consecutive tokens sharing one.
RUNS = [(5, 2), (1, -1), (19, 0), (3, 3), (17, 2)]


def _weights(gen, loras, rows, cols, dtype):
    w = torch.randn(loras, 1, rows, cols, generator=gen).to(dtype)
    w[1] = 0
    return w


def _runs_meta(runs):
    lens = torch.tensor([n for n, _ in runs])
    starts = torch.cumsum(lens, 0) - lens
    return starts, lens, torch.tensor([lo for _, lo in runs]), int(lens.max())


def _token_loras(runs):
    return torch.tensor([lo for n, lo in runs for _ in range(n)])


def _shrink_equation(x, a, loras, scale):
    """float64 ``scale * x[t] @ A[l_t]^T``; NaN rows for tokens without an adapter (must stay untouched)."""
    out = torch.full((x.shape[0], a.shape[2]), float("nan"), dtype=torch.float64)
    for t, lo in enumerate(loras.tolist()):
        if lo >= 0:
            out[t] = scale * (x[t].double() @ a[lo, 0].double().T)
    return out


def _expand_equation(z, b, loras, base, offset, add_inputs):
    out = base.double().clone()
    width = b.shape[2]
    for t, lo in enumerate(loras.tolist()):
        if lo >= 0:
            delta = z[t].double() @ b[lo, 0].double().T
            out[t, offset : offset + width] = (out[t, offset : offset + width] if add_inputs else 0) + delta
    return out


def _assert_same_sums(got, want):
    """Two layouts of the same rows: equal up to the order of the float32 sums. Under the interpreter
    ``tl.dot`` is numpy's matmul, whose OpenBLAS kernels (AVX2 hosts) sum a row in an order that depends on
    its place in the block, so two layouts can differ in the last bits (a 16-bit output by one of its ulps)."""
    assert got.dtype == want.dtype and got.shape == want.shape
    eps = 2e-6 if got.dtype == torch.float32 else torch.finfo(got.dtype).eps
    torch.testing.assert_close(got, want, rtol=0, atol=eps * float(want.abs().max().clamp_min(1.0)))


def _shrink_tolerance(dtype):
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    return {"rtol": tol, "atol": tol * 10}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rank", [8, 16, 24])
@pytest.mark.parametrize("segmented", [False, True])
def test_shrink_matches_the_equation(gen, dtype, rank, segmented):
    hidden, scale = 72, 0.37
    loras = _token_loras(RUNS) if segmented else torch.tensor(TOKEN_LORAS)
    x = torch.randn(loras.shape[0], hidden, generator=gen).to(dtype)
    a = _weights(gen, 4, rank, hidden, dtype)
    want = _shrink_equation(x, a, loras, scale)
    for fn in ("kernel", "reference"):
        got = torch.full((loras.shape[0], rank), float("nan"), dtype=torch.float32)
        if segmented:
            starts, lens, seg, max_len = _runs_meta(RUNS)
            impl = K.lora_shrink_segmented if fn == "kernel" else lora.lora_shrink_segmented_torch
            impl(x, a, got, starts, lens, seg, max_len, scale)
        else:
            impl = K.lora_shrink if fn == "kernel" else lora.lora_shrink_torch
            impl(x, a, got, loras, scale)
        done = ~want.isnan().any(1)
        assert torch.isnan(got[~done]).all(), fn  # tokens without an adapter: untouched
        torch.testing.assert_close(got[done].double(), want[done], **_shrink_tolerance(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("segmented", [False, True])
@pytest.mark.parametrize("add_inputs", [True, False])
def test_expand_slices_match_the_equation(gen, dtype, segmented, add_inputs):
    """Three slices of a merged QKV output (widths 64 / 16 / 16), each its own B, at increasing offsets."""
    rank, slices = 16, (64, 16, 16)
    loras = _token_loras(RUNS) if segmented else torch.tensor(TOKEN_LORAS)
    tokens = loras.shape[0]
    z = torch.randn(tokens, rank, generator=gen)  # vLLM's fp32 shrink buffer
    bs = [_weights(gen, 4, width, rank, dtype) for width in slices]
    base = torch.randn(tokens, sum(slices), generator=gen).to(dtype)
    want = base.double()
    offset = 0
    for b in bs:
        want = _expand_equation(z, b, loras, want, offset, add_inputs)
        offset += b.shape[2]
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for fn in ("kernel", "reference"):
        got = base.clone()
        offset = 0
        for b in bs:
            if segmented:
                starts, lens, seg, max_len = _runs_meta(RUNS)
                impl = K.lora_expand_segmented if fn == "kernel" else lora.lora_expand_segmented_torch
                impl(z, b, got, starts, lens, seg, max_len, offset, add_inputs)
            else:
                impl = K.lora_expand if fn == "kernel" else lora.lora_expand_torch
                impl(z, b, got, loras, offset, add_inputs)
            offset += b.shape[2]
        untouched = loras < 0
        assert torch.equal(got[untouched], base[untouched])
        torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol * 10)


def test_kernel_equals_reference_on_a_wide_output(gen):
    """An output wider than one column tile and a rank not a power of two: the Triton path against the reference."""
    rank, width, hidden = 12, 200, 130
    loras = torch.tensor(TOKEN_LORAS)
    x = torch.randn(loras.shape[0], hidden, generator=gen)
    a = _weights(gen, 4, rank, hidden, torch.float32)
    b = _weights(gen, 4, width, rank, torch.float32)
    outs = []
    for shrink, expand in ((K.lora_shrink, K.lora_expand), (lora.lora_shrink_torch, lora.lora_expand_torch)):
        z = torch.zeros(loras.shape[0], rank)
        shrink(x, a, z, loras, 0.5)
        y = torch.ones(loras.shape[0], width + 8)
        expand(z, b, y, loras, 8, True)
        outs.append(y)
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-4)
    assert not torch.equal(outs[0][:, 8:], torch.ones(loras.shape[0], width))


def test_the_kernel_path_is_triton_here():
    assert K.use_triton(torch.device("cpu"))


@pytest.mark.parametrize(
    ("shapes", "field"),
    [(((3, 8), (4, 1, 16, 9), (3, 16)), "x must be"), (((3, 9), (4, 1, 16, 9), (3, 8)), "out must be")],
)
def test_shape_mismatches_are_refused(shapes, field):
    x, a, out = (torch.zeros(s) for s in shapes)
    with pytest.raises(ValueError, match=field):
        K.lora_shrink(x, a, out, torch.zeros(3, dtype=torch.long), 1.0)


def test_expand_outside_the_output_is_refused():
    with pytest.raises(ValueError, match=r"no columns \[8, 24\)"):
        K.lora_expand(
            torch.zeros(2, 4),
            torch.zeros(2, 1, 16, 4),
            torch.zeros(2, 20),
            torch.zeros(2, dtype=torch.long),
            8,
        )


@pytest.mark.parametrize("split_k", [1, 3])
@pytest.mark.parametrize("tokens", [5, 70, 300])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_by_token_layout_matches_the_equation(gen, split_k, tokens, out_dtype):
    """The decode layout over token tiles of every width (16 / 32 / 64), adapters interleaved token by token, the
    reduction split over programs (partials added by each tile's last split) or not, into an fp32 or a bf16
    buffer: rows without an adapter stay untouched, and a second call (the split's counters reset) gives the
    same bits."""
    from vllm_ascend.kernels._triton import lora as triton_lora

    hidden, rank, scale = 40, 16, 0.5
    loras = torch.randint(-1, 4, (tokens,), generator=gen)
    x = torch.randn(tokens, hidden, generator=gen)
    a = _weights(gen, 4, rank, hidden, torch.float32)[:, 0]
    got = torch.full((tokens, rank), float("nan"), dtype=out_dtype)
    triton_lora.lora_shrink_tokens(x, a, got, loras, scale, split_k=split_k)
    want = _shrink_equation(x, a.unsqueeze(1), loras, scale)
    done = loras >= 0
    assert torch.isnan(got[~done]).all()
    tol = 1e-5 if out_dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got[done].double(), want[done], rtol=tol, atol=tol)
    again = torch.full_like(got, float("nan"))
    triton_lora.lora_shrink_tokens(x, a, again, loras, scale, split_k=split_k)
    assert torch.equal(again[done], got[done]) and torch.isnan(again[~done]).all()


@pytest.mark.parametrize("segmented", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_merged_slices_in_one_launch_equal_one_launch_per_slice(gen, segmented, dtype):
    """A merged QKV layer (widths 64 / 16 / 16, each slice its own A and B): the one-launch shrink into the
    ``[S, T, rank]`` buffer and the one-launch expand at each slice's offset give the per-slice calls' result
    (Triton here) and the float64 equations; rows without an adapter stay untouched."""
    hidden, rank, widths, scale = 40, 16, (64, 16, 16), 0.5
    loras = _token_loras(RUNS) if segmented else torch.tensor(TOKEN_LORAS)
    tokens = loras.shape[0]
    x = torch.randn(tokens, hidden, generator=gen).to(dtype)
    a = [_weights(gen, 4, rank, hidden, dtype) for _ in widths]
    b = [_weights(gen, 4, n, rank, dtype) for n in widths]
    offsets = [0, 64, 80]
    base = torch.randn(tokens, sum(widths), generator=gen).to(dtype)
    meta = _runs_meta(RUNS) if segmented else (loras,)
    results = {}
    for form in ("merged", "per slice", "reference"):
        buf = torch.full((len(widths), tokens, rank), float("nan"))
        y = base.clone()
        if form == "merged":
            shrink = K.lora_shrink_segmented_slices if segmented else K.lora_shrink_slices
            expand = K.lora_expand_segmented_slices if segmented else K.lora_expand_slices
            shrink(x, a, buf, *meta, scale)
            expand(buf.nan_to_num(), b, y, *meta, offsets, True)
        elif form == "reference":
            shrink = lora.lora_shrink_segmented_slices_torch if segmented else lora.lora_shrink_slices_torch
            expand = lora.lora_expand_segmented_slices_torch if segmented else lora.lora_expand_slices_torch
            shrink(x, a, buf, *meta, scale)
            expand(buf.nan_to_num(), b, y, *meta, offsets, True)
        else:
            for i in range(len(widths)):
                (K.lora_shrink_segmented if segmented else K.lora_shrink)(x, a[i], buf[i], *meta, scale)
            z = buf.nan_to_num()
            for i in range(len(widths)):
                (K.lora_expand_segmented if segmented else K.lora_expand)(
                    z[i], b[i], y, *meta, offsets[i], True
                )
        results[form] = (buf, y)
    done = loras >= 0
    tol = _shrink_tolerance(dtype)
    for i in range(len(widths)):
        want = _shrink_equation(x, a[i], loras, scale)
        for form, (buf, _) in results.items():
            assert torch.isnan(buf[i][~done]).all(), form
            torch.testing.assert_close(buf[i][done].double(), want[done], **tol)
    _assert_same_sums(results["merged"][0].nan_to_num(), results["per slice"][0].nan_to_num())
    _assert_same_sums(results["merged"][1], results["per slice"][1])
    torch.testing.assert_close(results["merged"][1].double(), results["reference"][1].double(), **tol)
    assert torch.equal(results["merged"][1][~done], base[~done])
    if not segmented:  # the reduction split over programs, each slice's tiles with their own counters
        from vllm_ascend.kernels._triton import lora as triton_lora

        split = torch.full_like(results["merged"][0], float("nan"))
        triton_lora.lora_shrink_tokens_slices(x, tuple(w[:, 0] for w in a), split, loras, scale, split_k=3)
        for i in range(len(widths)):
            assert torch.isnan(split[i][~done]).all()
            torch.testing.assert_close(split[i][done], results["merged"][0][i][done], **tol)


def test_merged_slices_are_checked_per_slice():
    x, loras = torch.zeros(3, 8), torch.zeros(3, dtype=torch.long)
    a = [torch.zeros(2, 1, 4, 8), torch.zeros(2, 1, 4, 9)]
    with pytest.raises(ValueError, match="x must be"):
        K.lora_shrink_slices(x, a, torch.zeros(2, 3, 4), loras, 1.0)
    with pytest.raises(ValueError, match=r"out must be \[2 slices"):
        K.lora_shrink_slices(x, a[:1] * 2, torch.zeros(3, 4), loras, 1.0)
    b = [torch.zeros(2, 1, 16, 4), torch.zeros(2, 1, 8, 4)]
    with pytest.raises(ValueError, match="one column offset per slice"):
        K.lora_expand_slices(torch.zeros(2, 3, 4), b, torch.zeros(3, 24), loras, [0])
    with pytest.raises(ValueError, match=r"no columns \[20, 28\)"):
        K.lora_expand_slices(torch.zeros(2, 3, 4), b, torch.zeros(3, 24), loras, [0, 20])


def test_token_order_groups_each_adapters_tokens():
    loras = torch.tensor([2, -1, 0, 2, 3, -1, 0])
    order, starts = K.lora_token_order(loras, 4)
    assert starts.tolist() == [0, 2, 4, 4, 6, 7]  # -1 x2, adapter 0 x2, 1 none, 2 x2, 3 x1
    assert order.tolist() == [1, 5, 2, 6, 0, 3, 4]
    into = torch.full((10,), -7, dtype=torch.int64), torch.zeros(6, dtype=torch.int64)
    got = K.lora_token_order(loras, 4, *into)
    assert (
        got[0] is into[0] and into[0][:7].tolist() == order.tolist() and into[1].tolist() == starts.tolist()
    )
    with pytest.raises(ValueError, match="lora_starts 6"):
        K.lora_token_order(loras, 4, torch.zeros(10, dtype=torch.int64), torch.zeros(5, dtype=torch.int64))


@pytest.mark.parametrize("split_k", [1, 3])
@pytest.mark.parametrize("tokens", [11, 300])
def test_ordered_tokens_give_the_unordered_result(gen, split_k, tokens):
    """Given the tokens ordered by adapter, each adapter's programs take only its tokens: the same sums as the
    unordered layout, single and merged slices, shrink (split or not) and expand. Stale adapters in the mapping
    past the call's rows (a larger persistent buffer) are never written."""
    from vllm_ascend.kernels._triton import lora as triton_lora

    hidden, rank, widths, scale = 40, 16, (48, 16), 0.5
    buffer = torch.randint(-1, 4, (tokens + 9,), generator=gen)  # rows past `tokens`: stale adapters
    order, starts = K.lora_token_order(buffer, 4)
    x = torch.randn(tokens, hidden, generator=gen)
    a = [_weights(gen, 4, rank, hidden, torch.float32)[:, 0] for _ in widths]
    b = [_weights(gen, 4, n, rank, torch.float32)[:, 0] for n in widths]
    results = []
    for plan in ((), (order, starts)):
        single = torch.full((tokens, rank), float("nan"))
        triton_lora.lora_shrink_tokens(x, a[0], single, buffer, scale, *plan, split_k=split_k)
        merged = torch.full((len(widths), tokens, rank), float("nan"))
        triton_lora.lora_shrink_tokens_slices(x, tuple(a), merged, buffer, scale, *plan, split_k=split_k)
        y = torch.ones(tokens, sum(widths))
        triton_lora.lora_expand_tokens_slices(merged.nan_to_num(), tuple(b), y, buffer, (0, 48), True, *plan)
        y1 = torch.ones(tokens, widths[0])
        triton_lora.lora_expand_tokens(single.nan_to_num(), b[0], y1, buffer, 0, True, *plan)
        results.append((single, merged, y, y1))
    done = buffer[:tokens] >= 0
    for unordered, ordered in zip(*results, strict=True):
        _assert_same_sums(ordered.nan_to_num(), unordered.nan_to_num())
    assert torch.isnan(results[1][0][~done]).all() and not torch.isnan(results[1][0][done]).any()
    want = _shrink_equation(x, a[0].unsqueeze(1), buffer[:tokens], scale)
    torch.testing.assert_close(results[1][0][done].double(), want[done], rtol=1e-5, atol=1e-5)


def test_an_order_needs_both_parts_and_room_for_every_slot():
    x, a, out, loras = (
        torch.zeros(3, 8),
        torch.zeros(4, 1, 2, 8),
        torch.zeros(3, 2),
        torch.zeros(3, dtype=torch.long),
    )
    with pytest.raises(ValueError, match="come together"):
        K.lora_shrink(x, a, out, loras, 1.0, torch.zeros(3, dtype=torch.long), None)
    with pytest.raises(ValueError, match="num_loras \\+ 2 = 6 entries"):
        K.lora_shrink(
            x, a, out, loras, 1.0, torch.zeros(3, dtype=torch.long), torch.zeros(5, dtype=torch.long)
        )


def test_reserved_counters_serve_every_later_split_launch(gen):
    """``lora_reserve`` allocates the split reduction's zeroed counters eagerly, large enough that split launches
    of up to that many adapter slots (3 slices, any batch that splits) reuse them instead of allocating."""
    from vllm_ascend.kernels._geometry import geometry
    from vllm_ascend.kernels._triton import common
    from vllm_ascend.kernels._triton import lora as triton_lora

    device = torch.device("cpu")
    common._scratch.pop(("lora.tiles", device, torch.int32), None)
    K.lora_reserve(device, 8)
    buffer = common._scratch[("lora.tiles", device, torch.int32)]
    assert buffer.numel() >= 8 * geometry(device).persistent_programs() and not buffer.any()
    hidden, rank = 40, 16
    a = tuple(_weights(gen, 8, rank, hidden, torch.float32)[:, 0] for _ in range(3))
    for tokens in (1, 5, 40):
        loras = torch.randint(-1, 8, (tokens,), generator=gen)
        out = torch.zeros(3, tokens, rank)
        triton_lora.lora_shrink_tokens_slices(torch.randn(tokens, hidden, generator=gen), a, out, loras, 1.0)
        assert common._scratch[("lora.tiles", device, torch.int32)] is buffer and not buffer.any()
