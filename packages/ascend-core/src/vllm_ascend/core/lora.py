"""The error a malformed LoRA adapter is refused with (raised by the runner's checks on the worker, answered
with HTTP 400 by the server: ``vllm_bridge.answer_invalid_lora_adapters_with_400``)."""

from __future__ import annotations

#: Every :class:`InvalidLoRAAdapterError` message starts so; the server finds it in the engine's error text.
INVALID_ADAPTER_PREFIX = "Invalid LoRA adapter: "


class InvalidLoRAAdapterError(ValueError):
    """A LoRA adapter whose files do not fit the served model; the message names the file and the field."""

    def __init__(self, detail: str) -> None:
        super().__init__(INVALID_ADAPTER_PREFIX + detail)
