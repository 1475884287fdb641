"""Quantized linear layers on the reference device vs float linear, the ModelSlim exporter, and export quality.

Three parts, one run:

- linear: for each scheme (W8A8, W8A8_DYNAMIC, W8A16, W4A16 group 32, W4A8_DYNAMIC) a layer is built
  the way the ``ascend`` method builds one: ``get_scheme_class(type, "linear")``, its ``weight_specs``,
  tensors from the exporter's ``quantize_linear`` in a ``torch.nn.Module``, ``process_weights``, then
  ``apply`` is timed against ``torch.nn.functional.linear`` on the same fp32 input at decode
  (M = 1, 8, 32 tokens) and prefill (M = 512, 2048) shapes for K = N in {1024, 4096}. The reference
  device is an executable spec in plain PyTorch (integer products as int32 matmuls on the CPU), so the
  figures are the cost of that spec, not NPU speed. Each cell: one warm-up call, then the median of up
  to ``--repeats`` calls within ~2 s, the float peer and the schemes called in turn (a warm-up slower
  than that is the only sample); ``--threads`` torch threads (default 1: on a shared box a 2-thread
  region can wait a whole scheduler slice for its second thread).
- export: ``export_modelslim`` of a synthetic Qwen3 checkpoint (random weights, ~150 MB fp32) per scheme,
  in MB/s (10^6 bytes) of source tensors, best of two exports; static W8A8 includes its calibration forward.
- quality: the tiny Qwen3 and Qwen3-MoE test models exported with each scheme and run by the independent
  fake-quant oracle (``tests/e2e/quant_oracle.py``): perplexity on held-out sentences vs the float model,
  and agreement of 3 prompts x 16 greedy tokens.

Run: ``uv run --no-sync python benchmarks/quant.py [--quick] [--write benchmarks/RESULTS-quant.md]``.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import importlib.util
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import cast

import torch
import torch.nn.functional as F
from _report import machine, write_measured_table

from vllm_ascend.core.device.config import clear_device_caches, get_device_adaptor, get_device_config
from vllm_ascend.quant.export import (
    DEFAULT_GROUP_SIZE,
    MOE_SCHEMES,
    SCHEMES,
    export_modelslim,
    quantize_linear,
)
from vllm_ascend.quant.schemes import AscendLinearScheme, get_scheme_class
from vllm_ascend.testing.tiny_models import build_tiny_model, corpus, qwen3_moe_spec, qwen3_spec

ROOT = Path(__file__).resolve().parent.parent
ORACLE_PATH = ROOT / "tests" / "e2e" / "quant_oracle.py"
DECODE_M = (1, 8, 32)
PREFILL_M = (512, 2048)
SIZES = (1024, 4096)
QUICK_M = (1, 32, 512)
QUICK_SIZES = (1024,)
CELL_BUDGET_S = 2.0
GREEDY_PROMPTS = ("the quick model reads", "river mountain forest", "a kernel computes the attention")
GREEDY_TOKENS = 16
HELD_OUT_SENTENCES = 4
HELD_OUT_SEED = 1234
EXPORT_REPEATS = 2
FLOAT_ROW = "float `F.linear`"


def _timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def interleaved_medians(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, tuple[float, int]]:
    """Median wall seconds of each of ``fns`` and how many calls were timed, the calls taken in rounds.

    Each function gets a warm-up call (kept as its only sample when slower than ``CELL_BUDGET_S``), then
    the functions are called in turn, round after round, each until it has ``repeats`` samples or spent
    ``CELL_BUDGET_S``: a burst of load on the shared box then slows the float peer and the schemes alike.
    """
    samples: dict[str, list[float]] = {}
    for name, fn in fns.items():
        warmup = _timed(fn)
        samples[name] = [warmup] if warmup > CELL_BUDGET_S else []
    while True:
        active = [
            name
            for name, times in samples.items()
            if not times or (len(times) < repeats and sum(times) < CELL_BUDGET_S)
        ]
        if not active:
            return {name: (statistics.median(times), len(times)) for name, times in samples.items()}
        for name in active:
            samples[name].append(_timed(fns[name]))


def quantized_layer(
    scheme_name: str, weight: torch.Tensor, calibration: torch.Tensor
) -> tuple[AscendLinearScheme, torch.nn.Module]:
    """A module holding ``weight`` exported as ``scheme_name`` after the scheme's ``process_weights``.

    Static W8A8 takes its activation range from ``calibration`` (as the exporter's calibration would).
    """
    out_features, in_features = weight.shape
    group = DEFAULT_GROUP_SIZE.get(scheme_name, 0)
    cls = cast(type[AscendLinearScheme], get_scheme_class(scheme_name, "linear"))
    scheme = cls(prefix=f"bench.{scheme_name}", group_size=group or None, params_dtype=torch.float32)
    act_range = (float(calibration.min()), float(calibration.max())) if scheme_name == "W8A8" else None
    tensors = quantize_linear(f"bench.{scheme_name}.weight", weight, scheme_name, group, act_range)
    specs = scheme.weight_specs(out_features, in_features)
    if set(specs) != set(tensors):
        raise RuntimeError(f"{scheme_name}: exporter wrote {sorted(tensors)}, scheme expects {sorted(specs)}")
    layer = torch.nn.Module()
    for name, value in tensors.items():
        layer.register_parameter(name, torch.nn.Parameter(value, requires_grad=False))
    scheme.process_weights(layer)
    return scheme, layer


def layer_bytes(layer: torch.nn.Module) -> int:
    """Bytes of every parameter ``layer`` keeps.

    Not counted: the reference device's cached int8 unpack of an int4-packed weight (``cached_int8_weight``),
    host memory of the plain-PyTorch spec that cannot compute on packed int4; an NPU reads the packed weight.
    """
    return sum(p.numel() * p.element_size() for p in layer.parameters())


def linear_tables(sizes: tuple[int, ...], tokens: tuple[int, ...], repeats: int) -> list[str]:
    """The latency table (one row per K, M, scheme) and the weight-bytes table (one row per K, scheme)."""
    latency = [
        "| K = N | M | linear | median ms | tokens/s | vs float | rel. error vs float | calls |",
        "|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    memory = ["| K = N | scheme | weight bytes | vs fp32 |", "|---:|---|---:|---:|"]
    g = torch.Generator().manual_seed(0)
    for size in sizes:
        weight = torch.randn(size, size, generator=g) * 0.02
        calibration = torch.randn(64, size, generator=g)
        layers = {name: quantized_layer(name, weight, calibration) for name in SCHEMES}
        fp32_bytes = weight.numel() * weight.element_size()
        memory.append(f"| {size} | float (fp32) | {fp32_bytes:,} | 100% |")
        for name, (_, layer) in layers.items():
            n = layer_bytes(layer)
            memory.append(f"| {size} | {name} | {n:,} | {n / fp32_bytes:.1%} |")
        for m in tokens:
            x = torch.randn(m, size, generator=g)
            reference = F.linear(x, weight)
            fns: dict[str, Callable[[], object]] = {FLOAT_ROW: functools.partial(F.linear, x, weight)}
            for name, (scheme, layer) in layers.items():
                fns[name] = functools.partial(scheme.apply, layer, x)
            timings = interleaved_medians(fns, repeats)
            float_s = timings[FLOAT_ROW][0]
            for name, (seconds, calls) in timings.items():
                if name == FLOAT_ROW:
                    error = 0.0
                else:
                    scheme, layer = layers[name]
                    error = float((scheme.apply(layer, x) - reference).norm() / reference.norm())
                latency.append(
                    f"| {size} | {m} | {name} | {seconds * 1e3:.3f} | {m / seconds:,.0f} | "
                    f"{seconds / float_s:.2f}x | {error:.2e} | {calls} |"
                )
            print(f"linear K=N={size} M={m} done", flush=True)
    return [
        *latency,
        "",
        "Weight bytes per layer after `process_weights` (every parameter the layer keeps; the reference "
        "device's cached int8 unpack of int4 weights is spec-only host memory and not counted):",
        "",
        *memory,
    ]


def export_table(root: Path, layers: int) -> list[str]:
    """Export a synthetic Qwen3 checkpoint (hidden 1024, intermediate 3072, ``layers`` layers) per scheme."""
    spec = qwen3_spec(
        hidden_size=1024,
        intermediate_size=3072,
        num_layers=layers,
        num_heads=8,
        num_kv_heads=4,
        head_dim=128,
        init_std=0.02,
        seed=5,
    )
    src = build_tiny_model(spec, root=root / "src")
    size = sum(p.stat().st_size for p in src.glob("*.safetensors"))
    rows = [
        f"Source: synthetic Qwen3, {layers} layers, hidden 1024, intermediate 3072, vocab {spec.vocab_size}, "
        f"fp32, {size / 1e6:.1f} MB of safetensors.",
        "",
        "| scheme | seconds | MB/s of source | output tensor MB | output / source |",
        "|---|---:|---:|---:|---:|",
    ]
    for scheme in SCHEMES:
        report = min(
            (
                export_modelslim(src, root / f"out-{scheme}", scheme, progress=False, overwrite=True)
                for _ in range(EXPORT_REPEATS)
            ),
            key=lambda r: r.seconds,
        )
        rows.append(
            f"| {scheme}{' (incl. calibration)' if scheme == 'W8A8' else ''} | {report.seconds:.2f} | "
            f"{report.throughput_mb_s:.1f} | {report.bytes_out / 1e6:.1f} | {report.bytes_out / report.bytes_in:.1%} |"
        )
        print(f"export {scheme}: {report.summary()}", flush=True)
    return rows


def load_oracle_module() -> ModuleType:
    """``tests/e2e/quant_oracle.py`` by path (``tests`` is not a package)."""
    spec = importlib.util.spec_from_file_location("quant_oracle", ORACLE_PATH)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load the oracle from {ORACLE_PATH}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def mean_perplexity(model, sentences: list[list[int]]) -> float:
    """Geometric mean of the per-sentence perplexities."""
    return math.exp(statistics.fmean(math.log(model.perplexity(ids)) for ids in sentences))


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens of ``a`` and ``b`` are equal."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a))


def quality_table(root: Path, kinds: tuple[str, ...]) -> list[str]:
    """Per tiny model and scheme: oracle perplexity and greedy agreement, quantized vs float."""
    from transformers import AutoTokenizer

    oracle = load_oracle_module()
    specs = {"qwen3": qwen3_spec(), "qwen3_moe": qwen3_moe_spec()}
    total = len(GREEDY_PROMPTS) * GREEDY_TOKENS
    rows = [
        f"| model | scheme | experts | ppl float | ppl quantized | delta | greedy prefix equal (of {total}) | "
        f"same position (of {total}) | prompts identical (of {len(GREEDY_PROMPTS)}) |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for kind in kinds:
        src = build_tiny_model(specs[kind])
        tokenizer = AutoTokenizer.from_pretrained(src)
        sentences = [tokenizer(s)["input_ids"] for s in corpus(HELD_OUT_SENTENCES, seed=HELD_OUT_SEED)]
        prompts = [tokenizer(p)["input_ids"] for p in GREEDY_PROMPTS]
        reference = oracle.load_oracle(src)
        ppl_float = mean_perplexity(reference, sentences)
        float_tokens = [reference.greedy(p, GREEDY_TOKENS) for p in prompts]
        for scheme in SCHEMES:
            dst = root / f"{kind}-{scheme}"
            export_modelslim(src, dst, scheme, progress=False)
            model = oracle.load_oracle(dst)
            ppl = mean_perplexity(model, sentences)
            tokens = [model.greedy(p, GREEDY_TOKENS) for p in prompts]
            same = sum(
                a == b for f, q in zip(float_tokens, tokens, strict=True) for a, b in zip(f, q, strict=True)
            )
            prefix = sum(common_prefix(f, q) for f, q in zip(float_tokens, tokens, strict=True))
            identical = sum(f == q for f, q in zip(float_tokens, tokens, strict=True))
            experts = "-" if kind == "qwen3" else ("quantized" if scheme in MOE_SCHEMES else "FLOAT")
            rows.append(
                f"| {kind} | {scheme} | {experts} | {ppl_float:.1f} | {ppl:.1f} | {(ppl / ppl_float - 1):+.2%} | "
                f"{prefix} | {same} | {identical} |"
            )
            print(
                f"quality {kind} {scheme}: ppl {ppl_float:.2f} -> {ppl:.2f}, prefix {prefix}/{total}",
                flush=True,
            )
    return [
        f"Held-out: {HELD_OUT_SENTENCES} sentences of the tiny models' word corpus (seed {HELD_OUT_SEED}, "
        f"not the tokenizer's training seed); greedy: prompts {', '.join(repr(p) for p in GREEDY_PROMPTS)}, "
        f"{GREEDY_TOKENS} tokens each; vocab {specs['qwen3'].vocab_size}.",
        "",
        *rows,
    ]


def machine_line(load_at_start: float) -> str:
    config = get_device_config()
    return (
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC; {machine()}, Python {platform.python_version()}; "
        f"load average {load_at_start:.1f} at the start and {os.getloadavg()[0]:.1f} at the end; "
        f"{torch.get_num_threads()} torch thread(s); device: {config.describe()} "
        f"({type(get_device_adaptor()).__name__})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="K = N = 1024 only, M in 1/32/512, a 1-layer export"
    )
    parser.add_argument(
        "--repeats", type=int, default=5, help="timed calls per cell at most (default: %(default)s)"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (default: %(default)s; on a shared box a 2-thread parallel region can wait "
        "a whole scheduler slice for its second thread)",
    )
    parser.add_argument("--write", type=Path, help="also write the tables into this markdown file")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    os.environ["VLLM_ASCEND_DEVICE"] = "reference"
    clear_device_caches()
    sizes, tokens = (QUICK_SIZES, QUICK_M) if args.quick else (SIZES, (*DECODE_M, *PREFILL_M))
    started, load = time.perf_counter(), os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="quant-bench-") as tmp:
        linear = linear_tables(sizes, tokens, args.repeats)
        export = export_table(Path(tmp) / "export", 1 if args.quick else 3)
        quality = quality_table(Path(tmp) / "quality", ("qwen3", "qwen3_moe"))
    lines = [
        machine_line(load)
        + f"; whole run {time.perf_counter() - started:.0f} s"
        + (" (--quick)" if args.quick else ""),
        "",
        "### Linear: reference device vs `torch.nn.functional.linear` (fp32 activations)",
        "",
        *linear,
        "",
        "### Exporter throughput",
        "",
        *export,
        "",
        "### Quality on the tiny test models (fake-quant oracle, float64)",
        "",
        *quality,
    ]
    print("\n".join(lines))
    if args.write is not None:
        write_measured_table(args.write, "\n".join(lines))


if __name__ == "__main__":
    main()
