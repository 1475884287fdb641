"""The Ascend post-grad graph passes: FX rewrites of ``torch.ops.vllm_ascend`` op sequences into the fused
device ops (one module per pass), and no-op view elimination."""
