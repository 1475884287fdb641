import os
os.environ.update(HF_HUB_OFFLINE="1", VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1", VLLM_ASCEND_DEVICE="reference", VLLM_ASCEND_REFERENCE_FAMILY="310p")
from pathlib import Path
from vllm_ascend.runner.testing.tiny_models import build_tiny_model, qwen3_spec
root = Path("/tmp/q310"); root.mkdir(exist_ok=True)
model = build_tiny_model(qwen3_spec(), root)
from vllm import LLM, SamplingParams
PROMPTS = [list(range(10, 30)), [5, 6, 7, 8] * 5, [40, 41, 42, 43, 44, 120, 7, 300, 12]]
p = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
llm = LLM(model=str(model), dtype="float16", block_size=16, max_model_len=256, kv_cache_memory_bytes=32<<20, seed=0)
plain = [list(o.outputs[0].token_ids) for o in llm.generate([{"prompt_token_ids": q} for q in PROMPTS], p, use_tqdm=False)]
llm.llm_engine.engine_core.shutdown(); del llm
spec = {"method": "draft_model", "model": str(model), "num_speculative_tokens": 3}
llm = LLM(model=str(model), dtype="float16", block_size=16, max_model_len=256, kv_cache_memory_bytes=32<<20, seed=0, speculative_config=spec, disable_log_stats=False, max_num_batched_tokens=16)
got = [list(o.outputs[0].token_ids) for o in llm.generate([{"prompt_token_ids": q} for q in PROMPTS], p, use_tqdm=False)]
metrics = {m.name: m.value for m in llm.get_metrics() if hasattr(m, "value")}
print("EQUAL", got == plain, metrics.get("vllm:spec_decode_num_draft_tokens"), metrics.get("vllm:spec_decode_num_accepted_tokens"))
