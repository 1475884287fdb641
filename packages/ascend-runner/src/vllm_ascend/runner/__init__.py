"""vLLM Ascend runner: NPU worker, model runner, attention backend, custom ops and sampler."""
