"""Custom ops registered with vLLM's ``CustomOp.register_oot`` / ``PluggableLayer.register_oot``."""
