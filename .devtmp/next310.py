import os, sys
os.environ.update(HF_HUB_OFFLINE="1", VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1", VLLM_ASCEND_DEVICE="reference", VLLM_ASCEND_REFERENCE_FAMILY="310p")
from pathlib import Path
import torch
from vllm_ascend.runner.testing.tiny_models import build_tiny_model, qwen3_next_spec
from vllm_ascend.runner.testing.hf_reference import hf_greedy
root = Path("/tmp/next310"); root.mkdir(exist_ok=True)
model = build_tiny_model(qwen3_next_spec(), root)
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(model)
texts = ["the quick ascend kernel", "river mountain forest ocean cloud rain snow wind stone light shadow morning evening winter summer red green blue"]
prompts = [tok(t)["input_ids"] for t in texts]
hf = hf_greedy(model, prompts, 10, dtype=torch.float16).token_ids
from vllm import LLM, SamplingParams
llm = LLM(model=str(model), dtype="float16", block_size=16, max_model_len=256, kv_cache_memory_bytes=32<<20, seed=0, max_num_batched_tokens=16, max_num_seqs=4)
out = llm.generate([{"prompt_token_ids": p} for p in prompts], SamplingParams(max_tokens=10, temperature=0, ignore_eos=True), use_tqdm=False)
got = [list(o.outputs[0].token_ids) for o in out]
print("HF ", hf); print("GOT", got); print("EQUAL", got == hf)
