"""Benchmark of ``vllm_ascend.kernels`` on a GPU: correctness at real sizes and speed vs torch.

Run from the repository root on a machine with a CUDA GPU, torch and triton (vLLM not needed):

    python benchmarks/kernels.py [--quick] [--compile] [--json PATH]

For each kernel and size it prints: µs per call (median, L2 flushed before each call), the memory
floor (bytes that must move ÷ the measured device-to-device copy bandwidth, read + write counted),
× floor, the torch-eager peer's µs and the speed-up over it (and over ``torch.compile`` of the same
eager code with ``--compile``), plus a correctness check against the package's torch reference.
With ``--vllm-peer DIR`` (default ``.peer/vllm_032`` when present; stage it with
``python benchmarks/vllm_peer.py stage`` where vLLM 0.32 is installed and carry it), the sampling and
speculative-decoding rows also time vLLM 0.32's own Triton kernel for the op in the same process by
the same method: "vLLM µs", "× vs vLLM" (vLLM µs ÷ ours: above 1, ours is faster) and "vLLM check"
(vLLM's result against ours where the semantics match; see ``vllm_peer.check_*``); so does the chunked gated
delta rule (``--only gdn``: vLLM's FLA prefill kernels).
In-place kernels are restored from a pristine copy before every timed call (the copy and an L2 flush
are outside the timed region), so each call sees the same fresh input. "host µs" is the Python and
launch cost per call, which bounds the latency when the GPU is otherwise idle.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
for src in ("packages/ascend-kernels/src", "packages/ascend-core/src"):
    if str(ROOT / src) not in sys.path:
        sys.path.insert(0, str(ROOT / src))

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
import triton.testing  # noqa: E402
import vllm_peer as VP  # noqa: E402

import vllm_ascend.kernels as K  # noqa: E402
from vllm_ascend.kernels import (  # noqa: E402
    conv1d,
    gated_delta_rule,
    gdn_gating,
    gumbel,
    kv_zero,
    logprobs,
    min_p,
    penalties,
    rejection,
    rms_norm,
    slot_mapping,
    temperature,
    top_k_top_p,
)

DEV = torch.device("cuda")
ROWS: list[dict] = []
COPIES: list[dict] = []
VLLM_DIFFS: list[str] = []  # rows where vLLM's kernel failed or disagrees with ours beyond the semantics
_FLUSH = None


def _flush() -> None:
    global _FLUSH
    if _FLUSH is None:
        _FLUSH = torch.empty(256 * 1024 * 1024, dtype=torch.int8, device=DEV)
    _FLUSH.zero_()


GUARD_US = 300.0  # GPU busy-wait before each timed call; must exceed the host cost of any call


def bench(
    fn: Callable[[], object],
    restore: Callable[[], object] | None = None,
    reps: int = 40,
    guard_us: float = GUARD_US,
) -> float:
    """Median GPU µs of ``fn``; ``restore`` (untimed) runs before each call when given.

    Before each timed call: restore, flush the L2, then keep the GPU busy (``torch.cuda._sleep``) for
    ``guard_us`` while the host enqueues the call, so its start event fires only once every launch of
    the call is queued. The figure is then the call's GPU time (its kernels and the gaps between
    them on the GPU), not the host's launch cost, which ``host_us`` reports separately: with plain
    ``do_bench``, a call whose host cost exceeds the flush's GPU time had its launch gaps timed too.
    """
    cycles = int(guard_us * 2000)  # SM clock <= 2 GHz on an H200: at least guard_us
    if restore is not None:
        restore()
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        if restore is not None:
            restore()
        _flush()
        torch.cuda._sleep(cycles)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


@triton.jit
def _empty_kernel(ptr):
    if tl.program_id(0) < 0:
        tl.store(ptr, 0)


def host_us(fn: Callable[[], object], calls: int = 20) -> float:
    """Host (Python + launch) µs per call: the floor of a call's latency when the GPU is idle."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / calls * 1e6


def measure_bandwidth() -> tuple[float, float]:
    """(copy GB/s counting read + write, write-only GB/s) on 1 GiB buffers."""
    n = 1 << 30
    src = torch.randint(0, 255, (n,), dtype=torch.uint8, device=DEV)
    dst = torch.empty_like(src)
    copy_us = triton.testing.do_bench(lambda: dst.copy_(src), warmup=20, rep=100, return_mode="median") * 1e3
    fill_us = triton.testing.do_bench(lambda: dst.zero_(), warmup=20, rep=100, return_mode="median") * 1e3
    return 2 * n / copy_us / 1e3, n / fill_us / 1e3


def record(op, shape, dtype, us, floor_us, eager_us, compiled_us, check, note="", host=None, vllm=None):
    vllm = vllm or {}
    vllm_us = vllm.get("us")
    row = {
        "op": op,
        "shape": shape,
        "dtype": str(dtype).replace("torch.", ""),
        "us": us,
        "host_us": host,
        "floor_us": floor_us,
        "x_floor": us / floor_us if floor_us else None,
        "eager_us": eager_us,
        "vs_eager": eager_us / us if eager_us else None,
        "compiled_us": compiled_us,
        "vs_compile": compiled_us / us if compiled_us else None,
        "vllm_us": vllm_us,
        "vs_vllm": vllm_us / us if vllm_us else None,
        "vllm_host_us": vllm.get("host_us"),
        "check": check,
        "vllm_check": vllm.get("check", ""),
        "note": note,
    }
    ROWS.append(row)
    if not vllm.get("ok", True):
        VLLM_DIFFS.append(f"{op} {shape} {row['dtype']}: {row['vllm_check']}")
    fmt = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
    print(
        f"| {op} | {shape} | {row['dtype']} | {us:.1f} | {fmt(floor_us, '.1f')} | {fmt(row['x_floor'], '.2f')} | "
        f"{fmt(eager_us, '.1f')} | {fmt(row['vs_eager'], '.2f')} | {fmt(vllm_us, '.1f')} | "
        f"{fmt(row['vs_vllm'], '.2f')} | {fmt(compiled_us, '.1f')} | "
        f"{fmt(row['vs_compile'], '.2f')} | {fmt(host, '.0f')} | {check} | {row['vllm_check'] or '-'} |",
        flush=True,
    )


# ---- vLLM 0.32 peers (benchmarks/vllm_peer.py) -------------------------------------------------


def vllm_peer(
    kernel_file: str,
    run: Callable[[], object],
    check: Callable[[], tuple[str, bool]],
    restore: Callable[[], object] | None = None,
    note: str = "",
) -> dict | None:
    """vLLM's counterpart timed like ours, with ``check``'s agreement; None when its file is not loaded.

    The guard is raised to twice vLLM's host cost when that exceeds ``GUARD_US`` (its top-k/top-p
    launches up to seven kernels from Python), so its launch gaps are not timed either. A failing
    vLLM kernel is reported in the row instead of ending the run.
    """
    if not VP.available(kernel_file):
        return None
    try:
        text, ok = check()
        host = host_us(run)
        us = bench(run, restore, guard_us=max(GUARD_US, 2 * host))
    except Exception as exc:
        print(f"# vLLM {kernel_file} failed: {type(exc).__name__}: {exc}", flush=True)
        return {"check": f"vLLM FAILED {type(exc).__name__}", "ok": False}
    text = f"{text} ({note})" if note else text
    return {"us": us, "host_us": host, "check": text if ok else f"VLLM-DIFF {text}", "ok": ok}


# ---- eager peers: the plain torch code a sampler would otherwise run -------------------------


def eager_temperature(x, t):
    return x.div_(t.unsqueeze(1))


def eager_gumbel(x, t):
    q = x.float() / t.unsqueeze(1)
    g = -torch.log(-torch.log(torch.rand_like(q).clamp_(1e-10, 1.0)))
    return (q + g).argmax(dim=1)


def eager_min_p(x, mp):
    probs = torch.softmax(x.float(), dim=1)
    keep = probs >= probs.max(dim=1, keepdim=True).values * mp.unsqueeze(1)
    return x.masked_fill_(~keep, float("-inf"))


def eager_top_k_top_p(x, k, p):
    vals, idx = x.float().sort(dim=1, descending=False)
    kth = vals.gather(1, (x.shape[1] - k.long()).unsqueeze(1))
    vals.masked_fill_(vals < kth, float("-inf"))
    cum = vals.softmax(dim=1).cumsum(dim=1)
    drop = cum <= 1 - p.unsqueeze(1)
    drop[:, -1] = False
    vals.masked_fill_(drop, float("-inf"))
    return x.copy_(vals.scatter(1, idx, vals).to(x.dtype))


def eager_token_logprobs(x, ids):
    return torch.log_softmax(x.float(), dim=1).gather(1, ids.unsqueeze(1)).squeeze(1)


def eager_topk_logprobs(x, ids, n):
    """What a sampler runs without the kernel (vLLM's sampler does the same): log-softmax, topk,
    rank of the chosen token."""
    lp = torch.log_softmax(x.float(), dim=1)
    chosen = lp.gather(1, ids.unsqueeze(1))
    top_lp, top_ids = lp.topk(n, dim=1)
    return top_ids, top_lp, chosen, (lp > chosen).sum(dim=1) + 1


def _compiled(fn):
    return torch.compile(fn, dynamic=True)


# ---- correctness helpers --------------------------------------------------------------------


def max_diff(a, b):
    a, b = a.float(), b.float()
    both_inf = torch.isinf(a) & torch.isinf(b) & (torch.sign(a) == torch.sign(b))
    d = torch.where(both_inf, torch.zeros_like(a), (a - b).abs())
    return d.max().item() if d.numel() else 0.0


_MANTISSA = {torch.float32: 22, torch.bfloat16: 7, torch.float16: 10}  # tolerances: 2 ulps of the dtype


def ulps_ok(a, b, dtype):
    """Within 1 ulp of the output dtype (relative), or exactly equal infinities."""
    a, b = a.float(), b.float()
    eps = {torch.float32: 2.0**-22, torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}[dtype]
    both_inf = torch.isinf(a) & torch.isinf(b) & (torch.sign(a) == torch.sign(b))
    ok = both_inf | ((a - b).abs() <= eps * torch.maximum(a.abs(), b.abs()) + 1e-30)
    return int((~ok).sum().item())


# ---- benchmarks -----------------------------------------------------------------------------


OPS: set[str] = set()  # --ops: run only these sampling ops (empty: all)


def _want(op: str) -> bool:
    return not OPS or op in OPS


def sampling_suite(batch, vocab, dtype, bw, use_compile):
    shape = f"{batch}x{vocab}"
    es = torch.tensor([], dtype=dtype).element_size()
    rw = 2 * batch * vocab * es / bw / 1e3  # µs to read and write the logits once
    ro = batch * vocab * es / bw / 1e3
    logits = (torch.randn(batch, vocab, device=DEV) * 3).to(dtype)
    temp = torch.rand(batch, device=DEV) * 1.5 + 0.25
    temp[::7] = 0.0
    seeds = torch.randint(0, 2**62, (batch,), device=DEV)
    pos = torch.randint(0, 4096, (batch,), device=DEV)
    compiled = {}

    def peer(name, fn, *args):
        if not use_compile or dtype != torch.float32:
            return None
        if name not in compiled:
            compiled[name] = _compiled(fn)
        try:
            return bench(lambda: compiled[name](*args))
        except Exception as exc:  # torch.compile is best effort here
            print(f"# torch.compile {name} failed: {type(exc).__name__}: {exc}", flush=True)
            return None

    work = logits.clone()
    tpos = temp.clamp(min=0.5)
    restore = lambda: work.copy_(logits)  # noqa: E731
    # What the device itself takes to read and write these bytes once (a small copy does not reach
    # the 1 GiB copy bandwidth the floor uses): the practical floor of an in-place filter.
    copy_us = bench(restore)
    COPIES.append({"shape": shape, "dtype": str(dtype).replace("torch.", ""), "copy_us": copy_us})
    print(
        f"# {shape} {dtype}: device copy of the logits {copy_us:.1f} µs = {copy_us / rw:.2f}× floor",
        flush=True,
    )
    if _want("temperature"):
        _temperature_case(shape, logits, work, temp, tpos, restore, dtype, rw, peer)
    if _want("gumbel"):
        _gumbel_case(shape, logits, temp, tpos, seeds, pos, batch, dtype, ro, peer)
    if _want("min_p"):
        _min_p_case(shape, logits, work, restore, batch, dtype, rw, peer, tpos)
    if _want("topk_topp") or _want("topk_only") or _want("topp_only"):
        _top_k_top_p_case(shape, logits, work, restore, batch, vocab, dtype, rw)
    if _want("penalties"):
        _penalties_case(shape, logits, work, restore, batch, vocab, dtype, rw, peer)
    if _want("token_logprobs") or _want("topk_logprobs"):
        _logprobs_case(shape, logits, batch, vocab, dtype, ro, peer)


def _temperature_case(shape, logits, work, temp, tpos, restore, dtype, rw, peer):
    a, b = logits.clone(), logits.clone()
    K.apply_temperature(a, temp)
    temperature.apply_temperature_torch(b, temp)
    check = f"ulp-off={ulps_ok(a, b, dtype)}"
    us = bench(lambda: K.apply_temperature(work, tpos), restore)
    eager = bench(lambda: eager_temperature(work, tpos), restore)
    vllm = vllm_peer(
        "gumbel",
        lambda: VP.vllm_temperature(work, tpos),
        lambda: VP.check_elementwise(a, VP.vllm_temperature(logits.clone(), temp), dtype),
        restore,
    )
    record(
        "temperature(inplace)",
        shape,
        dtype,
        us,
        rw,
        eager,
        peer("temp", eager_temperature, work, tpos),
        check,
        host=host_us(lambda: K.apply_temperature(work, tpos)),
        vllm=vllm,
    )


def _gumbel_case(shape, logits, temp, tpos, seeds, pos, batch, dtype, ro, peer):
    got = K.gumbel_sample(logits, temp, seeds, pos)
    ref = gumbel.gumbel_sample_torch(logits, temp, seeds, pos)
    check = f"mismatch={int((got != ref).sum())}/{batch}"
    us = bench(lambda: K.gumbel_sample(logits, temp, seeds, pos))
    eager = bench(lambda: eager_gumbel(logits, tpos))
    vllm = vllm_peer(
        "gumbel",
        lambda: VP.vllm_gumbel(logits, temp, seeds, pos),
        lambda: VP.check_gumbel(logits, temp, got, VP.vllm_gumbel(logits, temp, seeds, pos)),
    )
    record(
        "gumbel_sample(+temp)",
        shape,
        dtype,
        us,
        ro,
        eager,
        peer("gumbel", eager_gumbel, logits, tpos),
        check,
        host=host_us(lambda: K.gumbel_sample(logits, temp, seeds, pos)),
        vllm=vllm,
    )


def _min_p_case(shape, logits, work, restore, batch, dtype, rw, peer, tpos):
    mp = torch.rand(batch, device=DEV) * 0.2
    a, b = logits.clone(), logits.clone()
    K.apply_min_p(a, mp)
    min_p.apply_min_p_torch(b, mp)
    check = f"mask-off={int((torch.isinf(a) != torch.isinf(b)).sum())}"
    us = bench(lambda: K.apply_min_p(work, mp), restore)
    eager = bench(lambda: eager_min_p(work, mp), restore)
    vllm = vllm_peer(
        "min_p",
        lambda: VP.vllm_min_p(work, mp),
        lambda: VP.check_min_p(logits, a, VP.vllm_min_p(logits.clone(), mp), mp),
        restore,
    )
    record(
        "min_p(inplace)",
        shape,
        dtype,
        us,
        rw,
        eager,
        peer("min_p", eager_min_p, work, mp),
        check,
        host=host_us(lambda: K.apply_min_p(work, mp)),
        vllm=vllm,
    )
    # A sampler's temperature then min-p: ours in one pass (T * log(min_p) on unscaled logits), vLLM's
    # as its sampler runs them (temperature, then min-p).
    a = logits.clone()
    K.apply_min_p(a, mp, tpos)
    scaled = logits.float() / tpos.unsqueeze(1)
    b = min_p.apply_min_p_torch(scaled.clone(), mp)
    check = f"mask-off={int((torch.isinf(a) != torch.isinf(b)).sum())}"
    us = bench(lambda: K.apply_min_p(work, mp, tpos), restore)
    both = lambda x: VP.vllm_min_p(VP.vllm_temperature(x, tpos), mp)  # noqa: E731
    vllm = vllm_peer(
        "min_p",
        lambda: both(work),
        lambda: VP.check_min_p(
            scaled, a.float() / tpos.unsqueeze(1), both(logits.clone()).float(), mp, 2.0 ** -_MANTISSA[dtype]
        ),
        restore,
        "vLLM: temperature + min-p, the scaled logits rounded to the dtype",
    )
    record(
        "min_p+temp(inplace)",
        shape,
        dtype,
        us,
        rw,
        None,
        None,
        check,
        host=host_us(lambda: K.apply_min_p(work, mp, tpos)),
        vllm=vllm,
    )


def _top_k_top_p_case(shape, logits, work, restore, batch, vocab, dtype, rw):
    # restored before each call: the cost depends on the input
    k = torch.randint(1, 200, (batch,), device=DEV, dtype=torch.int32)
    p = torch.rand(batch, device=DEV) * 0.2 + 0.79
    # vLLM's kernel takes float32 only (its sampler upcasts every dtype first): for other dtypes it runs
    # on a float32 copy of the same logits, restored from it like ours
    logits32 = logits.float()
    work32 = logits32.clone() if dtype != torch.float32 else work
    restore32 = (lambda: work32.copy_(logits32)) if dtype != torch.float32 else restore
    note32 = "" if dtype == torch.float32 else "vLLM on the fp32 copy"
    for label, kk, pp in (("topk_topp", k, p), ("topk_only", k, None), ("topp_only", None, p)):
        if not _want(label):
            continue
        a, b = logits.clone(), logits.clone()
        K.apply_top_k_top_p(a, kk, pp)
        top_k_top_p.apply_top_k_top_p_torch(b, kk, pp)
        kept_a, kept_b = torch.isfinite(a).sum(1), torch.isfinite(b).sum(1)
        check = f"rows-off={int((kept_a != kept_b).sum())} kept~{int(kept_b.float().median())}"
        us = bench(lambda kk=kk, pp=pp: K.apply_top_k_top_p(work, kk, pp), restore)
        kk_e = kk if kk is not None else torch.full_like(k, vocab)
        pp_e = pp if pp is not None else torch.ones_like(p)
        eager = bench(lambda kk_e=kk_e, pp_e=pp_e: eager_top_k_top_p(work, kk_e, pp_e), restore)
        host = host_us(lambda kk=kk, pp=pp: K.apply_top_k_top_p(work, kk, pp))
        vllm = vllm_peer(
            "topk_topp",
            lambda kk=kk, pp=pp: VP.vllm_top_k_top_p(work32, kk, pp),
            lambda kk=kk, pp=pp, a=a: VP.check_kept_sets(
                logits, a, VP.vllm_top_k_top_p(logits32.clone(), kk, pp)
            ),
            restore32,
            note32,
        )
        record(label, shape, dtype, us, rw, eager, None, check, host=host, vllm=vllm)


def _penalties_case(shape, logits, work, restore, batch, vocab, dtype, rw, peer):
    # history: 512 prompt + 128 output tokens per row
    prompt = torch.randint(0, vocab, (batch, 512), device=DEV)
    output = torch.randint(0, vocab, (batch, 128), device=DEV)
    rep = torch.rand(batch, device=DEV) + 0.5
    freq = torch.rand(batch, device=DEV) * 0.5
    pres = torch.rand(batch, device=DEV) * 0.5
    # both sides keep per-request state (prompt marks, output counts) built at admission and updated
    # after each step: built here untimed; the timed call applies it
    ours = VP.our_penalty_state(prompt, output, vocab)
    a = logits.clone()
    VP.our_penalties(a, ours, rep, freq, pres)
    args = (ours.slots, ours.counts, ours.seen, ours.num_seen, rep, freq, pres)
    b = penalties.apply_penalties_torch(logits.clone(), *args)
    check = f"ulp-off={ulps_ok(a, b, dtype)}"
    us = bench(lambda: VP.our_penalties(work, ours, rep, freq, pres), restore)
    eager = bench(lambda: penalties.apply_penalties_torch(work, *args), restore)
    vllm = None
    if VP.available("penalties"):
        state = VP.vllm_penalty_state(prompt, output, vocab)
        vllm = vllm_peer(
            "penalties",
            lambda: VP.vllm_penalties(work, state, rep, freq, pres),
            lambda: VP.check_elementwise(
                a,
                VP.vllm_penalties(logits.clone(), state, rep, freq, pres),
                dtype,
                VP.penalty_magnitude(logits, rep),
            ),
            restore,
            "both over kept state; vLLM: dense B x V pass",
        )
    record(
        "penalties",
        shape,
        dtype,
        us,
        rw,
        eager,
        peer("pen", penalties.apply_penalties_torch, work, *args),
        check,
        "kept counts: touches seen tokens only",
        host=host_us(lambda: VP.our_penalties(work, ours, rep, freq, pres)),
        vllm=vllm,
    )


def _logprobs_case(shape, logits, batch, vocab, dtype, ro, peer):
    ids = torch.randint(0, vocab, (batch,), device=DEV)
    if _want("token_logprobs"):
        _token_logprobs_case(shape, logits, ids, dtype, ro, peer)
    if _want("topk_logprobs"):
        _topk_logprobs_case(shape, logits, ids, dtype, ro, peer)


def _token_logprobs_case(shape, logits, ids, dtype, ro, peer):
    got = K.compute_token_logprobs(logits, ids)
    ref = logprobs.compute_token_logprobs_torch(logits, ids)
    check = f"maxdiff={max_diff(got, ref):.1e}"
    us = bench(lambda: K.compute_token_logprobs(logits, ids))
    eager = bench(lambda: eager_token_logprobs(logits, ids))
    vllm = vllm_peer(
        "logprob",
        lambda: VP.vllm_token_logprobs(logits, ids),
        lambda: VP.check_token_logprobs(got, VP.vllm_token_logprobs(logits, ids)),
    )
    record(
        "token_logprobs",
        shape,
        dtype,
        us,
        ro,
        eager,
        peer("lp", eager_token_logprobs, logits, ids),
        check,
        host=host_us(lambda: K.compute_token_logprobs(logits, ids)),
        vllm=vllm,
    )


def _topk_logprobs_case(shape, logits, ids, dtype, ro, peer):
    got = K.compute_topk_logprobs(logits, 20, ids)
    ref = logprobs.compute_topk_logprobs_torch(logits, 20, ids)
    ids_off = int((got[0] != ref[0]).any(dim=1).sum())
    check = (
        f"ids-off={ids_off} ranks-off={int((got[2] != ref[2]).sum())} lp-diff={max_diff(got[1], ref[1]):.1e}"
    )
    us = bench(lambda: K.compute_topk_logprobs(logits, 20, ids))
    eager = bench(lambda: eager_topk_logprobs(logits, ids, 20))
    vllm = vllm_peer(
        "logprob",
        lambda: VP.vllm_topk_logprobs(logits, 20, ids),
        lambda: VP.check_topk_logprobs(logits, ids, got, VP.vllm_topk_logprobs(logits, 20, ids)),
    )
    record(
        "topk_logprobs(k=20)",
        shape,
        dtype,
        us,
        ro,
        eager,
        peer("topk_lp", eager_topk_logprobs, logits, ids, 20),
        check,
        host=host_us(lambda: K.compute_topk_logprobs(logits, 20, ids)),
        vllm=vllm,
    )


def cache_suite(bw, write_bw):
    # 8 layers of [2, 1024 blocks, 128 tokens, 4 heads, 128] bf16: 2 MiB per block id over all layers.
    layers = [torch.randn(2, 1024, 128, 4, 128, device=DEV).to(torch.bfloat16) for _ in range(8)]
    for n in (16, 256):
        ids = torch.randperm(1024, device=DEV)[:n]
        a = [t.clone() for t in layers]
        b = [t.clone() for t in layers]
        K.zero_kv_blocks(a, ids, 1)
        kv_zero.zero_kv_blocks_torch(b, ids, 1)
        check = "exact" if all(torch.equal(x, y) for x, y in zip(a, b, strict=True)) else "MISMATCH"
        del a, b
        nbytes = n * 8 * 2 * 128 * 4 * 128 * 2
        us = bench(lambda ids=ids: K.zero_kv_blocks(layers, ids, 1))
        eager = bench(lambda ids=ids: kv_zero.zero_kv_blocks_torch(layers, ids, 1))
        floor = nbytes / write_bw / 1e3
        record(
            "zero_kv_blocks",
            f"{n} blocks x 8 layers",
            torch.bfloat16,
            us,
            floor,
            eager,
            None,
            check,
            f"{nbytes / us / 1e3:.0f} GB/s = {nbytes / us / 1e3 / write_bw:.0%} of write bw",
        )

    reqs, max_blocks, tokens = 256, 512, 8192
    table = torch.randint(0, 1 << 20, (reqs, max_blocks), device=DEV, dtype=torch.int32)
    req = torch.randint(0, reqs, (tokens,), device=DEV)
    pos = torch.randint(0, 128 * 64, (tokens,), device=DEV)
    for world, rank in ((1, 0), (4, 1)):
        got = K.compute_slot_mapping(table, req, pos, 128, world, rank, 1)
        ref = slot_mapping.compute_slot_mapping_torch(table, req, pos, 128, world, rank, 1)
        check = "exact" if torch.equal(got, ref) else "MISMATCH"
        us = bench(lambda w=world, r=rank: K.compute_slot_mapping(table, req, pos, 128, w, r, 1))
        eager = bench(
            lambda w=world, r=rank: slot_mapping.compute_slot_mapping_torch(table, req, pos, 128, w, r, 1)
        )
        floor = tokens * (8 + 8 + 4 + 8) / bw / 1e3
        record(
            "slot_mapping" + ("(dcp4)" if world > 1 else ""),
            f"{tokens} tokens",
            torch.int64,
            us,
            floor,
            eager,
            None,
            check,
        )


def sequence_suite(bw):
    dim, width, seqs, total = 8192, 4, 8, 8192
    x = torch.randn(dim, total, device=DEV).to(torch.bfloat16)
    w = torch.randn(dim, width, device=DEV).to(torch.bfloat16)
    bias = torch.randn(dim, device=DEV).to(torch.bfloat16)
    states = torch.randn(64, dim, width - 1, device=DEV).to(torch.bfloat16)
    qsl = torch.linspace(0, total, seqs + 1, device=DEV).to(torch.int32)
    idx = torch.randperm(64, device=DEV)[:seqs].to(torch.int32)
    init = torch.rand(seqs, device=DEV) > 0.5
    s1, s2 = states.clone(), states.clone()
    got = K.causal_conv1d_fn(x, w, bias, s1, qsl, idx, init)
    ref = conv1d.causal_conv1d_fn_torch(x, w, bias, s2, qsl, idx, init)
    check = f"ulp-off={ulps_ok(got, ref, torch.bfloat16)} state-off={ulps_ok(s1, s2, torch.bfloat16)}"
    us = bench(lambda: K.causal_conv1d_fn(x, w, bias, s1, qsl, idx, init))
    eager = bench(lambda: conv1d.causal_conv1d_fn_torch(x, w, bias, s2, qsl, idx, init))
    record(
        "causal_conv1d_fn",
        f"D{dim} T{total} N{seqs}",
        torch.bfloat16,
        us,
        2 * x.numel() * 2 / bw / 1e3,
        eager,
        None,
        check,
        "eager = per-sequence reference loop",
    )

    batch = 256
    xu = torch.randn(batch, dim, device=DEV).to(torch.bfloat16)
    states = torch.randn(batch, dim, width - 1, device=DEV).to(torch.bfloat16)
    lines = torch.randperm(batch, device=DEV).to(torch.int32)
    s1, s2 = states.clone(), states.clone()
    got = K.causal_conv1d_update(xu, s1, w, bias, "silu", lines)
    ref = conv1d.causal_conv1d_update_torch(xu, s2, w, bias, "silu", lines)
    check = f"ulp-off={ulps_ok(got, ref, torch.bfloat16)} state-off={ulps_ok(s1, s2, torch.bfloat16)}"
    us = bench(lambda: K.causal_conv1d_update(xu, s1, w, bias, "silu", lines))
    eager = bench(lambda: conv1d.causal_conv1d_update_torch(xu, s2, w, bias, "silu", lines))
    nbytes = (2 * xu.numel() + 2 * states.numel()) * 2
    record(
        "causal_conv1d_update",
        f"B{batch} D{dim}",
        torch.bfloat16,
        us,
        nbytes / bw / 1e3,
        eager,
        None,
        check,
        "eager = per-row reference loop",
    )

    tokens, heads = 8192, 32
    a_log = torch.randn(heads, device=DEV)
    dt_bias = torch.randn(heads, device=DEV)
    a = torch.randn(tokens, heads, device=DEV).to(torch.bfloat16)
    b = torch.randn(tokens, heads, device=DEV).to(torch.bfloat16)
    g1, be1 = K.fused_gdn_gating(a_log, a, b, dt_bias)
    g2, be2 = gdn_gating.fused_gdn_gating_torch(a_log, a, b, dt_bias)
    check = f"g-maxdiff={max_diff(g1, g2):.1e} beta-ulp-off={ulps_ok(be1, be2, torch.bfloat16)}"
    us = bench(lambda: K.fused_gdn_gating(a_log, a, b, dt_bias))
    eager = bench(lambda: gdn_gating.fused_gdn_gating_torch(a_log, a, b, dt_bias))
    nbytes = tokens * heads * (2 + 2 + 4 + 2)
    record(
        "fused_gdn_gating", f"T{tokens} H{heads}", torch.bfloat16, us, nbytes / bw / 1e3, eager, None, check
    )


def gdn_suite(bw, key_heads=16, value_heads=32, head_dim=128):
    """The chunked gated delta rule of a prefill step at Qwen3-Next-80B's GDN shape (16 key / 32 value heads of
    128), bf16 inputs, float32 states, q/k l2-normalised: ours (an inverse launch and a walk launch), the torch
    reference (a per-sequence, per-chunk loop: the eager peer) and vLLM's FLA ``chunk_gated_delta_rule`` (its
    GDN prefill; chunk tables precomputed as vLLM's metadata builder does, the state in vLLM's ``[N, H, V, K]``
    cache layout). Batches: one long prompt, a few, many short ones. The floor counts q, k, v, g, beta and
    the output once and every state read and written once."""
    for seqs, total in GDN_SHAPES:
        _gdn_case(bw, seqs, total, key_heads, value_heads, head_dim)


#: ``(sequences, tokens)`` of the GDN rows: one long prompt, a few, many short ones.
GDN_SHAPES = ((1, 4096), (1, 16384), (8, 8192), (64, 8192))


def gdn_inputs(seqs, total, key_heads, value_heads, head_dim, dtype, device=DEV, gen=None):
    """``(q, k, v, g, beta, cu_seqlens, initial_state)`` of a GDN prefill: ``seqs`` equal sequences of ``total``
    tokens, gates in ``(-0.5, 0]``, float32 states of magnitude 0.1 (drawn on the CPU from ``gen`` when given)."""

    def draw(fn, *shape):
        return fn(*shape, generator=gen).to(device) if gen is not None else fn(*shape, device=device)

    cu = torch.linspace(0, total, seqs + 1, device=device).round().to(torch.int32)
    q = draw(torch.randn, total, key_heads, head_dim).to(dtype)
    k = draw(torch.randn, total, key_heads, head_dim).to(dtype)
    v = draw(torch.randn, total, value_heads, head_dim).to(dtype)
    g = -draw(torch.rand, total, value_heads) * 0.5
    beta = draw(torch.rand, total, value_heads).to(dtype)
    init = draw(torch.randn, seqs, value_heads, head_dim, head_dim) * 0.1
    return q, k, v, g, beta, cu, init


def gdn_errors(got, ref):
    """``{out_rel, out_mean, state_rel}`` of ``(out, final state)`` against the reference's: max |diff| / max
    |reference| of the outputs and of the states, and the outputs' mean |diff|."""
    return {
        "out_rel": max_diff(got[0], ref[0]) / ref[0].float().abs().max().item(),
        "out_mean": (got[0].float() - ref[0].float()).abs().mean().item(),
        "state_rel": max_diff(got[1], ref[1]) / ref[1].abs().max().item(),
    }


def _gdn_case(bw, seqs, total, key_heads, value_heads, head_dim, dtype=torch.bfloat16):
    args = gdn_inputs(seqs, total, key_heads, value_heads, head_dim, dtype)
    q, k, v, g, beta, cu, init = args
    got = K.chunk_gated_delta_rule(*args)
    ref = gated_delta_rule.chunk_gated_delta_rule_torch(*args)
    # TF32 dots on CUDA: errors of FLA's order (its bf16 intermediates: max 7e-3 to 9e-3 of the largest
    # output, 6e-3 of the largest state entry), so the bound is FLA's, not a float32 rounding.
    out_rel, out_mean, state_rel = gdn_errors(got, ref).values()
    check = f"out-rel={out_rel:.1e} out-mean={out_mean:.1e} state-rel={state_rel:.1e}"
    if out_rel > 5e-2 or state_rel > 1e-2:
        check = f"MISMATCH {check}"
    us = bench(lambda: K.chunk_gated_delta_rule(*args))
    eager = bench(lambda: gated_delta_rule.chunk_gated_delta_rule_torch(*args), reps=5)
    nbytes = (2 * q.numel() + 2 * v.numel()) * 2 + g.numel() * 6 + 2 * init.numel() * 4
    peer = None
    if VP.available("gdn_chunk"):
        meta = VP.vllm_gdn_chunk_metadata(cu)
        init_vk = init.transpose(-1, -2).contiguous()
        vllm_args = (q, k, v, g, beta, cu, init_vk, meta)
        peer = vllm_peer(
            "gdn_chunk",
            lambda: VP.vllm_chunk_gated_delta_rule(*vllm_args),
            lambda: VP.check_gdn(got, VP.vllm_chunk_gated_delta_rule(*vllm_args)),
        )
    record(
        "chunk_gated_delta_rule",
        f"T{total} N{seqs} Hk{key_heads} Hv{value_heads} D{head_dim}",
        dtype,
        us,
        nbytes / bw / 1e3,
        eager,
        None,
        check,
        "eager = per-sequence, per-chunk reference loop",
        host=host_us(lambda: K.chunk_gated_delta_rule(*args)),
        vllm=peer,
    )


def rms_case(bw, tokens=8192, heads=32, head_dim=128):
    """``triton_q_rms`` on a step's per-head queries: read and write each element once."""
    x = torch.randn(tokens * heads, head_dim, device=DEV).to(torch.bfloat16)
    got, ref = K.triton_q_rms(x), rms_norm.triton_q_rms_torch(x)
    us = bench(lambda: K.triton_q_rms(x))
    eager = bench(lambda: rms_norm.triton_q_rms_torch(x))
    record(
        "triton_q_rms",
        f"T{tokens} H{heads} D{head_dim}",
        torch.bfloat16,
        us,
        2 * x.numel() * 2 / bw / 1e3,
        eager,
        None,
        f"ulp-off={ulps_ok(got, ref, torch.bfloat16)}",
        host=host_us(lambda: K.triton_q_rms(x)),
    )


def specdecode_suite(bw, requests=256, drafts=4, vocab=151936):
    """Speculative-decoding verification for ``requests`` requests of ``drafts`` draft tokens each:
    recovered tokens (read the target and draft probabilities and the noise once: the memory floor),
    greedy and random verification (a few gathers per request: launch-bound) and the expansion."""
    n = requests * drafts
    cu = torch.full((requests,), drafts, device=DEV).cumsum(0).to(torch.int32)
    draft = torch.randint(0, vocab, (n,), device=DEV, dtype=torch.int32)
    target = torch.softmax(torch.randn(n, vocab, device=DEV) * 3, -1)
    q = torch.softmax(torch.randn(n, vocab, device=DEV) * 3, -1)
    inv_q = 1.0 / torch.empty(requests, vocab, device=DEV).exponential_()
    bonus = torch.randint(0, vocab, (requests,), device=DEV, dtype=torch.int32)
    uniform = torch.rand(n, device=DEV, dtype=torch.float64)
    is_greedy = torch.rand(requests, device=DEV) < 0.5
    draft[::3] = target[::3].argmax(-1).to(torch.int32)  # some greedy drafts are accepted
    shape = f"{requests}x{drafts} V{vocab}"
    for probs in (None, q):
        args = (drafts, cu, draft, probs, target, inv_q)
        got = K.sample_recovered_tokens(*args)
        check = f"mismatch={int((got != rejection.sample_recovered_tokens_torch(*args)).sum())}/{n}"
        nbytes = (2 if probs is not None else 1) * target.numel() * 4 + inv_q.numel() * 4
        vllm = vllm_peer(
            "rejection",
            lambda: VP.vllm_sample_recovered_tokens(*args),  # noqa: B023
            lambda: VP.check_exact(got, VP.vllm_sample_recovered_tokens(*args)),  # noqa: B023
        )
        record(
            "sample_recovered_tokens" + ("(q)" if probs is not None else ""),
            shape,
            torch.float32,
            bench(lambda: K.sample_recovered_tokens(*args)),  # noqa: B023
            nbytes / bw / 1e3,
            bench(lambda: rejection.sample_recovered_tokens_torch(*args)),  # noqa: B023
            None,
            check,
            host=host_us(lambda: K.sample_recovered_tokens(*args)),  # noqa: B023
            vllm=vllm,
        )
    recovered = K.sample_recovered_tokens(drafts, cu, draft, None, target, inv_q)
    out = torch.full((requests, drafts + 1), K.PLACEHOLDER_TOKEN_ID, device=DEV, dtype=torch.int32)
    argmax = target.argmax(-1)
    cases = {
        "rejection_greedy_sample": (
            K.rejection_greedy_sample,
            rejection.rejection_greedy_sample_torch,
            (cu, draft, argmax, bonus, is_greedy),
            VP.vllm_rejection_greedy_sample,
        ),
        "rejection_random_sample": (
            K.rejection_random_sample,
            rejection.rejection_random_sample_torch,
            (cu, draft, None, target, bonus, recovered, uniform, is_greedy),
            VP.vllm_rejection_random_sample,
        ),
    }
    for name, (fn, ref_fn, args, vllm_fn) in cases.items():
        got, ref = fn(out.clone(), *args), ref_fn(out.clone(), *args)
        check = f"rows-off={int((got != ref).any(1).sum())}/{requests}"
        vllm = vllm_peer(
            "rejection",
            lambda: vllm_fn(out, *args),  # noqa: B023
            lambda: VP.check_exact(got, vllm_fn(out.clone(), *args)),  # noqa: B023
            lambda: out.fill_(K.PLACEHOLDER_TOKEN_ID),
        )
        record(
            name,
            shape,
            torch.int32,
            bench(lambda: fn(out, *args), restore=lambda: out.fill_(K.PLACEHOLDER_TOKEN_ID)),  # noqa: B023
            None,
            bench(lambda: ref_fn(out, *args), restore=lambda: out.fill_(K.PLACEHOLDER_TOKEN_ID)),  # noqa: B023
            None,
            check,
            "launch-bound: no floor",
            host=host_us(lambda: fn(out, *args)),  # noqa: B023
            vllm=vllm,
        )
    temps = torch.rand(requests, device=DEV)
    got = K.expand_batch_to_tokens(temps, cu, n, 0, 1)
    check = f"mismatch={int((got != rejection.expand_batch_to_tokens_torch(temps, cu, n, 0, 1)).sum())}/{n}"
    vllm = vllm_peer(
        "rejection",
        lambda: VP.vllm_expand_batch_to_tokens(temps, cu, n, 0, 1),
        lambda: VP.check_exact(got, VP.vllm_expand_batch_to_tokens(temps, cu, n, 0, 1)),
    )
    record(
        "expand_batch_to_tokens",
        f"{requests}x{drafts}",
        torch.float32,
        bench(lambda: K.expand_batch_to_tokens(temps, cu, n, 0, 1)),
        None,
        bench(lambda: rejection.expand_batch_to_tokens_torch(temps, cu, n, 0, 1)),
        None,
        check,
        "launch-bound: no floor",
        host=host_us(lambda: K.expand_batch_to_tokens(temps, cu, n, 0, 1)),
        vllm=vllm,
    )


def load_vllm_peer(peer_dir: str) -> dict:
    """Load the staged vLLM kernels (none when ``peer_dir`` is empty); what was loaded, for the JSON."""
    if not peer_dir:
        print("# vLLM peer: none (stage it with `python benchmarks/vllm_peer.py stage` and carry .peer)")
        return {}
    errors = VP.load(Path(peer_dir))
    loaded = [op for op in VP.FILES if VP.available(op)]
    print(f"# vLLM peer: vLLM {VP.SOURCE['vllm']} kernels from {peer_dir}: {', '.join(loaded) or 'none'}")
    for op, err in errors.items():
        print(f"# vLLM peer: {VP.FILES[op]} not loaded: {err}")
    return {"dir": peer_dir, **VP.SOURCE, "loaded": loaded, "errors": errors}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer sizes")
    parser.add_argument(
        "--compile", action="store_true", help="also time torch.compile of the eager peers (fp32)"
    )
    parser.add_argument(
        "--only", default="", help="comma list of suites: sampling,cache,sequence,gdn,specdecode"
    )
    parser.add_argument(
        "--ops",
        default="",
        help="comma list of sampling ops: temperature,gumbel,min_p,topk_topp,topk_only,topp_only,penalties,"
        "token_logprobs,topk_logprobs",
    )
    parser.add_argument(
        "--batches",
        default="",
        help="comma list of batch sizes (default: 1,8,64,256,1024; --quick 1,64,1024)",
    )
    parser.add_argument("--vocabs", default="", help="comma list of vocabulary sizes (default: all)")
    parser.add_argument(
        "--warmup",
        action="store_true",
        help="compile the sampling kernels first with the package's warm-up (in parallel, every vocabulary "
        "of the run): the timed calls then load them",
    )
    default_peer = ROOT / ".peer" / "vllm_032"
    parser.add_argument(
        "--vllm-peer",
        default=str(default_peer) if default_peer.exists() else "",
        help="staged vLLM 0.32 kernels (benchmarks/vllm_peer.py stage) to time alongside; '' for none "
        "(default: .peer/vllm_032 when present)",
    )
    parser.add_argument(
        "--json", default=os.environ.get("OUT", "") and os.path.join(os.environ["OUT"], "kernels.json")
    )
    args = parser.parse_args()
    torch.manual_seed(int.from_bytes(os.urandom(4), "little"))
    if not K.use_triton(DEV):
        raise SystemExit("Triton cannot run on this device; nothing to benchmark")
    bw, write_bw = measure_bandwidth()
    name = torch.cuda.get_device_name()
    print(
        f"# {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, {name}, torch {torch.__version__}, "
        f"triton {triton.__version__}"
    )
    print(f"# copy bandwidth {bw:.0f} GB/s (read + write), write bandwidth {write_bw:.0f} GB/s")
    dummy = torch.zeros(1, device=DEV)
    empty_us = bench(lambda: _empty_kernel[(1,)](dummy))
    print(f"# one empty Triton launch: {empty_us:.2f} µs GPU time by the same method")
    peer = load_vllm_peer(args.vllm_peer)
    print(
        "| op | shape | dtype | µs | floor µs | × floor | eager µs | × vs eager | vLLM µs | × vs vLLM "
        "| compile µs | × vs compile | host µs | check | vLLM check |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    suites = set(filter(None, args.only.split(","))) or {"sampling", "cache", "sequence", "gdn", "specdecode"}
    OPS.update(filter(None, args.ops.split(",")))

    def save() -> None:
        """Write the JSON so far (after each sampling shape too: a run cut off by a time limit keeps it)."""
        if args.json:
            meta = {"device": name, "copy_gbps": bw, "write_gbps": write_bw, "empty_launch_us": empty_us}
            Path(args.json).write_text(
                json.dumps({**meta, "copies": COPIES, "vllm_peer": peer, "rows": ROWS}, indent=1)
            )

    if "sampling" in suites:
        batches = (1, 64, 1024) if args.quick else (1, 8, 64, 256, 1024)
        batches = tuple(int(b) for b in args.batches.split(",") if b) or batches
        vocabs = tuple(int(v) for v in args.vocabs.split(",") if v) or (32000, 151936)
        for vocab in vocabs if args.warmup else ():
            stats: dict = {}
            start = time.perf_counter()
            K.kernel_warmup(DEV, vocab, (torch.float32, torch.bfloat16), include=["sampling"], stats=stats)
            print(f"# warm-up, vocabulary {vocab}: {time.perf_counter() - start:.1f} s {stats}", flush=True)
        for vocab in vocabs:
            for batch in batches:
                for dtype in (torch.float32, torch.bfloat16):
                    sampling_suite(batch, vocab, dtype, bw, args.compile)
                    save()
    if "cache" in suites:
        cache_suite(bw, write_bw)
    if "sequence" in suites:
        sequence_suite(bw)
        rms_case(bw)
    if "gdn" in suites:
        gdn_suite(bw)
        save()
    if "specdecode" in suites:
        specdecode_suite(bw)
    save()
    for diff in VLLM_DIFFS:  # not fatal: vLLM's result, not ours (ours is checked against the reference)
        print(f"# vLLM failed or disagrees beyond the stated semantics: {diff}")
    bad = [r for r in ROWS if "MISMATCH" in r["check"]]
    if bad or any(math.isnan(r["us"]) for r in ROWS):
        raise SystemExit(f"{len(bad)} correctness failures")


if __name__ == "__main__":
    main()
