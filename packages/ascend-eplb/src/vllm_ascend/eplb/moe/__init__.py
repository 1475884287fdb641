"""Reference-device MoE layer: an Ascend ``MoERunner`` for vLLM 0.32 with EPLB expert maps.

vLLM is imported lazily inside this subpackage so ``import vllm_ascend.eplb``
keeps working without vLLM.
"""
