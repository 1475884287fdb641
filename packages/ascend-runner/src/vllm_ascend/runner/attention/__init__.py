"""The Ascend attention backend (paged KV cache through the device adaptor)."""
