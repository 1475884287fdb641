"""Multi-LoRA (punica) kernels on a GPU: ``vllm_ascend.kernels`` LoRA shrink/expand beside vLLM 0.32's own Triton
punica kernels, in one process, same inputs, same method.

Run from the repository root on a CUDA machine with torch and triton (vLLM not needed), after staging vLLM's files
where vLLM is installed (``python benchmarks/vllm_peer.py stage``) and carrying ``.peer``:

    python benchmarks/lora_kernels.py [--quick] [--json PATH]
    TRITON_INTERPRET=1 python benchmarks/lora_kernels.py --dry    # the script itself, on CPU, tiny, fp16

Shapes: hidden 4096, 4 adapter slots all in use, ranks 16 and 64, T in {1, 8, 64, 256, 1024} tokens, bf16.
Layouts: decode (each token its adapter, interleaved) and prefill (4 sequences, one adapter each); ours runs
as the punica wrapper runs it where Triton serves, the by-token kernel on the step's tokens ordered by adapter,
in both (``old`` used its segmented kernel for prefill); vLLM has one kernel for both. Rows: ``shrink`` (x @ A^T into the fp32
buffer), ``expand`` (buffer @ B^T added to a bf16 output), ``qkv`` (a merged 4096 -> 4096+1024+1024 layer:
shrink + expand of three slices, one launch per direction over the slices on both sides; ``old``: per slice).
Timing: ``kernels.py``'s method, the median GPU µs of a call (L2 flushed, the GPU kept busy while the host
enqueues it, so a host-bound call's launch gaps are not timed: plain ``do_bench`` timed them whenever the host
cost passed the flush's GPU time, which made eager multi-launch rows a measure of the device host's load);
"host": each side's Python + launch µs per call, measured apart. Per-step metadata (tokens ordered by adapter)
is built once outside the timing on both sides, as each punica wrapper does per step. "floor": bytes that must move (inputs, the active adapters' weights, outputs) / the measured copy
bandwidth. Correctness: each side's relative error against a float64 product; ``old`` (when
``.peer/ours_old_lora.py`` holds the previous kernel) the same for the kernel before the by-token layout.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
for src in ("packages/ascend-kernels/src", "packages/ascend-core/src"):
    if str(ROOT / src) not in sys.path:
        sys.path.insert(0, str(ROOT / src))

import triton.testing  # noqa: E402
import vllm_peer as VP  # noqa: E402
from kernels import bench as gpu_bench  # noqa: E402
from kernels import host_us  # noqa: E402

from vllm_ascend.kernels import lora  # noqa: E402

SLOTS = 4
SHAPES = {"gpu": (4096, (4096, 1024, 1024)), "dry": (64, (64, 16, 16))}  # hidden, merged QKV widths
OLD = ROOT / ".peer" / "ours_old_lora.py"


def _load_old() -> Any:
    if not OLD.exists():
        return None
    spec = importlib.util.spec_from_file_location("ours_old_lora", OLD)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def copy_bandwidth(device: torch.device) -> float:
    """Bytes/s of a 1 GiB device-to-device copy (read + write counted)."""
    src = torch.empty(1 << 28, dtype=torch.float32, device=device).normal_()
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=10, rep=50, return_mode="median")
    return 2 * src.numel() * 4 / (ms * 1e-3)


def _mapping(layout: str, tokens: int, device: torch.device, gen: torch.Generator) -> torch.Tensor:
    if layout == "decode":
        return torch.randint(0, SLOTS, (tokens,), generator=gen).to(device=device, dtype=torch.int32)
    per = -(-tokens // SLOTS)
    return torch.arange(SLOTS).repeat_interleave(per)[:tokens].to(device=device, dtype=torch.int32)


def _runs(mapping: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Segmented metadata of a mapping whose equal adapters are consecutive (built once per step, like vLLM's)."""
    loras, lens = torch.unique_consecutive(mapping, return_counts=True)
    starts = torch.cumsum(lens, 0) - lens
    return starts, lens, loras, int(lens.max())


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want).norm() / want.norm().clamp_min(1e-30))


def _shrink_ref(x: torch.Tensor, a: torch.Tensor, mapping: torch.Tensor, scale: float) -> torch.Tensor:
    return scale * torch.einsum("th,trh->tr", x.double(), a[mapping.long(), 0].double())


def _expand_ref(base: torch.Tensor, z: torch.Tensor, b: torch.Tensor, mapping: torch.Tensor) -> torch.Tensor:
    return base.double() + torch.einsum("tr,tnr->tn", z.double(), b[mapping.long(), 0].double())


def _ours(op: str, layout: str, impl: Any) -> Callable[..., None]:
    """Our call for ``op``/``layout``: ``impl`` is :mod:`vllm_ascend.kernels.lora` (public ops) or the old
    Triton module (its launch functions, same arguments)."""
    public = impl is lora
    if op == "shrink":
        if layout == "decode":
            return (
                impl.lora_shrink
                if public
                else (lambda x, a, out, m, s: impl.lora_shrink_tokens(x, a[:, 0], out, m, s))
            )
        return (
            impl.lora_shrink_segmented
            if public
            else (lambda x, a, out, st, ln, lo, mx, s: impl.lora_shrink(x, a[:, 0], out, st, ln, lo, mx, s))
        )
    if layout == "decode":
        return (
            impl.lora_expand
            if public
            else (lambda z, b, out, m, o, add: impl.lora_expand_tokens(z, b[:, 0], out, m, o, add))
        )
    return (
        impl.lora_expand_segmented
        if public
        else (
            lambda z, b, out, st, ln, lo, mx, o, add: impl.lora_expand(
                z, b[:, 0], out, st, ln, lo, mx, o, add
            )
        )
    )


#: GPU kept busy while the host enqueues a call (kernels.py's method): above the slowest side's host cost
#: (vLLM's merged QKV call measured up to ~270 us on a loaded device host), so only GPU time is timed.
GUARD_US = 1000.0


def _median_us(fn: Callable[[], None], device: torch.device) -> float:
    if device.type == "cuda":
        return gpu_bench(fn, guard_us=GUARD_US)
    start = time.perf_counter()  # --dry: the interpreter's time, only to exercise the script
    fn()
    return (time.perf_counter() - start) * 1e6


def bench_case(
    layout: str,
    tokens: int,
    rank: int,
    dtype: torch.dtype,
    bw: float,
    old: Any,
    gen: torch.Generator,
    device: torch.device,
    shape: tuple[int, tuple[int, ...]],
) -> list[dict[str, Any]]:
    hidden, qkv = shape
    mapping = _mapping(layout, tokens, device, gen)
    meta = VP.vllm_lora_meta(mapping, SLOTS)
    runs = _runs(mapping)
    order = lora.lora_token_order(mapping, SLOTS)
    scale = 0.5
    x = torch.randn(tokens, hidden, generator=gen).to(device=device, dtype=dtype)
    widths = {"shrink": (hidden,), "expand": (hidden,), "qkv": qkv}
    rows = []
    for op in ("shrink", "expand", "qkv"):
        outs = widths[op]
        a = [
            torch.randn(SLOTS, 1, rank, hidden, generator=gen).to(device=device, dtype=dtype) * 0.05
            for _ in outs
        ]
        b = [
            torch.randn(SLOTS, 1, n, rank, generator=gen).to(device=device, dtype=dtype) * 0.05 for n in outs
        ]
        z = torch.randn(len(outs), tokens, rank, generator=gen).to(device) * 0.3
        base = torch.randn(tokens, sum(outs), generator=gen).to(device=device, dtype=dtype)
        shrink_buf = torch.zeros(len(outs), tokens, rank, device=device)
        y = base.clone()

        def ours_fn(impl: Any, *, op: str = op, a: list = a, b: list = b, z: torch.Tensor = z, y: torch.Tensor = y,
                    buf: torch.Tensor = shrink_buf, outs: tuple = outs) -> None:  # fmt: skip
            # ours as the punica wrapper runs it where Triton serves: per token, on the step's tokens ordered
            # by adapter (built once per step), whatever the layout; ``old``: its own per-layout kernels
            public = impl is lora
            shrink = _ours("shrink", "decode" if public else layout, impl)
            expand = _ours("expand", "decode" if public else layout, impl)
            meta_args = (mapping,) if layout == "decode" or public else (*runs,)
            plan = order if public else ()
            if op == "qkv" and public:  # a merged layer: one launch per direction over the slices
                merged = (lora.lora_shrink_slices, lora.lora_expand_slices)
                offsets = [sum(outs[:i]) for i in range(len(outs))]
                merged[0](x, a, buf, *meta_args, scale, *plan)
                merged[1](buf, b, y, *meta_args, offsets, True, *plan)
                return
            if op in ("shrink", "qkv"):
                for i in range(len(outs)):
                    shrink(x, a[i], buf[i], *meta_args, scale, *plan)
            src = z if op == "expand" else buf
            if op in ("expand", "qkv"):
                offset = 0
                for i, n in enumerate(outs):
                    expand(src[i], b[i], y, *meta_args, offset, True, *plan)
                    offset += n

        def vllm_fn(*, op: str = op, a: list = a, b: list = b, z: torch.Tensor = z, y: torch.Tensor = y,
                    buf: torch.Tensor = shrink_buf) -> None:  # fmt: skip
            if op in ("shrink", "qkv"):
                VP.vllm_lora_shrink(x, a, buf, meta, scale)
            if op in ("expand", "qkv"):
                VP.vllm_lora_expand(z if op == "expand" else buf, b, y, meta, True)

        # correctness: one call each from fresh buffers against float64
        checks: dict[str, float] = {}
        sides: list[tuple[str, Callable[[], None]]] = [("ours", lambda: ours_fn(lora)), ("vllm", vllm_fn)]
        if old is not None:
            sides.append(("old", lambda: ours_fn(old)))
        for name, fn in sides:
            shrink_buf.zero_()
            y.copy_(base)
            fn()
            if op == "shrink":
                checks[name] = _rel(shrink_buf[0], _shrink_ref(x, a[0], mapping, scale))
            else:
                src = (
                    z
                    if op == "expand"
                    else torch.stack([_shrink_ref(x, a[i], mapping, scale) for i in range(len(outs))])
                )
                want = base.double().clone()
                offset = 0
                for i, n in enumerate(outs):
                    want[:, offset : offset + n] = _expand_ref(
                        base[:, offset : offset + n], src[i], b[i], mapping
                    )
                    offset += n
                checks[name] = _rel(y, want)
        times = {name: _median_us(fn, device) for name, fn in sides}
        hosts = {name: host_us(fn) if device.type == "cuda" else 0.0 for name, fn in sides}
        elt = torch.tensor([], dtype=dtype).element_size()
        weights = sum((a[0].numel() // SLOTS if op != "expand" else 0) + (b[i].numel() // SLOTS if op != "shrink" else 0)
                      for i in range(len(outs))) * min(SLOTS, tokens) * elt  # fmt: skip
        io = tokens * (hidden * elt if op != "expand" else 0) + tokens * sum(outs) * (
            2 * elt if op != "shrink" else 0
        )
        io += tokens * rank * 4 * len(outs) * (2 if op == "qkv" else 1)
        floor_us = (weights + io) / bw * 1e6
        row = {
            "op": op, "layout": layout, "tokens": tokens, "rank": rank, "dtype": str(dtype).removeprefix("torch."),
            "ours_us": times["ours"], "vllm_us": times["vllm"], "floor_us": floor_us,
            "x_vs_vllm": times["vllm"] / times["ours"], "ours_x_floor": times["ours"] / floor_us,
            "err_ours": checks["ours"], "err_vllm": checks["vllm"],
            "host_ours_us": hosts["ours"], "host_vllm_us": hosts["vllm"],
        }  # fmt: skip
        if old is not None:
            row["old_us"], row["err_old"] = times["old"], checks["old"]
        rows.append(row)
        print(
            f"{op:6s} {layout:7s} T={tokens:5d} r={rank:3d} ours {times['ours']:8.2f} vllm {times['vllm']:8.2f} "
            f"x{row['x_vs_vllm']:5.2f}"
            + (f" old {times['old']:8.2f}" if old is not None else "")
            + f" floor {floor_us:7.2f} err {checks['ours']:.1e}/{checks['vllm']:.1e}"
            + f" host {hosts['ours']:6.1f}/{hosts['vllm']:6.1f}",
            flush=True,
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="ranks 16 only, T in {1, 64, 1024}")
    parser.add_argument("--json", type=Path, help="write every row here")
    parser.add_argument("--peer", type=Path, default=VP.DEFAULT_DIR)
    parser.add_argument("--dry", action="store_true", help="CPU under TRITON_INTERPRET=1, tiny shapes, fp16")
    args = parser.parse_args()
    errors = VP.load(args.peer)
    if any(op.startswith("lora") for op in errors):
        raise SystemExit(f"vLLM's LoRA kernels did not load: {errors}")
    device = torch.device("cpu" if args.dry else "cuda")
    bw = 1e10 if args.dry else copy_bandwidth(device)
    name = "cpu (dry)" if args.dry else torch.cuda.get_device_name()
    print(f"{name}  copy bandwidth {bw / 1e9:.0f} GB/s  torch {torch.__version__}", flush=True)
    old = _load_old()
    gen = torch.Generator().manual_seed(0)
    ranks = (16,) if args.quick or args.dry else (16, 64)
    token_counts = (1, 9) if args.dry else (1, 64, 1024) if args.quick else (1, 8, 64, 256, 1024)
    dtype = torch.float16 if args.dry else torch.bfloat16  # the interpreter's bf16 dot is not the devices'
    shape = SHAPES["dry" if args.dry else "gpu"]
    rows = []
    for layout in ("decode", "prefill"):
        for rank in ranks:
            for tokens in token_counts:
                if layout == "prefill" and tokens < SLOTS:
                    continue
                rows.extend(bench_case(layout, tokens, rank, dtype, bw, old, gen, device, shape))
    wins = sum(r["x_vs_vllm"] >= 1.0 for r in rows)
    print(f"ours faster or equal in {wins}/{len(rows)} rows; min x{min(r['x_vs_vllm'] for r in rows):.2f}")
    if args.json:
        args.json.write_text(json.dumps({"device": name, "copy_bw": bw, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
