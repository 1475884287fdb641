"""NPUModelRunner: vLLM's V1 GPU model runner on the NPU or the reference device.

The inherited runner builds its collaborators by name; while it does, the names are bound to
the Ascend classes (input batch + block tables, sampler, rejection sampler, KV block zeroer) and ``torch.cuda``
streams/events are mapped onto the target device. No device-type branches live here.

Speculative decoding drafts with the proposer core's ``SPEC_DECODE_METHODS`` registry holds for
``speculative_config.method`` (a sibling distribution registers it; the platform refuses methods
nobody registered). Such a proposer has ``from_vllm_config(vllm_config)`` and vLLM's CPU-drafter
call ``propose(num_speculative_tokens, sampled_token_ids, num_tokens_no_spec, token_ids_cpu,
slot_mappings=...) -> list[list[int]]``; a proposer whose ``tracks_requests`` is true (suffix decoding keeps
per-request state) also gets the rows' ``req_ids`` and ``num_prompt_tokens``, from which it starts,
extends and stops its requests.

A row whose sampled token is thrown away (a prefill chunk that is not the prompt's last) samples
without its request's ``torch.Generator``, so a seeded request's generator advances only on steps
whose token is kept: its tokens are the same whether or not the prompt was chunked, and vLLM's
Philox-offset rewind (which CPU and other non-Philox generators do not have) never runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import Any

import numpy as np
import torch
from vllm.config import CUDAGraphMode, VllmConfig
from vllm.distributed.parallel_state import get_pp_group
from vllm.sequence import IntermediateTensors
from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm.v1.core.sched.output import GrammarOutput, SchedulerOutput
from vllm.v1.kv_cache_interface import KVCacheConfig
from vllm.v1.outputs import AsyncModelRunnerOutput, ModelRunnerOutput
from vllm.v1.sample.metadata import SamplingMetadata
from vllm.v1.spec_decode.metadata import SpecDecodeMetadata
from vllm.v1.worker import gpu_model_runner
from vllm.v1.worker.gpu_model_runner import GPUModelRunner

from vllm_ascend.core.device.config import get_device_adaptor
from vllm_ascend.core.registry import SPEC_DECODE_METHODS
from vllm_ascend.kernels import kernel_warmup
from vllm_ascend.runner import device_context
from vllm_ascend.runner.input_batch import NPUInputBatch
from vllm_ascend.runner.kv_zeroer import AscendKVBlockZeroer
from vllm_ascend.runner.patching import replaced_names
from vllm_ascend.runner.sample.rejection_sampler import AscendRejectionSampler
from vllm_ascend.runner.sample.sampler import AscendSampler

#: The vLLM names rebound while inherited code constructs collaborators.
ASCEND_COMPONENTS = {
    "InputBatch": NPUInputBatch,
    "Sampler": AscendSampler,
    "RejectionSampler": AscendRejectionSampler,
    "KVBlockZeroer": AscendKVBlockZeroer,
}


@contextmanager
def ascend_components() -> Iterator[None]:
    """Inherited runner code builds the Ascend components and uses the target's streams/events."""
    with device_context.torch_device_wrapper(), replaced_names(gpu_model_runner, ASCEND_COMPONENTS):
        yield


def build_drafter(vllm_config: VllmConfig) -> Any:
    """The proposer registered for ``speculative_config.method`` (None without speculative decoding)."""
    spec = vllm_config.speculative_config
    if spec is None:
        return None
    proposer_cls: Any = SPEC_DECODE_METHODS.get(spec.method)
    return proposer_cls.from_vllm_config(vllm_config)


@contextmanager
def vllm_takes_our_drafter(vllm_config: VllmConfig, drafter: Any) -> Iterator[None]:
    """For ``ngram`` vLLM's runner constructs its numba ``NgramProposer`` (JIT-compiled on creation), for
    ``suffix`` its arctic-inference ``SuffixDecodingProposer``: hand it ``drafter`` instead, so only our
    proposer is built."""
    spec = vllm_config.speculative_config
    with ExitStack() as stack:
        if spec is not None and spec.method == "ngram":
            from vllm.v1.spec_decode import ngram_proposer

            stack.enter_context(replaced_names(ngram_proposer, {"NgramProposer": lambda config: drafter}))
        if spec is not None and spec.method == "suffix":
            stack.enter_context(
                replaced_names(gpu_model_runner, {"SuffixDecodingProposer": lambda config: drafter})
            )
        yield


@contextmanager
def generators_held_back(generators: dict[int, torch.Generator], rows: Iterable[int]) -> Iterator[None]:
    """Take ``rows``' generators out of the batch's ``generators`` while the block runs, then put them back
    untouched: those rows sample from the global RNG and their generators neither advance nor rewind."""
    held = {row: generators.pop(row) for row in rows if row in generators}
    try:
        yield
    finally:
        generators.update(held)


class NPUModelRunner(GPUModelRunner):
    """The V1 model runner for Ascend (no graph capture: the platform turns CUDA-graph modes off)."""

    def __init__(self, vllm_config: VllmConfig, device: torch.device) -> None:
        get_device_adaptor().install_runtime_shims()
        drafter = build_drafter(vllm_config)
        with ascend_components(), vllm_takes_our_drafter(vllm_config, drafter):
            super().__init__(vllm_config, device)
        if hasattr(self, "drafter"):  # vLLM builds a drafter on the last pipeline stage only
            self.drafter = drafter
        self.kernel_warmup_results: dict[str, bool] = {}  # item -> compiled cleanly, after warm_up()

    def may_reinitialize_input_batch(self, kv_cache_config: KVCacheConfig) -> None:
        with ascend_components():
            super().may_reinitialize_input_batch(kv_cache_config)

    def _init_kv_zero_meta(self) -> None:
        with ascend_components():
            super()._init_kv_zero_meta()

    def initialize_kv_cache(
        self,
        kv_cache_config: KVCacheConfig,
        is_profiling: bool = False,
        kv_cache_allocation_context: AbstractContextManager | None = None,
    ) -> None:
        with ascend_components():
            super().initialize_kv_cache(
                kv_cache_config, is_profiling, kv_cache_allocation_context=kv_cache_allocation_context
            )

    def propose_draft_token_ids(
        self,
        scheduler_output: SchedulerOutput,
        sampled_token_ids: torch.Tensor | list[list[int]],
        sampling_metadata: SamplingMetadata,
        hidden_states: torch.Tensor,
        sample_hidden_states: torch.Tensor,
        aux_hidden_states: list[torch.Tensor] | None,
        spec_decode_metadata: SpecDecodeMetadata | None,
        common_attn_metadata: CommonAttentionMetadata,
        slot_mappings: dict[str, torch.Tensor] | list[dict[str, torch.Tensor]] | None,
    ) -> list[list[int]]:
        """Drafts from the registry's proposer, called as vLLM calls its CPU n-gram drafter."""
        self._draft_probs = None
        self._draft_prob_req_ids = None
        batch = self.input_batch
        requests: dict[str, Any] = {}
        if getattr(self.drafter, "tracks_requests", False):
            requests = {"req_ids": batch.req_ids, "num_prompt_tokens": batch.num_prompt_tokens}
        return self.drafter.propose(
            scheduler_output.num_spec_tokens_to_schedule,
            sampled_token_ids,
            batch.num_tokens_no_spec,
            batch.token_ids_cpu,
            slot_mappings=slot_mappings,
            **requests,
        )

    def sample_tokens(
        self, grammar_output: GrammarOutput | None
    ) -> ModelRunnerOutput | AsyncModelRunnerOutput | IntermediateTensors:
        """vLLM's sampling step, with the discarded rows' generators held back (see the module docstring)."""
        rows: list[int] = []
        if self.execute_model_state is not None:
            rows = np.flatnonzero(self.discard_request_mask.np[: self.input_batch.num_reqs]).tolist()
        with generators_held_back(self.input_batch.generators, rows):
            return super().sample_tokens(grammar_output)

    def _sync_device(self) -> None:
        get_device_adaptor().synchronize()

    def warm_up(self) -> None:
        """One dummy forward at the largest batch of requests on every rank; on the last pipeline stage
        (the only one that samples) first compile every sampling-kernel variant a step can hit
        (``kernel_warmup``: failures are logged, not raised) and then run the sampler once (fills lazy
        state). Earlier stages produce intermediate tensors, not hidden states to sample from."""
        is_last_stage = get_pp_group().is_last_rank
        if is_last_stage:
            self.kernel_warmup_results = kernel_warmup(
                self.device,
                self.model_config.get_vocab_size(),
                (torch.float32,),  # the sampler works on float32 logits
                exclude=() if self.speculative_config is not None else ("rejection",),
            )
        num_reqs = min(self.scheduler_config.max_num_seqs, self.scheduler_config.max_num_batched_tokens)
        _, last_hidden_states = self._dummy_run(
            num_tokens=num_reqs, skip_eplb=True, cudagraph_runtime_mode=CUDAGraphMode.NONE
        )
        if is_last_stage:
            self._dummy_sampler_run(hidden_states=last_hidden_states)
