"""The Ascend MLA attention backend: a paged latent KV cache, decompressed prefill, absorbed decode."""

#: KV cache dtypes the latent cache takes: the model dtype (no quantized latent cache yet).
MLA_KV_CACHE_DTYPES = ("auto",)
