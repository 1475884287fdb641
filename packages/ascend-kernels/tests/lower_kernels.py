"""Lower every Triton kernel launch of ``vllm_ascend.kernels`` to Triton IR for a GPU target, on a
machine without one. Run as a script (``test_lowering.py`` does, in a fresh process), never under
``TRITON_INTERPRET=1``: the interpreter accepts code the compiler rejects (non-constexpr globals,
a loop-carried value changing type), which the CPU tests would otherwise only find on a GPU.

Each public op and the warm-up run on cpu tensors with the Triton path forced and launches
intercepted: a launch is lowered through Triton's front end (``ASTSource.make_ir``, the stage
that type-checks the kernel) for ``GPUTarget("cuda", 90, 32)`` instead of running. Kernel outputs
are therefore never written; the wrappers only read their inputs. Prints one line per distinct
(kernel, signature, constexprs) lowered and exits 1 if any fails or a kernel is never launched.

With ``--sass`` each launch is instead compiled to a cubin for ``sm_90`` (Triton's wheel carries
``ptxas`` and ``cuobjdump``, so no GPU is needed) with the divisibility hints a real launch gets, and
one line per launch gives its instruction count, register spills (local stores/loads), shared
memory, layout conversions left in the TTGIR and the instruction mix of its loops: what to look at
before spending device time on a kernel's speed.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import re
import subprocess
import sys
import traceback
from pathlib import Path

if os.environ.get("TRITON_INTERPRET") == "1":
    raise SystemExit("run without TRITON_INTERPRET=1: the interpreter skips the compiler front end")

import torch
import triton
from triton._C.libtriton import ir
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import CUDABackend
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction

import vllm_ascend.kernels as K
import vllm_ascend.kernels._backend as backend_choice
from vllm_ascend.kernels import _geometry
from vllm_ascend.kernels._triton import lora as triton_lora

TARGET = GPUTarget("cuda", 90, 32)
BACKEND = CUDABackend(TARGET)
_DTYPES = {
    torch.float64: "fp64",
    torch.float32: "fp32",
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
    torch.int64: "i64",
    torch.int32: "i32",
    torch.int16: "i16",
    torch.int8: "i8",
    torch.uint8: "u8",
    torch.uint64: "u64",
    torch.bool: "i1",
}
lowered: dict[tuple, str | None] = {}
SASS = "--sass" in sys.argv
CUOBJDUMP = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
_ADDRESS = re.compile(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?);")


def _arg_type(value) -> str:
    if isinstance(value, torch.Tensor):
        return "*" + _DTYPES[value.dtype]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -(2**31) <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"unsupported kernel argument {value!r}")


def _lower(fn: JITFunction, args: tuple, kwargs: dict) -> None:
    names = [p.name for p in fn.params]
    bound = dict(zip(names, args, strict=False)) | {k: v for k, v in kwargs.items() if k in names}
    signature, constexprs = {}, {}
    for param in fn.params:
        value = bound[param.name]
        if param.is_constexpr or value is None:
            signature[param.name] = "constexpr"
            constexprs[param.name] = value
        else:
            signature[param.name] = _arg_type(value)
    warps = kwargs.get("num_warps", 4)
    key = (fn.__name__, tuple(signature.items()), tuple((k, repr(v)) for k, v in constexprs.items()), warps)
    if key in lowered:
        return
    try:
        if SASS:
            lowered[key] = None
            print(_sass_report(fn, signature, constexprs, bound, warps), flush=True)
            return
        options = BACKEND.parse_options({"num_warps": warps})
        context = ir.context()
        ir.load_dialects(context)
        BACKEND.load_dialects(context)
        ASTSource(fn=fn, signature=signature, constexprs=constexprs).make_ir(
            TARGET, options, BACKEND.get_codegen_implementation(options), BACKEND.get_module_map(), context
        )
        lowered[key] = None
    except Exception as exc:  # every failure is reported with its kernel and constexprs
        lowered[key] = f"{type(exc).__name__}: {exc}"


def _sass_report(fn: JITFunction, signature: dict, constexprs: dict, bound: dict, warps: int) -> str:
    """Compile for sm_90 and summarise the SASS (pointers and multiples of 16 marked divisible by
    16, as Triton's launcher specialises them)."""
    names = list(signature)
    attrs = {
        (i,): [["tt.divisibility", 16]]
        for i, name in enumerate(names)
        if signature[name].startswith("*")
        or (signature[name] in ("i32", "i64") and int(bound[name]) % 16 == 0 and bound[name])
    }
    src = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    kernel = triton.compile(src, target=TARGET, options={"num_warps": warps})
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"{fn.__name__}.cubin"
    path.write_bytes(kernel.asm["cubin"])
    dump = subprocess.run([str(CUOBJDUMP), "-sass", str(path)], capture_output=True, text=True, check=True)
    code = [(int(m.group(1), 16), m.group(2)) for m in map(_ADDRESS.match, dump.stdout.splitlines()) if m]
    ops = [re.sub(r"^@!?U?P\w+\s+", "", text).split()[0] for _, text in code]
    loops = []
    for addr, text in code:
        target = re.search(r"BRA (0x[0-9a-f]+)", text)
        if target and int(target.group(1), 16) < addr:
            body = [
                o.split(".")[0]
                for (a, _), o in zip(code, ops, strict=True)
                if int(target.group(1), 16) <= a <= addr
            ]
            mix = sorted({o: body.count(o) for o in body}.items(), key=lambda kv: -kv[1])[:6]
            loops.append(f"{len(body)} [{' '.join(f'{o}:{n}' for o, n in mix)}]")
    spills = sum(op.startswith(("STL", "LDL")) for op in ops)
    return (
        f"{fn.__name__} warps={warps} {constexprs}: {len(code)} instructions, {spills} spill ops, "
        f"smem {kernel.metadata.shared} B, {kernel.asm['ttgir'].count('convert_layout')} layout "
        f"conversions; loops: {'; '.join(loops) or 'none'}"
    )


def _intercept(self, *args, grid, warmup, **kwargs):
    _lower(self, args, kwargs)


def _exercise() -> None:
    """Every public op, with the variants the wrappers compile separately."""
    gen = torch.Generator().manual_seed(0)
    for vocab in (1000, 32000, 151936):
        head_dims = (128, 576) if vocab == 1000 else ()
        results = K.kernel_warmup(
            "cpu", vocab, (torch.float32, torch.bfloat16, torch.float16), head_dims=head_dims
        )
        if not all(results.values()):
            raise RuntimeError(f"warm-up failed outside the lowering: {results}")
    caches = [torch.zeros(2, 12, 4, 2, 8, dtype=torch.bfloat16), torch.zeros(12, 3, 5, dtype=torch.int8)]
    K.zero_kv_blocks(caches, torch.tensor([3, 0, 11]), [1, 0])
    table = torch.randint(0, 1000, (5, 6), generator=gen, dtype=torch.int32)
    req, pos = torch.randint(0, 5, (50,), generator=gen), torch.randint(0, 96, (50,), generator=gen)
    for world, interleave in ((1, 1), (2, 4)):
        K.compute_slot_mapping(table, req, pos, 8, world, 0, interleave)
    for dtype in (torch.float32, torch.bfloat16):
        dim, width = 20, 4
        qsl = torch.tensor([0, 5, 6, 25, 27], dtype=torch.int32)
        weight = torch.randn(dim, width, generator=gen).to(dtype)
        states = torch.randn(6, dim, width - 1, generator=gen).to(dtype)
        lines = torch.tensor([4, 0, -1, 2], dtype=torch.int32)
        for bias, activation in ((torch.randn(dim, generator=gen).to(dtype), "silu"), (None, None)):
            x = torch.randn(dim, 27, generator=gen).to(dtype)
            K.causal_conv1d_fn(
                x, weight, bias, states, qsl, lines, torch.tensor([True, True, False, False]), activation
            )
            for shape in ((4, dim), (4, dim, 3)):
                K.causal_conv1d_update(
                    torch.randn(*shape, generator=gen).to(dtype), states, weight, bias, activation, lines
                )
        a, b = torch.randn(7, 6, generator=gen).to(dtype), torch.randn(7, 6, generator=gen).to(dtype)
        K.fused_gdn_gating(torch.randn(6, generator=gen), a, b, torch.randn(6, generator=gen), 1.0, 20.0)
        q, k = (
            torch.randn(70, 2, 128, generator=gen).to(dtype),
            torch.randn(70, 2, 128, generator=gen).to(dtype),
        )
        v, g = torch.randn(70, 4, 128, generator=gen).to(dtype), -torch.rand(70, 4, generator=gen)
        cu, state = torch.tensor([0, 5, 70], dtype=torch.int32), torch.randn(2, 4, 128, 128, generator=gen)
        for l2norm in (True, False):
            K.chunk_gated_delta_rule(q, k, v, g, torch.rand(70, 4).to(dtype), cu, state, use_qk_l2norm=l2norm)
    blocks = torch.zeros(4, 64, dtype=torch.uint8)
    K.batch_memcpy(
        torch.tensor([blocks[0].data_ptr()], dtype=torch.uint64),
        torch.tensor([blocks[1].data_ptr()], dtype=torch.uint64),
        torch.tensor([64], dtype=torch.int32),
    )
    for dtype in (torch.int32, torch.int64):
        tokens = torch.randint(0, 50, (3, 40), generator=gen, dtype=dtype)
        K.ngram_propose(tokens, torch.tensor([40, 7, 0], dtype=torch.int32), 1, 4, 5, 256)
    loras = torch.tensor([0, -1, 1, 1])
    starts, lens, seg = torch.tensor([0, 1, 2]), torch.tensor([1, 1, 2]), torch.tensor([0, -1, 1])
    for dtype in (torch.float32, torch.bfloat16):
        x, shrunk = torch.randn(4, 96, generator=gen).to(dtype), torch.zeros(4, 16)
        lora_a, lora_b = torch.randn(2, 1, 16, 96).to(dtype), torch.randn(2, 1, 48, 16).to(dtype)
        out = torch.zeros(4, 80, dtype=dtype)
        K.lora_shrink(x, lora_a, shrunk, loras, 0.5)
        K.lora_shrink_segmented(x, lora_a, shrunk, starts, lens, seg, 2, 0.5)
        triton_lora.lora_shrink_tokens(x, lora_a[:, 0], shrunk, loras, 0.5, split_k=2)
        for add_inputs in (True, False):
            K.lora_expand(shrunk, lora_b, out, loras, 32, add_inputs)
            K.lora_expand_segmented(shrunk, lora_b, out, starts, lens, seg, 2, 0, add_inputs)
        a3 = [lora_a, lora_a.clone(), lora_a.clone()]
        b3 = [lora_b, lora_b[:, :, :16].clone(), lora_b[:, :, :16].clone()]
        stacked = torch.zeros(3, 4, 16)
        K.lora_shrink_slices(x, a3, stacked, loras, 0.5)
        K.lora_shrink_segmented_slices(x, a3, stacked, starts, lens, seg, 2, 0.5)
        triton_lora.lora_shrink_tokens_slices(x, tuple(a[:, 0] for a in a3), stacked, loras, 0.5, split_k=2)
        K.lora_expand_slices(stacked, b3, out, loras, [0, 48, 64], True)
        K.lora_expand_segmented_slices(stacked, b3, out, starts, lens, seg, 2, [0, 48, 64], True)


def main() -> int:
    JITFunction.run = _intercept
    backend_choice.use_triton = lambda device: True
    # The cpu tensors stand for a CUDA device of 32 SMs: warps passed and CUDA splits, as launched there.
    _geometry.geometry = lambda device: _geometry.LaunchGeometry("cuda", 32)
    _exercise()
    from vllm_ascend.kernels import _triton

    modules = [
        importlib.import_module(f"{_triton.__name__}.{m.name}")
        for m in pkgutil.iter_modules(_triton.__path__)
    ]
    defined = {
        name
        for module in modules
        for name, obj in vars(module).items()
        if isinstance(obj, JITFunction) and name.endswith("_kernel")
    }
    failed = {k: err for k, err in lowered.items() if err}
    for (name, _, constexprs, warps), err in sorted(lowered.items()):
        if SASS and not err:
            continue
        print(
            f"{'FAIL' if err else 'ok  '} {name} warps={warps} {dict(constexprs)}"
            + (f"\n     {err}" if err else "")
        )
    missing = defined - {name for name, *_ in lowered}
    if missing:
        print(f"never launched: {sorted(missing)}")
    print(f"{len(lowered)} launches lowered, {len(failed)} failed, {len(defined)} kernels defined")
    return 1 if failed or missing else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:
        traceback.print_exc()
        sys.exit(2)
