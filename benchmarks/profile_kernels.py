"""Per-launch GPU time of ``vllm_ascend.kernels`` ops (torch.profiler), to see where a call's time goes.

    python benchmarks/profile_kernels.py --ops topk_topp,topp_only [--batches 64,1024] [--vocabs 32000]

Prints, per op and shape, every kernel the call launches with its mean GPU µs over the profiled calls
(the L2 is flushed before each call, as in ``kernels.py``), and the same-method GPU time of one empty
Triton launch and of a device copy of the same bytes: what the hardware takes for that much data.
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from kernels import DEV, _empty_kernel, _flush, bench  # noqa: E402

import vllm_ascend.kernels as K  # noqa: E402


def _calls(op, logits, batch, vocab):
    work = logits.clone()
    k = torch.randint(1, 200, (batch,), device=DEV, dtype=torch.int32)
    p = torch.rand(batch, device=DEV) * 0.2 + 0.79
    temp = torch.rand(batch, device=DEV) * 1.5 + 0.25
    seeds = torch.randint(0, 2**62, (batch,), device=DEV)
    pos = torch.randint(0, 4096, (batch,), device=DEV)
    mp = torch.rand(batch, device=DEV) * 0.2
    ids = torch.randint(0, vocab, (batch,), device=DEV)
    restore = lambda: work.copy_(logits)  # noqa: E731
    table = {
        "topk_topp": lambda: K.apply_top_k_top_p(work, k, p),
        "topp_only": lambda: K.apply_top_k_top_p(work, None, p),
        "temperature": lambda: K.apply_temperature(work, temp),
        "gumbel": lambda: K.gumbel_sample(logits, temp, seeds, pos),
        "min_p": lambda: K.apply_min_p(work, mp),
        "token_logprobs": lambda: K.compute_token_logprobs(logits, ids),
        "topk_logprobs": lambda: K.compute_topk_logprobs(logits, 20, ids),
    }
    return table[op], restore


def profile(fn, restore, reps=10):
    fn()
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(reps):
            restore()
            _flush()
            torch.cuda.synchronize()
            fn()
            torch.cuda.synchronize()
    per = collections.OrderedDict()
    for ev in prof.events():
        if ev.device_type != torch.autograd.DeviceType.CUDA:
            continue
        name = ev.name
        if "elementwise" in name or "fill" in name.lower() or "copy" in name.lower():
            continue  # restore / flush
        us = getattr(ev, "device_time", None)
        if us is None:
            us = ev.cuda_time
        per.setdefault(name, []).append(us)
    return {n: (sum(v) / reps, len(v) / reps) for n, v in per.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", default="topk_topp,topp_only")
    ap.add_argument("--batches", default="64,256,1024")
    ap.add_argument("--vocabs", default="32000,151936")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    args = ap.parse_args()
    dummy = torch.zeros(1, device=DEV)
    print(f"empty launch: {bench(lambda: _empty_kernel[(1,)](dummy)):.2f} us (same method as kernels.py)")
    print(f"empty launch, 512 programs: {bench(lambda: _empty_kernel[(512,)](dummy)):.2f} us")
    for vocab in map(int, args.vocabs.split(",")):
        for batch in map(int, args.batches.split(",")):
            for dname in args.dtypes.split(","):
                dtype = getattr(torch, dname)
                logits = (torch.randn(batch, vocab, device=DEV) * 3).to(dtype)
                src, dst = logits.clone(), logits.clone()
                copy_us = bench(lambda src=src, dst=dst: dst.copy_(src))
                print(f"\n## {batch}x{vocab} {dname}: copy of the logits {copy_us:.1f} us")
                for op in args.ops.split(","):
                    fn, restore = _calls(op, logits, batch, vocab)
                    total = bench(fn, restore)
                    print(f"{op}: {total:.1f} us (bench)")
                    for name, (us, n) in profile(fn, restore).items():
                        print(f"    {us:8.1f} us  x{n:.0f}  {name[:90]}")


if __name__ == "__main__":
    main()
