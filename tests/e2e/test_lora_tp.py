"""Multi-LoRA over two tensor-parallel ranks: PEFT adapters on tiny Qwen3, one engine over TP=2 through vLLM's
multiprocess executor (gloo), a mixed base + adapters batch token for token equal to HF + PEFT in fp32.

vLLM's LoRA layers slice A and B per rank: by default (``fully_sharded_loras=False``) column-parallel layers
slice B by output, row-parallel ones A by input (their partial sums all-reduced with the base layer's);
``fully_sharded_loras=True`` (S-LoRA) also slices the column layers' A by rank (the shrunk rows all-gathered)
and the row layers' B by output (added at the rank's offset before the all-reduce). The fully sharded case
also runs compiled FULL_AND_PIECEWISE graphs (on the V1 runner: Model Runner V2's capture goes through vLLM's
``graph_capture``, which takes only CUDA / XPU communicators), its collectives inside the compiled pieces;
``test_lora_graphs.py`` shows the replays themselves in one process.
"""

from __future__ import annotations

import pytest

from tests.e2e.lora_adapters import MAX_LORA_RANK

from .distributed import run_case

#: Two adapters: attention layers (QKV column-parallel, o_proj row-parallel) at rank 8; every layer at rank 4.
NAMES = ("attn-r8", "all-r4")


@pytest.mark.parametrize(
    "options",
    [
        {"fully_sharded_loras": False, "enforce_eager": True},
        {
            "fully_sharded_loras": True,
            "compilation_config": {
                "mode": 3,
                "cudagraph_mode": "FULL_AND_PIECEWISE",
                "cudagraph_capture_sizes": [1, 2, 4],
            },
        },
    ],
    ids=["sharded-eager", "fully-sharded-graphs"],
)
def test_lora_over_two_tp_ranks_equals_hf_peft(
    tiny_qwen3, qwen3_lora_adapters, qwen3_lora_hf_tokens, qwen3_prompts, options, tmp_path
):
    ids = {name: i + 1 for i, name in enumerate(NAMES)}
    prompts, requests, expected = [], [], []
    for i, prompt in enumerate(qwen3_prompts):
        for name in (None, *NAMES):
            prompts.append(prompt)
            requests.append(None if name is None else (name, ids[name], str(qwen3_lora_adapters[name])))
            expected.append(qwen3_lora_hf_tokens[name][i])
    env = {"VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache"), "VLLM_DISABLE_COMPILE_CACHE": "1"}
    graphs = "compilation_config" in options
    if graphs:
        env["VLLM_USE_V2_MODEL_RUNNER"] = "0"
    result, output = run_case(
        tiny_qwen3,
        prompts,
        env=env,
        lora_requests=requests,
        tensor_parallel_size=2,
        enable_lora=True,
        max_loras=2,
        max_lora_rank=MAX_LORA_RANK,
        max_num_seqs=4,
        **options,
    )
    workers = result["workers"]
    assert sorted(w[3] for w in workers) == [0, 1] and len({w[1] for w in workers}) == 2, workers
    for request, want, have in zip(requests, expected, result["tokens"], strict=True):
        assert have == want, f"adapter {request and request[0]}"
    assert "Traceback" not in output, output[-6000:]
    assert output.count("Captured graphs (FULL_AND_PIECEWISE)") == (2 if graphs else 0)  # on each rank
