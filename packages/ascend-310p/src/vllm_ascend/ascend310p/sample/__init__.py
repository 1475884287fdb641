"""Sampling for Atlas 310P: the runner's sampler and rejection sampler with every random draw made
on the host (310P has no usable device random path) and no Triton kernel (none runs on 310P).

``sampler.AscendSampler310`` and ``rejection_sampler.AscendRejectionSampler310`` are what the 310P
model runner builds; importing this package imports neither (both pull in vLLM).
"""
