"""Batched n-gram drafting on a device: ascend-kernels' Triton ``ngram_propose`` vs its plain-torch
reference (vectorised over every position, the approach of vLLM's ``ngram_gpu`` torch search).

Contexts of ``L`` tokens (vocabulary 32k) built from fresh random spans and copies of earlier spans,
one row per request, every row at full length (the worst case of the Triton scan: its early exit
needs a ``max_n``-token match). Columns: µs per call (``triton.testing.do_bench``, median), ratio =
torch µs / Triton µs, drafted = mean draft length; every shape first checks the two agree exactly.
Run from the repository root on a machine with a CUDA GPU, torch and triton (vLLM not needed):
``python benchmarks/ngram_device.py [--quick]``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
for src in ("packages/ascend-core/src", "packages/ascend-kernels/src"):
    if str(ROOT / src) not in sys.path:
        sys.path.insert(0, str(ROOT / src))

import triton  # noqa: E402
import triton.testing  # noqa: E402

from vllm_ascend.kernels import ngram  # noqa: E402
from vllm_ascend.kernels._triton import ngram as triton_ngram  # noqa: E402

VOCAB = 32000
MIN_N, MAX_N, K = 2, 5, 5
SHAPES = [(1, 4096), (8, 4096), (64, 4096), (256, 4096), (1, 32768), (64, 32768), (256, 32768)]
QUICK_SHAPES = [(8, 4096), (64, 32768)]


def contexts(rows: int, cols: int, rng: np.random.Generator) -> torch.Tensor:
    """``[rows, cols]`` int32: random spans of 4-48 tokens, half of them copies of an earlier span."""
    out = np.empty((rows, cols), dtype=np.int32)
    for r in range(rows):
        seq: list[int] = []
        while len(seq) < cols:
            if len(seq) > 64 and rng.random() < 0.5:
                start = int(rng.integers(0, len(seq) - 32))
                seq.extend(seq[start : start + int(rng.integers(8, 32))])
            else:
                seq.extend(rng.integers(0, VOCAB, size=int(rng.integers(4, 48))).tolist())
        out[r] = seq[:cols]
    return torch.from_numpy(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    device = torch.device("cuda")
    print(f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}, triton {triton.__version__}")
    print(f"min_n={MIN_N} max_n={MAX_N} k={K}\n")
    print("| B | L | Triton µs | torch µs | ratio | drafted |")
    print("|---|---|---|---|---|---|")
    rng = np.random.default_rng(0)
    for rows, cols in QUICK_SHAPES if args.quick else SHAPES:
        tokens = contexts(rows, cols, rng).to(device)
        lengths = torch.full((rows,), cols, dtype=torch.int32, device=device)
        call = (tokens, lengths, MIN_N, MAX_N, K, cols + 64)
        got = triton_ngram.ngram_propose(*call)
        want = ngram.ngram_propose_torch(*call)
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True)), (rows, cols)
        ours = triton.testing.do_bench(
            lambda call=call: triton_ngram.ngram_propose(*call), return_mode="median"
        )
        ref = triton.testing.do_bench(
            lambda call=call: ngram.ngram_propose_torch(*call), return_mode="median"
        )
        drafted = got[1].float().mean().item()
        print(f"| {rows} | {cols} | {ours * 1e3:.1f} | {ref * 1e3:.1f} | {ref / ours:.1f} | {drafted:.2f} |")


if __name__ == "__main__":
    main()
