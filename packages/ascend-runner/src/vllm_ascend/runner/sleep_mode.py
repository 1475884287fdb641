"""``AscendSleepModeBackend``: vLLM's sleep-mode backend on the device adaptor's tagged memory pool.

vLLM's worker sleeps and wakes through ``SleepModeBackendFactory`` (``model_config.sleep_mode_backend``); the
platform names this backend (``ascend``) whenever ``enable_sleep_mode`` is on. Level 1 keeps the weights'
contents on the host and releases everything; level 2 keeps nothing (reload or update the weights after
waking them). Regions come back at their addresses, so captured graphs stay valid and are kept.
"""

from __future__ import annotations

from vllm.device_allocator.sleep_mode_backend import SleepModeBackend

from vllm_ascend.core.sdk import SLEEP_MODE_BACKEND, get_device_adaptor, init_logger

logger = init_logger(__name__)


class AscendSleepModeBackend(SleepModeBackend):
    """Suspend / resume / discard on ``get_device_adaptor().memory_pool()``."""

    def suspend(self, level: int = 1) -> None:
        if level not in (1, 2):
            raise ValueError(f"sleep level={level} is invalid; allowed: 1, 2")
        pool = get_device_adaptor().memory_pool()
        offload = ("weights", "graph") if level == 1 else ("graph",)
        released = pool.sleep(offload_tags=offload)
        self._state = "SUSPENDED"
        logger.info("Sleep level %d released %.1f MiB of pool memory", level, released / 2**20)

    def resume(self, tags: list[str] | None = None) -> None:
        self._state = "RESUMING"
        pool = get_device_adaptor().memory_pool()
        if tags is not None and "kv_cache" in tags:
            tags = [*tags, "graph"]  # vLLM wakes weights and KV cache; graph pools serve with the KV cache
        pool.wake_up(tags)
        self._state = "SUSPENDED" if pool.is_asleep() else "RUNNING"

    def discard(self, tags: tuple[str, ...]) -> None:
        get_device_adaptor().memory_pool().discard(tags)
        self._state = "SUSPENDED"

    @classmethod
    def preserves_communicators(cls) -> bool:
        """Process groups live outside the pool: sleep leaves them as they are."""
        return True

    @classmethod
    def preserves_compiled_artifacts(cls) -> bool:
        """Compiled code and captured graphs survive: the memory they read keeps its addresses."""
        return True


def register_sleep_mode_backend() -> None:
    """Add the backend to vLLM's factory (once per process)."""
    from vllm.device_allocator.sleep_mode_backend import SleepModeBackendFactory

    if SLEEP_MODE_BACKEND not in SleepModeBackendFactory._registry:
        SleepModeBackendFactory.register_backend(
            SLEEP_MODE_BACKEND, __name__, AscendSleepModeBackend.__name__
        )
