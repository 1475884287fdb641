"""Sweep the tunables of the streaming top-k/top-p and top-k logprob kernels on a GPU (one process).

    python benchmarks/sweep_top_k_top_p.py [--batches 256,1024] [--vocabs 32000,151936] [--json PATH]

Each setting overrides module constants of ``_triton.top_k_top_p`` (slot tiles, row split, top-p
pivots) or ``_triton.logprobs`` (the top-n kernel's tiles and split). Every setting's variants are
compiled ahead first, in parallel (the warm-up's precompile), so the sweep times kernels, not
compiles; then each op is timed at each shape by ``kernels.bench`` (L2 flushed, GPU time, same inputs
for every setting) and checked against the package's torch reference. Prints one table per op:
µs per setting and shape, ``(off N)`` where rows differ from the reference.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kernels import DEV, bench

import vllm_ascend.kernels as K
from vllm_ascend.kernels import _precompile, logprobs, top_k_top_p
from vllm_ascend.kernels._triton import logprobs as LP
from vllm_ascend.kernels._triton import top_k_top_p as T

FILTER_SETTINGS: list[dict[str, object]] = [
    {},
    {"PER_SM": 2},
    {"PER_SM": 8},
    {"WARPS": 8},
    {"PIVOTS": 4},
]
LOGPROB_SETTINGS: list[dict[str, object]] = [
    {},
    {"TOPK_PER_SM": 8},
    {"TOPK_WARPS": 8},
]
FILTER_OPS = {"topk_only": (True, False), "topk_topp": (True, True), "topp_only": (False, True)}


def _apply(module, setting: dict[str, object], defaults: dict[str, object]) -> None:
    for name, value in {**defaults, **setting}.items():
        setattr(module, name, value)


def _cases(batches: list[int], vocabs: list[int]) -> list[tuple[str, dict[str, torch.Tensor]]]:
    cases = []
    for vocab in vocabs:
        for batch in batches:
            for dtype in (torch.float32, torch.bfloat16):
                inputs = {
                    "logits": (torch.randn(batch, vocab, device=DEV) * 3).to(dtype),
                    "k": torch.randint(1, 200, (batch,), device=DEV, dtype=torch.int32),
                    "p": torch.rand(batch, device=DEV) * 0.2 + 0.79,
                    "ids": torch.randint(0, vocab, (batch,), device=DEV),
                }
                cases.append((f"{batch}x{vocab} {str(dtype)[6:]}", inputs))
    return cases


def _record(cases, filter_defaults, logprob_defaults) -> None:
    """Launch every setting's ops once on the smallest case of each dtype (the variants do not depend
    on the batch or the vocabulary) while the precompile records them."""
    seen = set()
    for _, inp in cases:
        dtype = inp["logits"].dtype
        if dtype in seen:
            continue
        seen.add(dtype)
        logits = inp["logits"][:2].clone()
        for setting in FILTER_SETTINGS:
            _apply(T, setting, filter_defaults)
            for use_k, use_p in FILTER_OPS.values():
                K.apply_top_k_top_p(logits, inp["k"][:2] if use_k else None, inp["p"][:2] if use_p else None)
        _apply(T, {}, filter_defaults)
        for setting in LOGPROB_SETTINGS:
            _apply(LP, setting, logprob_defaults)
            K.compute_topk_logprobs(logits, 20, inp["ids"][:2])
        _apply(LP, {}, logprob_defaults)


def _filter_row(inp, use_k, use_p) -> tuple[float, str]:
    logits = inp["logits"]
    k = inp["k"] if use_k else None
    p = inp["p"] if use_p else None
    got, want = logits.clone(), logits.clone()
    K.apply_top_k_top_p(got, k, p)
    top_k_top_p.apply_top_k_top_p_torch(want, k, p)
    off = int((torch.isfinite(got).sum(1) != torch.isfinite(want).sum(1)).sum())
    work = logits.clone()
    us = bench(lambda: K.apply_top_k_top_p(work, k, p), lambda: work.copy_(logits))
    return us, f" (off {off})" if off else ""


def _logprob_row(inp) -> tuple[float, str]:
    logits, ids = inp["logits"], inp["ids"]
    got = K.compute_topk_logprobs(logits, 20, ids)
    ref = logprobs.compute_topk_logprobs_torch(logits, 20, ids)
    off = int((got[0] != ref[0]).any(dim=1).sum()) + int((got[2] != ref[2]).sum())
    us = bench(lambda: K.compute_topk_logprobs(logits, 20, ids))
    return us, f" (off {off})" if off else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="256,1024")
    parser.add_argument("--vocabs", default="32000,151936")
    parser.add_argument(
        "--json", default=os.environ.get("OUT", "") and os.path.join(os.environ["OUT"], "sweep.json")
    )
    args = parser.parse_args()
    torch.manual_seed(0)
    cases = _cases([int(b) for b in args.batches.split(",")], [int(v) for v in args.vocabs.split(",")])
    filter_defaults = {name: getattr(T, name) for s in FILTER_SETTINGS for name in s}
    logprob_defaults = {name: getattr(LP, name) for s in LOGPROB_SETTINGS for name in s}
    report = _precompile.precompile(
        lambda: _record(cases, filter_defaults, logprob_defaults), os.cpu_count() or 1
    )
    print(f"# precompiled: {report.summary()}", flush=True)
    rows: list[dict[str, object]] = []
    header = "| setting | " + " | ".join(name for name, _ in cases) + " |"
    for op, (use_k, use_p) in [*FILTER_OPS.items(), ("topk_logprobs", (False, False))]:
        print(f"\n## {op}\n{header}\n|---|" + "---|" * len(cases), flush=True)
        module, settings, defaults = (
            (LP, LOGPROB_SETTINGS, logprob_defaults)
            if op == "topk_logprobs"
            else (T, FILTER_SETTINGS, filter_defaults)
        )
        for setting in settings:
            if op != "topp_only" and "PIVOTS" in setting:
                continue
            _apply(module, setting, defaults)
            cells = []
            for name, inp in cases:
                us, note = _logprob_row(inp) if op == "topk_logprobs" else _filter_row(inp, use_k, use_p)
                cells.append(f"{us:.1f}{note}")
                rows.append({"op": op, "setting": setting, "shape": name, "us": us, "note": note})
            print(f"| {setting or 'default'} | " + " | ".join(cells) + " |", flush=True)
            if args.json:
                Path(args.json).write_text(json.dumps(rows, indent=1))
        _apply(module, {}, defaults)


if __name__ == "__main__":
    main()
