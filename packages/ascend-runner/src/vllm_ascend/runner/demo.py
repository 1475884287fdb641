"""``vllm-ascend demo``: serve a tiny model through vLLM on the reference device and check it against HF.

Builds (once, cached under the user cache dir) a random-weight model with a locally trained
tokenizer, runs vLLM in-process with the plugin on the reference device, prints the
completions with timings and proof that our platform/worker/runner/ops ran, and compares the
token ids with HF transformers' greedy decoding on the same weights. Exit status 1 on mismatch.
The body runs in a child interpreter so that the device is chosen before vLLM is imported.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path

from vllm_ascend.core.sdk import CliCommand, CliError, run_module

PROMPTS = (
    "the quick ascend kernel",
    "river mountain forest ocean cloud rain snow wind stone light shadow",
    "a small model reads a large batch of tokens and",
    "decode chunk prefix graph stream event memory host tensor vector matrix weight bias scale shape",
)
DEMO_ENV = {
    "VLLM_ASCEND_DEVICE": "reference",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model-kind", choices=("qwen3", "llama"), default="qwen3", help="tiny model family")
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens generated per prompt")
    parser.add_argument("--cache-dir", type=Path, default=None, help="where built models are kept")


def _argv(args: argparse.Namespace) -> list[str]:
    argv = ["--model-kind", args.model_kind, "--max-tokens", str(args.max_tokens)]
    if args.cache_dir is not None:
        argv += ["--cache-dir", str(args.cache_dir)]
    return argv


def _run(args: argparse.Namespace) -> int:
    if args.max_tokens < 1:
        raise CliError(f"--max-tokens={args.max_tokens} is invalid; allowed: a positive integer")
    return run_module("demo", "vllm_ascend.runner.demo", _argv(args), env={**os.environ, **DEMO_ENV})


def hf_greedy_token_ids(model_dir: Path, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """HF transformers' greedy continuation of each prompt on the same weights (float32, the whole context
    recomputed each step, EOS ignored): what the demo's token ids are checked against."""
    import json

    import torch
    import transformers

    architecture = json.loads((model_dir / "config.json").read_text())["architectures"][0]
    model = getattr(transformers, architecture).from_pretrained(model_dir, dtype=torch.float32).eval()
    continuations = []
    with torch.inference_mode():
        for prompt in prompts:
            ids = torch.tensor([prompt], dtype=torch.long)
            for _ in range(max_new_tokens):
                next_id = model(input_ids=ids).logits[0, -1].float().argmax().view(1, 1)
                ids = torch.cat([ids, next_id], dim=1)
            continuations.append(ids[0, len(prompt) :].tolist())
    return continuations


def run_demo(model_kind: str, max_tokens: int, cache_dir: Path | None) -> int:
    """The demo body (expects :data:`DEMO_ENV` to be set before vLLM is imported)."""
    from vllm_ascend.runner.demo_model import build_tiny_model, llama_spec, qwen3_spec

    t0 = time.perf_counter()
    spec = qwen3_spec() if model_kind == "qwen3" else llama_spec()
    model_dir = build_tiny_model(spec, cache_dir / "models" if cache_dir else None)
    t_build = time.perf_counter() - t0
    print(
        f"model     {model_dir}  ({spec.kind}, hidden {spec.hidden_size}, {spec.num_layers} layers; {t_build:.1f}s)"
    )

    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = [tokenizer(p)["input_ids"] for p in PROMPTS]
    t0 = time.perf_counter()
    llm = LLM(model=str(model_dir), dtype="float32", max_model_len=512, block_size=16, seed=0)
    t_start = time.perf_counter() - t0
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    t0 = time.perf_counter()
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    t_gen = time.perf_counter() - t0
    got = [list(o.outputs[0].token_ids) for o in outputs]

    from vllm.platforms import current_platform

    from vllm_ascend.core.sdk import get_device_adaptor, host_isa, loaded_kernel_libraries

    worker = llm.collective_rpc(lambda wrapper: wrapper.worker)[0]
    print(f"platform  {type(current_platform).__qualname__} ({current_platform.get_device_name()})")
    kernels = ", ".join(Path(path).name for path in loaded_kernel_libraries()) or "none mapped"
    print(f"host      {host_isa().describe()}; vLLM kernels {kernels}")
    print(f"worker    {type(worker).__qualname__} / runner {type(worker.model_runner).__qualname__}")
    counts = get_device_adaptor().call_counts
    print("adaptor   " + ", ".join(f"{op}={n}" for op, n in sorted(counts.items())))
    print(f"engine start {t_start:.1f}s; generate {t_gen:.2f}s for {len(prompts)} prompts, "
          f"{sum(map(len, got)) / t_gen:.0f} output tokens/s")  # fmt: skip

    ref = hf_greedy_token_ids(model_dir, prompts, max_tokens)
    mismatches = 0
    for text, out, ids, ref_ids in zip(PROMPTS, outputs, got, ref, strict=True):
        ok = ids == ref_ids
        mismatches += not ok
        print(f"\n[{'MATCH' if ok else 'MISMATCH'}] {text!r}\n  -> {out.outputs[0].text!r}")
        if not ok:
            print(f"  vLLM {ids}\n  HF   {ref_ids}")
    verdict = "identical to" if not mismatches else f"DIFFERENT from ({mismatches} prompts)"
    print("\n(random weights: the text means nothing; the check is on the token ids)")
    print(f"token ids {verdict} HF transformers greedy decoding on the same weights")
    llm.llm_engine.engine_core.shutdown()
    return 1 if mismatches else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vllm_ascend.runner.demo")
    _configure(parser)
    args = parser.parse_args(argv)
    for name, value in DEMO_ENV.items():
        os.environ.setdefault(name, value)
    # vLLM's Triton-override registration scans torch.distributed and trips its deprecation warnings.
    warnings.filterwarnings("ignore", category=FutureWarning, module="vllm.triton_utils.dispatcher")
    return run_demo(args.model_kind, args.max_tokens, args.cache_dir)


DEMO_COMMAND = CliCommand(
    name="demo",
    help="serve a tiny local model through vLLM on the reference device and check it against HF transformers",
    configure=_configure,
    run=_run,
)

if __name__ == "__main__":
    sys.exit(main())
