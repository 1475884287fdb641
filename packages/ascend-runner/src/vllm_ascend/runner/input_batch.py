"""NPUInputBatch: vLLM's persistent input batch holding the Ascend block tables and the penalty counts
kept across steps (:mod:`.sample.penalty_counts`)."""

from __future__ import annotations

import dataclasses
from typing import Any

from vllm.v1.sample.metadata import SamplingMetadata
from vllm.v1.worker import gpu_input_batch
from vllm.v1.worker.gpu_input_batch import InputBatch

from vllm_ascend.runner.block_table import MultiGroupBlockTable
from vllm_ascend.runner.patching import replaced_names
from vllm_ascend.runner.sample.penalty_counts import KeptCountsMetadata, PenaltyCounts


class NPUInputBatch(InputBatch):
    """The V1 input batch, built with :class:`~vllm_ascend.runner.block_table.MultiGroupBlockTable`; a
    sampling batch also keeps its requests' penalty counts, which follow its batch changes and reach the
    sampler in its metadata (:class:`KeptCountsMetadata`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.penalty_counts: PenaltyCounts | None = None
        with replaced_names(gpu_input_batch, {"MultiGroupBlockTable": MultiGroupBlockTable}):
            super().__init__(*args, **kwargs)
        if not self.is_pooling_model:
            self.penalty_counts = PenaltyCounts(
                self.max_num_reqs, self.vocab_size, self.max_model_len, self.device
            )
            self.sampling_metadata = self._make_sampling_metadata()

    def refresh_metadata(self) -> None:
        if self.penalty_counts is not None:
            changes = self.batch_update_builder  # read before vLLM's refresh hands them on and resets them
            self.penalty_counts.update(changes.removed, changes.added, changes.moved)
        super().refresh_metadata()

    def _make_sampling_metadata(self) -> SamplingMetadata:
        metadata = super()._make_sampling_metadata()
        fields = {f.name: getattr(metadata, f.name) for f in dataclasses.fields(metadata)}
        return KeptCountsMetadata(**fields, penalty_counts=self.penalty_counts)
