"""Where the by-token LoRA shrink's eager time goes on a CUDA device.

Times (``triton.testing.do_bench``, L2 flushed) the public ``lora_shrink``, the Triton entry with one reduction
split and with its default split-K (one launch: each output tile's last split adds the partials; before
2026-12-06c it zeroed the adapter tokens' rows first, two more launches), and the public call replayed from a
CUDA graph; then profiles 300 public calls' host path.

Usage, on the GPU box from the repository root: ``python benchmarks/lora_host_path.py``
"""

from __future__ import annotations

import cProfile
import pstats
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for src in ("packages/ascend-kernels/src", "packages/ascend-core/src"):
    if str(ROOT / src) not in sys.path:
        sys.path.insert(0, str(ROOT / src))

import torch  # noqa: E402
import triton.testing  # noqa: E402

from vllm_ascend.kernels import lora  # noqa: E402
from vllm_ascend.kernels._triton import lora as triton_lora  # noqa: E402

HIDDEN, RANK, SLOTS = 4096, 16, 4


def _bench(fn: Callable[[], None]) -> float:
    fn()
    torch.cuda.synchronize()
    return float(triton.testing.do_bench(fn, warmup=20, rep=100))


def main() -> None:
    dev = torch.device("cuda")
    a = torch.randn(SLOTS, 1, RANK, HIDDEN, device=dev, dtype=torch.bfloat16)
    for tokens in (1, 64, 1024):
        x = torch.randn(tokens, HIDDEN, device=dev, dtype=torch.bfloat16)
        out = torch.zeros(tokens, RANK, device=dev, dtype=torch.float32)
        idx = torch.arange(tokens, device=dev, dtype=torch.int32) % SLOTS

        def public(x=x, out=out, idx=idx) -> None:
            lora.lora_shrink(x, a, out, idx, 0.5)

        def one_split(x=x, out=out, idx=idx) -> None:
            triton_lora.lora_shrink_tokens(x, a[:, 0], out, idx, 0.5, split_k=1)

        def default_split(x=x, out=out, idx=idx) -> None:
            triton_lora.lora_shrink_tokens(x, a[:, 0], out, idx, 0.5)

        for name, fn in (
            ("public", public),
            ("triton split_k=1", one_split),
            ("triton default split", default_split),
        ):
            print(f"T={tokens:5d} {name:22s} do_bench {_bench(fn):.4f} ms")
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            public()
        print(f"T={tokens:5d} public in a CUDA graph  do_bench {_bench(graph.replay):.4f} ms")
    x = torch.randn(1, HIDDEN, device=dev, dtype=torch.bfloat16)
    out = torch.zeros(1, RANK, device=dev)
    idx = torch.zeros(1, device=dev, dtype=torch.int32)
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(300):
        lora.lora_shrink(x, a, out, idx, 0.5)
    profile.disable()
    torch.cuda.synchronize()
    pstats.Stats(profile).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()
