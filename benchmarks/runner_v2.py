"""Model Runner V2 vs V1 on the reference device, one run: decode tok/s, batch tok/s, TTFT, engine start.

Sides (each in its own interpreter, alternating per round, best round per metric kept):

- ``v1``: ``VLLM_USE_V2_MODEL_RUNNER=0`` — vLLM's V1 runner (``NPUModelRunner``), synchronous scheduling;
- ``v2``: the runner vLLM selects (V2: ``NPUModelRunnerV2`` on the kernels of ``vllm_ascend.kernels.v2``),
  synchronous scheduling;
- ``v2-async``: V2 with async scheduling (vLLM's default; the NPU families' path).

All serve the same tiny random-weight Qwen3 in fp32, eager (the reference device's default). Metrics as in
``e2e_reference.py``: TTFT = median ``generate(max_tokens=1)`` of single prompts; decode tok/s = one request,
``--out-tokens`` tokens, (tokens - 1) / (time - TTFT); batch tok/s = ``--batch`` prompts at once.

Usage: ``python benchmarks/runner_v2.py [--rounds 3]``; prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

#: side -> (VLLM_USE_V2_MODEL_RUNNER or None for vLLM's choice, async_scheduling)
SIDES: dict[str, tuple[str | None, bool]] = {
    "v1": ("0", False),
    "v2": (None, False),
    "v2-async": (None, True),
}
PROMPT = "river mountain forest ocean cloud rain snow wind stone light shadow morning evening winter summer"
LOWER_IS_BETTER = ("ttft_ms", "engine_start_s")
METRICS = ("ttft_ms", "decode_tok_s", "batch_tok_s", "engine_start_s")


def _measure(model_dir: str, out_tokens: int, batch: int, repeats: int, async_scheduling: bool) -> dict:
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = [tokenizer(f"{PROMPT} {i}")["input_ids"] for i in range(batch)]
    t0 = time.perf_counter()
    llm = LLM(
        model=model_dir,
        dtype="float32",
        max_model_len=512,
        kv_cache_memory_bytes=256 << 20,
        seed=0,
        async_scheduling=async_scheduling,
    )
    start_s = time.perf_counter() - t0
    config = llm.llm_engine.vllm_config

    def run(ps: list[list[int]], n: int) -> tuple[float, int]:
        params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
        t = time.perf_counter()
        outs = llm.generate([{"prompt_token_ids": p} for p in ps], params, use_tqdm=False)
        return time.perf_counter() - t, sum(len(o.outputs[0].token_ids) for o in outs)

    run(prompts, 4)  # warm-up
    ttft = statistics.median(run([prompts[i % batch]], 1)[0] for i in range(repeats))
    single = statistics.median(run([prompts[0]], out_tokens)[0] for _ in range(max(1, repeats // 3)))
    batch_s, batch_tokens = min(run(prompts, out_tokens) for _ in range(max(1, repeats // 3)))
    result = {
        "v2": bool(config.use_v2_model_runner),
        "async": bool(config.scheduler_config.async_scheduling),
        "engine_start_s": start_s,
        "ttft_ms": ttft * 1e3,
        "decode_tok_s": (out_tokens - 1) / max(single - ttft, 1e-9),
        "batch_tok_s": batch_tokens / batch_s,
    }
    llm.llm_engine.engine_core.shutdown()
    return result


def _side(name: str, args: argparse.Namespace, model_dir: str) -> dict:
    runner, async_scheduling = SIDES[name]
    env = {
        **os.environ,
        "VLLM_ASCEND_DEVICE": "reference",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    env.pop("VLLM_USE_V2_MODEL_RUNNER", None)
    if runner is not None:
        env["VLLM_USE_V2_MODEL_RUNNER"] = runner
    argv = [sys.executable, __file__, "--child", "--model-dir", model_dir, "--out-tokens", str(args.out_tokens),
            "--batch", str(args.batch), "--repeats", str(args.repeats)]  # fmt: skip
    if async_scheduling:
        argv.append("--async")
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{name} side failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    result = json.loads(lines[-1].removeprefix("RESULT "))
    want_v2 = runner != "0"
    if result["v2"] != want_v2 or result["async"] != async_scheduling:
        raise RuntimeError(f"{name} side ran v2={result['v2']} async={result['async']}, not what it names")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--out-tokens", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--rounds", type=int, default=3, help="alternating runs per side; best kept")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--async", dest="async_scheduling", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        result = _measure(args.model_dir, args.out_tokens, args.batch, args.repeats, args.async_scheduling)
        print("RESULT " + json.dumps(result), flush=True)
        return

    from vllm_ascend.testing.tiny_models import build_tiny_model, qwen3_spec

    spec = qwen3_spec(hidden_size=args.hidden, intermediate_size=2 * args.hidden, num_layers=args.layers)
    model_dir = str(build_tiny_model(spec))
    rounds: dict[str, list[dict]] = {name: [] for name in SIDES}
    for _ in range(args.rounds):
        for name in SIDES:
            rounds[name].append(_side(name, args, model_dir))
    best = {
        name: {k: (min if k in LOWER_IS_BETTER else max)(r[k] for r in results) for k in METRICS}
        for name, results in rounds.items()
    }
    print(f"model: tiny Qwen3 fp32, hidden {args.hidden}, {args.layers} layers, vocab 512; batch {args.batch} x "
          f"{args.out_tokens} tokens; {os.cpu_count()} CPUs; eager; best of {args.rounds} rounds\n")  # fmt: skip
    print("| metric | V1 | V2 | V2 + async | V2/V1 | V2 async/V1 |")
    print("|---|---:|---:|---:|---:|---:|")
    for key, label in (
        ("ttft_ms", "TTFT, 1 prompt (ms, lower is better)"),
        ("decode_tok_s", "decode tok/s, 1 request"),
        ("batch_tok_s", f"batch tok/s, {args.batch} requests"),
        ("engine_start_s", "engine start (s, lower is better)"),
    ):
        v1, v2, v2a = (best[name][key] for name in SIDES)
        print(f"| {label} | {v1:.1f} | {v2:.1f} | {v2a:.1f} | {v2 / v1:.2f} | {v2a / v1:.2f} |")


if __name__ == "__main__":
    main()
