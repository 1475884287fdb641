"""Sweep the per-row search settings of ``apply_top_k_top_p`` on a GPU (one process, same inputs).

    python benchmarks/sweep_top_k_top_p.py

For each setting of the module's tunables (search program tile/warps by batch size, pivots per exact
pass) it prints µs (same method as ``kernels.py``) for top-k+top-p and top-p alone at the shapes that
miss their target, and the number of rows whose kept count differs from the torch reference.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kernels import DEV, bench

import vllm_ascend.kernels as K
from vllm_ascend.kernels import top_k_top_p
from vllm_ascend.kernels._triton import top_k_top_p as T

SHAPES = [
    (64, 32000, torch.float32),
    (64, 32000, torch.bfloat16),
    (256, 32000, torch.bfloat16),
    (1024, 32000, torch.bfloat16),
    (64, 151936, torch.bfloat16),
    (256, 151936, torch.bfloat16),
]
SETTINGS = [
    {},
    {"SMALL_BATCH_SEARCH": (2048, 16)},
    {"SMALL_BATCH_SEARCH": (1024, 8)},
    {"SMALL_BATCH_SEARCH": (1024, 4)},
    {"LARGE_BATCH_SEARCH": (1024, 8)},
    {"LARGE_BATCH_SEARCH": (512, 8)},
    {"SCRATCH_PIVOTS": 16},
    {"SCRATCH_PIVOTS": 64},
    {"BOUND_PASSES": 1, "BOUND_PIVOTS": 32},
]


def main() -> None:
    torch.manual_seed(0)
    cases = []
    for b, v, dt in SHAPES:
        logits = (torch.randn(b, v, device=DEV) * 3).to(dt)
        k = torch.randint(1, 200, (b,), device=DEV, dtype=torch.int32)
        p = torch.rand(b, device=DEV) * 0.2 + 0.79
        cases.append((f"{b}x{v} {str(dt)[6:]}", logits, k, p))
    defaults = {name: getattr(T, name) for s in SETTINGS for name in s}
    print("| setting | " + " | ".join(f"{c[0]} kp / p" for c in cases) + " |")
    for setting in SETTINGS:
        for name, value in {**defaults, **setting}.items():
            setattr(T, name, value)
        cells = []
        for _, logits, k, p in cases:
            work = logits.clone()
            out = []
            off = 0
            for kk in (k, None):
                a, r = logits.clone(), logits.clone()
                K.apply_top_k_top_p(a, kk, p)
                top_k_top_p.apply_top_k_top_p_torch(r, kk, p)
                off += int((torch.isfinite(a).sum(1) != torch.isfinite(r).sum(1)).sum())
                out.append(
                    bench(
                        lambda kk=kk, work=work, p=p: K.apply_top_k_top_p(work, kk, p),
                        lambda work=work, logits=logits: work.copy_(logits),
                    )
                )
            cells.append(f"{out[0]:.1f} / {out[1]:.1f}" + (f" (off {off})" if off else ""))
        print(f"| {setting or 'default'} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
