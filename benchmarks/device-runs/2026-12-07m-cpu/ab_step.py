import sys, time, json
from vllm_ascend.testing.tiny_models import build_tiny_model, qwen3_spec
spec = qwen3_spec(hidden_size=128, intermediate_size=256, num_layers=2)
model_dir = str(build_tiny_model(spec))
from transformers import AutoTokenizer
from vllm import LLM, SamplingParams
tok = AutoTokenizer.from_pretrained(model_dir)
P = "river mountain forest ocean cloud rain snow wind stone light shadow morning evening winter summer"
prompts = [tok(f"{P} {i}")["input_ids"] for i in range(48)]
opts = {"compilation_config": {"mode": 2}} if sys.argv[1] == "ref" else {}
llm = LLM(model=model_dir, dtype="float32", max_model_len=512, kv_cache_memory_bytes=256 << 20, seed=0, **opts)
def run(ps, n):
    t = time.perf_counter()
    llm.generate([{"prompt_token_ids": p} for p in ps], SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True), use_tqdm=False)
    return time.perf_counter() - t
run(prompts, 4); run(prompts, 64); run(prompts[:1], 128)
one = min(run(prompts[:1], 1) for _ in range(5))
dec = min(run(prompts[:1], 128) for _ in range(12))
bat = min(run(prompts, 64) for _ in range(6))
print("RESULT", json.dumps({"decode_step_ms": (dec - one) / 127 * 1e3, "batch_tok_s": 48 * 64 / bat}))
