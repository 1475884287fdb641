"""Sweep the launch settings of Gumbel sampling, min-p and temperature on a GPU (one process, same inputs).

    python benchmarks/sweep_sampling.py [--baseline-gumbel FILE] [--vllm-peer DIR] [--json PATH]

For each setting of a kernel module's tunables (prefetch depth, warps, row splits, tiles) it times the
kernel by ``kernels.py``'s method at the shapes its target is about (Gumbel and min-p: B >= 256;
temperature: 64-1024 rows, beside vLLM's own kernel) and counts results that differ from the torch
reference. ``--baseline-gumbel`` times an earlier ``_triton/gumbel.py`` (a file) on the same inputs.
(The 2026-12-06 run, ``device-runs/2026-12-06-gumbel-sweep.txt``, also split 256-row batches in two
for both kernels: 0-32 % slower everywhere, so that setting is gone with the knob it set.)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import vllm_peer as VP
from kernels import DEV, ROOT, bench, measure_bandwidth

import vllm_ascend.kernels as K
from vllm_ascend.kernels import gumbel, min_p
from vllm_ascend.kernels._triton import gumbel as G
from vllm_ascend.kernels._triton import min_p as M
from vllm_ascend.kernels._triton import temperature as T

GUMBEL = [
    ("shipped", {}),
    ("prefetch 1", {"PREFETCH": {torch.float32: 1, torch.bfloat16: 1, torch.float16: 1}}),
    ("16-bit prefetch 2 always", {"DEEP_PREFETCH_TILES": 1}),
    ("4 warps", {"WARPS": 4, "GROUPS_PER_TILE": 128}),
]
MIN_P = [
    ("shipped", {}),
    ("row tile 8192 x 8", {"ROW_TILE": (8192, 8)}),
    ("row tile 32768 x 16", {"ROW_TILE": (32768, 16)}),
]
TEMPERATURE = [(8192, 4), (4096, 8), (8192, 8), (16384, 8)]
LARGE = [(256, 32000), (1024, 32000), (256, 151936), (1024, 151936)]
TEMP_SHAPES = [(64, 32000), (256, 32000), (1024, 32000), (64, 151936), (256, 151936), (1024, 151936)]
DTYPES = (torch.float32, torch.bfloat16)
ROWS: list[dict] = []
JSON: list[Path] = []  # where each row is saved as it comes (a run cut off keeps what it measured)


def _with(module, setting: dict, fn):
    saved = {name: getattr(module, name) for name in setting}
    for name, value in setting.items():
        setattr(module, name, value)
    try:
        return fn()
    finally:
        for name, value in saved.items():
            setattr(module, name, value)


def _row(kernel, setting, shape, dtype, us, floor_us, check, vllm_us=None):
    row = {"kernel": kernel, "setting": setting, "shape": shape, "dtype": str(dtype)[6:], "us": us}
    row.update(x_floor=us / floor_us, check=check, vllm_us=vllm_us)
    row["vs_vllm"] = vllm_us / us if vllm_us else None
    ROWS.append(row)
    for path in JSON:
        path.write_text(json.dumps({"rows": ROWS}, indent=1))
    extra = f" | vLLM {vllm_us:.1f} µs, × {vllm_us / us:.3f}" if vllm_us else ""
    print(
        f"| {kernel} | {setting} | {shape} | {row['dtype']} | {us:.1f} | {us / floor_us:.2f} | {check}{extra} |",
        flush=True,
    )


def sweep_gumbel(bw: float, baseline) -> None:
    for b, v in LARGE:
        for dtype in DTYPES:
            _gumbel_shape(bw, baseline, b, v, dtype)


def _gumbel_shape(bw: float, baseline, b: int, v: int, dtype: torch.dtype) -> None:
    logits = (torch.randn(b, v, device=DEV) * 3).to(dtype)
    temp = torch.rand(b, device=DEV) * 1.5 + 0.25
    temp[::7] = 0.0
    seeds = torch.randint(0, 2**62, (b,), device=DEV)
    pos = torch.randint(0, 4096, (b,), device=DEV)
    floor = b * v * logits.element_size() / bw / 1e3
    want = gumbel.gumbel_sample_torch(logits, temp, seeds, pos)

    def call():
        return K.gumbel_sample(logits, temp, seeds, pos)

    for name, setting in GUMBEL:
        got = _with(G, setting, call)
        us = _with(G, setting, lambda: bench(call))
        _row("gumbel", name, f"{b}x{v}", dtype, us, floor, f"mismatch={int((got != want).sum())}/{b}")
    if baseline is not None:
        us = bench(lambda: baseline.gumbel_sample(logits, temp, seeds, pos))
        _row("gumbel", "baseline (main)", f"{b}x{v}", dtype, us, floor, "earlier format")


def sweep_min_p(bw: float) -> None:
    for b, v in LARGE:
        for dtype in DTYPES:
            _min_p_shape(bw, b, v, dtype)


def _min_p_shape(bw: float, b: int, v: int, dtype: torch.dtype) -> None:
    logits = (torch.randn(b, v, device=DEV) * 3).to(dtype)
    work = logits.clone()
    mp = torch.rand(b, device=DEV) * 0.2
    floor = 2 * b * v * logits.element_size() / bw / 1e3
    want = min_p.apply_min_p_torch(logits.clone(), mp)
    for name, setting in MIN_P:
        got = _with(M, setting, lambda: K.apply_min_p(logits.clone(), mp))
        check = f"mask-off={int((torch.isinf(got) != torch.isinf(want)).sum())}"
        us = _with(M, setting, lambda: bench(lambda: K.apply_min_p(work, mp), lambda: work.copy_(logits)))
        _row("min_p", name, f"{b}x{v}", dtype, us, floor, check)


def sweep_temperature(bw: float) -> None:
    for b, v in TEMP_SHAPES:
        for dtype in DTYPES:
            _temperature_shape(bw, b, v, dtype)


def _temperature_shape(bw: float, b: int, v: int, dtype: torch.dtype) -> None:
    logits = (torch.randn(b, v, device=DEV) * 3).to(dtype)
    work = logits.clone()
    temp = (torch.rand(b, device=DEV) * 1.5 + 0.25).clamp(min=0.5)
    floor = 2 * b * v * logits.element_size() / bw / 1e3

    def restore():
        return work.copy_(logits)

    vllm_us = bench(lambda: VP.vllm_temperature(work, temp), restore) if VP.available("gumbel") else None
    for tile in TEMPERATURE:
        us = _with(T, {"TILE": tile}, lambda: bench(lambda: K.apply_temperature(work, temp), restore))
        _row("temperature", f"{tile[0]} x {tile[1]} warps", f"{b}x{v}", dtype, us, floor, "-", vllm_us)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline-gumbel", default="", help="an earlier _triton/gumbel.py to time beside")
    parser.add_argument("--vllm-peer", default=str(ROOT / ".peer" / "vllm_032"))
    parser.add_argument("--only", default="temperature,gumbel,min_p")
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    torch.manual_seed(0)
    VP.load(Path(args.vllm_peer))
    baseline = None
    if args.baseline_gumbel:
        spec = importlib.util.spec_from_file_location("gumbel_baseline", args.baseline_gumbel)
        assert spec is not None and spec.loader is not None
        baseline = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(baseline)
    bw, _ = measure_bandwidth()
    print(f"# {torch.cuda.get_device_name()}: copy bandwidth {bw:.0f} GB/s; floor = bytes / that", flush=True)
    print("| kernel | setting | shape | dtype | µs | × floor | check |\n|---|---|---|---|---|---|---|")
    only = set(args.only.split(","))
    if args.json:
        JSON.append(Path(args.json))
    if "temperature" in only:
        sweep_temperature(bw)
    if "gumbel" in only:
        sweep_gumbel(bw, baseline)
    if "min_p" in only:
        sweep_min_p(bw)


if __name__ == "__main__":
    main()
