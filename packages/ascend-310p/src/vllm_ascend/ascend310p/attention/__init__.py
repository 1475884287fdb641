"""The Atlas 310P attention backend: masks, metadata, forward paths (prefill, decode, chunked prefill).

Nothing is imported here: ``mask`` is plain torch (the overlay's adaptors use it), while ``backend``,
``metadata`` and ``impl`` import vLLM and the runner.
"""
