"""vllm_ascend.kvtransfer: prefill/decode disaggregation over the Mooncake transfer engine.

``import vllm_ascend.kvtransfer`` imports neither vLLM, Mooncake nor the web stack: vLLM reaches the
connectors through core's ``KV_CONNECTORS`` (handed to its ``KVConnectorFactory``), the proxy is
``vllm-ascend pd-proxy``.
"""

from vllm_ascend.kvtransfer._version import __version__

__all__ = ["__version__"]
