"""EPLB controller for the V2 model runner: phase-filtered load collection around each forward."""

from __future__ import annotations

from vllm_ascend.eplb.config import PHASES, EplbInit
from vllm_ascend.eplb.updator import EplbUpdator
from vllm_ascend.eplb.validation import EplbInputError


class AscendEPLBController:
    """Records expert loads only for batches of the configured phase (``load_collection_phase``:
    ``all``, ``prefill`` or ``decode``; a batch with any prefill token is a prefill batch)."""

    def __init__(self, updator: EplbUpdator, phase: str | None = None) -> None:
        self.updator = updator
        self.phase = updator.settings.load_collection_phase if phase is None else phase
        if self.phase not in PHASES:
            raise EplbInputError(f"load_collection_phase must be one of {PHASES}, got {self.phase!r}")
        self.batch_phase: str | None = None

    def set_batch_phase(self, num_prefill_tokens: int, num_decode_tokens: int) -> None:
        if num_prefill_tokens < 0 or num_decode_tokens < 0:
            raise EplbInputError("token counts must be >= 0")
        self.batch_phase = "prefill" if num_prefill_tokens else "decode"

    def is_eplb_load_collection_phase_matched(self) -> bool:
        return self.phase == "all" or self.batch_phase == self.phase

    def setup_from_mapping(self, init: EplbInit) -> None:
        """Install the initial expert maps and log2phy maps on every registered layer."""
        self.updator.adaptor.apply_placement(init.global_table)
        self.updator.table = init.global_table.copy()

    def prepare_load(self) -> None:
        """Start the forward with empty load counters."""
        self.updator.adaptor.clear_all_moe_loads()

    def prepare_forward(self, dummy_run: bool = False) -> None:
        self.prepare_load()
        self.updator.forward_before(dummy_run=dummy_run)

    def finish_forward(self, dummy_run: bool = False) -> None:
        self.updator.forward_end(
            dummy_run=dummy_run, record_load=self.is_eplb_load_collection_phase_matched()
        )
