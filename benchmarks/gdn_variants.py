"""Variants of the Triton chunked gated delta rule beside main's kernel and vLLM's FLA, in one process, interleaved.

A variant is main's ``vllm_ascend/kernels/_triton/gated_delta_rule.py`` with a patch applied (``NAME=FILE.patch``,
a one-file patch as ``git diff`` writes it) or a module file of the same interface (``NAME=FILE.py``), optionally
with module constants overridden (``NAME=FILE:ATTR=VALUE,...``, values as Python literals)::

    python benchmarks/gdn_variants.py --variant mine=my.patch --variant "bv128=my.patch:BV_CAP={'cuda':128}" [--rounds 2]
    TRITON_INTERPRET=1 python benchmarks/gdn_variants.py --dry --variant bf16=...   # the script itself, on CPU
    python benchmarks/gdn_variants.py --kernels ...   # also where each side's GPU time goes, kernel by kernel

Run from the repository root on a CUDA machine with torch and triton (vLLM not needed); FLA joins when vLLM's files
are staged (``python benchmarks/vllm_peer.py stage``) and ``.peer`` is carried. Shapes: Qwen3-Next's GDN (16 key /
32 value heads of 128, bf16, float32 states, q/k l2-normalised), one long prompt, a few and many sequences.
Timing: ``kernels.py``'s method (median GPU µs of a call, L2 flushed, the GPU kept busy while the host enqueues),
the sides interleaved for ``--rounds`` rounds, the best kept. Errors: against the float32 torch reference, as max
|diff| / max |reference| and mean |diff| of the outputs, and max |diff| / max |reference| of the final states.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import re
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch

ROOT = Path(__file__).resolve().parents[1]
for src in ("packages/ascend-kernels/src", "packages/ascend-core/src", "benchmarks"):
    if str(ROOT / src) not in sys.path:
        sys.path.insert(0, str(ROOT / src))

import vllm_peer as VP  # noqa: E402
from kernels import GDN_SHAPES, bench, gdn_errors, gdn_inputs  # noqa: E402

from vllm_ascend.kernels import gated_delta_rule as G  # noqa: E402
from vllm_ascend.kernels._triton import gated_delta_rule as MAIN  # noqa: E402

MODULE = Path(MAIN.__file__)
SHAPES = {"gpu": GDN_SHAPES, "dry": ((1, 130), (3, 200))}
HEADS = {"gpu": (16, 32, 128), "dry": (2, 4, 32)}  # key heads, value heads, head size


def _parse_variant(spec: str) -> tuple[str, Path, dict[str, object]]:
    name, sep, rest = spec.partition("=")
    if not sep or not name or not rest:
        raise SystemExit(f"--variant {spec!r}: expected NAME=FILE(.patch|.py)[:ATTR=VALUE,...]")
    path, _, overrides = rest.partition(":")
    attrs: dict[str, object] = {}
    for item in filter(None, overrides.split(",")):
        attr, eq, value = item.partition("=")
        if not eq:
            raise SystemExit(f"--variant {spec!r}: override {item!r} is not ATTR=VALUE")
        attrs[attr] = ast.literal_eval(value)
    if not Path(path).is_file() or Path(path).suffix not in (".patch", ".py"):
        raise SystemExit(f"--variant {spec!r}: {path} is not an existing .patch or .py file")
    return name, Path(path), attrs


def apply_patch(original: str, patch: str) -> str:
    """``original`` with the hunks of a one-file unified diff applied, each where its context matches exactly
    (hunks in order, shifted by the lines earlier hunks added or removed); a mismatch is an error."""
    lines = original.splitlines(keepends=True)
    out: list[str] = []
    at = 0  # next unconsumed line of ``original``
    hunks = re.split(r"(?m)^@@ ", patch)[1:]
    if not hunks:
        raise ValueError("no hunks in the patch")
    for hunk in hunks:
        header, _, body = hunk.partition("\n")
        start = int(header.split()[0].lstrip("-").split(",")[0]) - 1
        old: list[str] = []
        new: list[str] = []
        for line in body.splitlines(keepends=True):
            if line.startswith("diff --git") or line.startswith("--- ") or line.startswith("+++ "):
                break
            tag, text = line[:1], line[1:]
            if tag == "\\":  # "\ No newline at end of file"
                continue
            if tag in (" ", "-"):
                old.append(text)
            if tag in (" ", "+"):
                new.append(text)
        if start < at or lines[start : start + len(old)] != old:
            raise ValueError(f"hunk @@ {header.split('@@')[0].strip()} @@ does not match the file")
        out.extend(lines[at:start])
        out.extend(new)
        at = start + len(old)
    out.extend(lines[at:])
    return "".join(out)


def load_variant(name: str, path: Path, attrs: dict[str, object], workdir: Path) -> ModuleType:
    """Main's kernel module with ``path`` applied (a patch) or ``path`` itself (a module), as module ``name``."""
    source = path
    if path.suffix == ".patch":
        source = workdir / f"{name}.py"
        try:
            source.write_text(apply_patch(MODULE.read_text(), path.read_text()))
        except ValueError as exc:
            raise SystemExit(f"variant {name}: {path} does not apply to {MODULE}: {exc}") from exc
    spec = importlib.util.spec_from_file_location(f"gdn_variant_{name}", source)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for attr, value in attrs.items():
        if not hasattr(module, attr):
            raise SystemExit(f"variant {name}: the module has no {attr} to override")
        setattr(module, attr, value)
    return module


def kernel_times(fn: Callable[[], object], calls: int = 5) -> dict[str, float]:
    """GPU µs per call of each kernel ``fn`` launches (torch's profiler, warm, L2 not flushed): where a side's
    time goes."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    times = {e.key: e.self_device_time_total / calls for e in prof.key_averages()}
    return {name: us for name, us in sorted(times.items(), key=lambda kv: -kv[1]) if us > 0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--variant", action="append", default=[], help="NAME=FILE(.patch|.py)[:ATTR=VALUE,...]"
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=Path, help="write every row here")
    parser.add_argument("--peer", type=Path, default=VP.DEFAULT_DIR)
    parser.add_argument("--dry", action="store_true", help="CPU under TRITON_INTERPRET=1, tiny shapes, fp32")
    parser.add_argument(
        "--kernels", action="store_true", help="also each side's GPU µs per kernel (profiler)"
    )
    args = parser.parse_args()
    kind = "dry" if args.dry else "gpu"
    device = torch.device("cpu" if args.dry else "cuda")
    dtype = torch.float32 if args.dry else torch.bfloat16
    peer = not args.dry and args.peer.exists() and not VP.load(args.peer).get("gdn_chunk")
    with tempfile.TemporaryDirectory() as tmp:
        variants = {"main": MAIN}
        for spec in args.variant:
            name, path, attrs = _parse_variant(spec)
            if name in variants or name == "fla":
                raise SystemExit(f"--variant {spec!r}: the name {name!r} is taken")
            variants[name] = load_variant(name, path, attrs, Path(tmp))

        def timed(fn: Callable[[], object]) -> float:
            return 0.0 if args.dry else bench(fn, reps=30)

        print(
            f"{'cpu (dry)' if args.dry else torch.cuda.get_device_name()}  torch {torch.__version__}",
            flush=True,
        )
        key_heads, value_heads, head = HEADS[kind]
        gen = torch.Generator().manual_seed(0)
        cases = []
        for seqs, total in SHAPES[kind]:
            inputs = gdn_inputs(seqs, total, key_heads, value_heads, head, dtype, device, gen)
            q, k, v, g, beta, cu, init = inputs
            ref = G.chunk_gated_delta_rule_torch(*inputs)
            sides: dict[str, Callable[[], tuple[torch.Tensor, torch.Tensor]]] = {
                name: (lambda mod=mod, a=inputs: mod.chunk_gated_delta_rule(*a))
                for name, mod in variants.items()
            }
            errors = {name: gdn_errors(fn(), ref) for name, fn in sides.items()}
            if peer:
                fla_in = (
                    q,
                    k,
                    v,
                    g,
                    beta,
                    cu,
                    init.transpose(-1, -2).contiguous(),
                    VP.vllm_gdn_chunk_metadata(cu),
                )
                sides["fla"] = lambda a=fla_in: VP.vllm_chunk_gated_delta_rule(*a)
                out, state = sides["fla"]()
                errors["fla"] = gdn_errors((out, state.transpose(-1, -2)), ref)
            print(f"T{total} N{seqs} errors: {json.dumps(errors)}", flush=True)
            cases.append({"seqs": seqs, "tokens": total, "errors": errors, "sides": sides, "us": {}})
        for r in range(args.rounds):
            for case in cases:
                for name, fn in case["sides"].items():
                    us = timed(fn)
                    case["us"][name] = min(case["us"].get(name, float("inf")), us)
                    print(f"round {r} T{case['tokens']} N{case['seqs']} {name}: {us:.1f} us", flush=True)
        if args.kernels and not args.dry:
            for case in cases:
                case["kernels"] = {name: kernel_times(fn) for name, fn in case["sides"].items()}
                for name, times in case["kernels"].items():
                    top = ", ".join(f"{k[:48]} {us:.1f}" for k, us in list(times.items())[:8])
                    print(f"kernels T{case['tokens']} N{case['seqs']} {name}: {top}", flush=True)
    names = list(cases[0]["sides"])
    print(
        "\n| shape | "
        + " | ".join(f"{n} µs" for n in names)
        + " | "
        + " | ".join(f"main / {n}" for n in names[1:])
        + " |"
    )
    print("|---|" + "---:|" * (2 * len(names) - 1))
    for case in cases:
        us = case["us"]
        ratios = [us["main"] / us[n] if us[n] else float("nan") for n in names[1:]]
        print(f"| T{case['tokens']} N{case['seqs']} | " + " | ".join(f"{us[n]:.1f}" for n in names) + " | "
              + " | ".join(f"{x:.2f}" for x in ratios) + " |")  # fmt: skip
    if args.json:
        rows = [{k: c[k] for k in ("seqs", "tokens", "errors", "us", "kernels") if k in c} for c in cases]
        args.json.write_text(json.dumps({"variants": args.variant, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
